"""reasoning_gym_task with exact values: option errors word for word, the split of every entry,
sampling, grading reasons, demonstrations (mutation testing found these unchecked)."""

from __future__ import annotations

import pytest
import reasoning_gym  # noqa: E402

from temper.catalog import make_task  # noqa: E402
from temper.tasks.base import Score, TaskOptionError, split_of  # noqa: E402
from temper.tasks.reasoning_gym_task import INSTRUCTION, ReasoningGym, ReasoningGymConfig  # noqa: E402

pytest.importorskip("reasoning_gym")


def legs(**options):
    return make_task("reasoning_gym", dataset="leg_counting", size=40, seed=1, **options)


@pytest.mark.parametrize(
    ("options", "path", "message"),
    [
        ({"test_fraction": 0.0}, ("test_fraction",), "test_fraction must be in (0, 1)"),
        ({"test_fraction": 1.0}, ("test_fraction",), "test_fraction must be in (0, 1)"),
        ({"size": 0}, ("size",), "size must be >= 1"),
    ],
)
def test_config_errors_name_their_option(options, path, message):
    with pytest.raises(TaskOptionError) as err:
        ReasoningGymConfig(dataset="leg_counting", **options)
    assert err.value.option == path and str(err.value) == message
    ReasoningGymConfig(dataset="leg_counting", size=1, test_fraction=0.5)  # the edges that are fine


def test_unknown_dataset_and_bad_config_are_refused_in_words():
    from reasoning_gym.factory import DATASETS

    with pytest.raises(TaskOptionError) as err:
        ReasoningGym(ReasoningGymConfig(dataset="leg_countin"))
    first = ", ".join(sorted(DATASETS)[:8])
    assert err.value.option == ("dataset",)
    assert str(err.value) == (
        f"unknown reasoning-gym data set 'leg_countin' (did you mean 'leg_counting'?); "
        f"{len(DATASETS)} exist, e.g. {first}"
    )
    with pytest.raises(TaskOptionError) as err:
        ReasoningGym(ReasoningGymConfig(dataset="zzzzqq"))
    assert str(err.value).startswith("unknown reasoning-gym data set 'zzzzqq'; ")
    with pytest.raises(TaskOptionError) as err:
        legs(config={"max_animals": -3})
    assert err.value.option == ("config",)
    assert str(err.value) == "reasoning-gym 'leg_counting': max_animals must be >= min_animals"


def test_every_entry_lands_in_the_split_of_its_question_with_the_instruction():
    task = legs()
    ds = reasoning_gym.create_dataset("leg_counting", size=40, seed=1)
    assert isinstance(task, ReasoningGym) and task.name == "reasoning_gym"
    seen = {}
    for split in ("train", "test"):
        for p in task._splits[split]:
            i = int(p.id.split("/")[1])
            assert p.id == f"leg_counting/{i}" and p.task == "reasoning_gym" and p.split == split
            assert split == split_of(f"leg_counting/{ds[i]['question']}", 0.2)
            assert (
                p.prompt == ds[i]["question"] + INSTRUCTION and p.data["entry"]["answer"] == ds[i]["answer"]
            )
            seen[i] = split
    assert sorted(seen) == list(range(40)) and task._splits["ood"] == []
    assert 0 < sum(s == "test" for s in seen.values()) < 40
    plain = legs(instruction=False)
    assert [p.prompt for p in plain._splits["test"]] == [
        p.prompt[: -len(INSTRUCTION)] for p in task._splits["test"]
    ]
    assert INSTRUCTION == "\nEnd your response with a line 'Answer: <your answer>'."


def test_sampling_draws_without_repeats_for_test_and_cycles_train():
    task = legs()
    n_test = len(task._splits["test"])
    test = task.sample("test", 1000, seed=3)
    assert len(test) == n_test and len({p.id for p in test}) == n_test
    assert task.sample("test", 2, seed=3) == task.sample("test", 2, seed=3)
    train = task.sample("train", 100, seed=3)
    assert len(train) == 100 and {p.split for p in train} == {"train"}
    with pytest.raises(ValueError) as err:
        task.sample("ood", 1, seed=0)
    assert str(err.value) == "task 'reasoning_gym' has no ood problems (reasoning-gym gives train and test)"
    named = ReasoningGym.build(
        ReasoningGymConfig(dataset="leg_counting", size=10), name="legs", base_dir=None
    )
    assert named.name == "legs" and all(p.task == "legs" for p in named._splits["train"])


def test_grading_reads_the_answer_line_or_the_tags_and_says_why():
    task = legs()
    p = task._splits["test"][0]
    answer = p.data["entry"]["answer"]
    assert task.score(p, "I count.") == Score(0.0, False, False, {"reason": "no_answer", "answer": None})
    assert task.score(p, f"so\nAnswer: {answer}") == Score(
        1.0, True, True, {"reason": "correct", "answer": answer}
    )
    assert task.score(p, f"<answer> {answer} </answer> Answer: 1") == Score(
        1.0, True, True, {"reason": "correct", "answer": answer}
    )  # tags win over the line
    assert task.score(p, "<answer>1</answer><answer>2</answer>").details["answer"] == "2"  # the last tag
    assert task.score(p, "<answer> </answer>") == Score(
        0.0, False, False, {"reason": "no_answer", "answer": None}
    )
    wrong = task.score(p, "Answer: 100000")
    assert wrong == Score(0.0, False, True, {"reason": "wrong", "answer": "100000"})
    assert task.demonstration(p) == f"Answer: {answer}"
    assert task.corpus_text(p) == f"{p.data['entry']['question']}\n{answer}"


def test_without_the_package_the_task_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    with pytest.raises(TaskOptionError) as err:
        ReasoningGym(ReasoningGymConfig(dataset="leg_counting"))
    assert err.value.option == ("task",)
    assert (
        str(err.value)
        == "task reasoning_gym needs the reasoning-gym package: pip install 'temper[reasoning_gym]'"
    )
