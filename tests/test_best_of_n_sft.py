"""Best-of-N as an SFT data generator: the sft stage's `data.best_of_n` samples the starting model
n times per train prompt and keeps the top-ranked answer (by the verifier, only a correct one),
reporting the yield; the rows are ordinary TRL rows in the stage folder."""

import json

import pytest

from temper.cli import main
from temper.data.chat import prompt_ids
from temper.data.formats import load_rows
from temper.recipe import RecipeError, parse_recipe
from temper.rollout.sampler import Sample
from temper.stages.ranking import generate_best_of_n
from temper.tasks.base import Problem, Score

# problem i: its 4 samples as (text, stop reason), in draw order; "ok" is right
SAMPLED = [
    [("no", "eos"), ("ok one", "eos"), ("ok two", "eos"), ("no", "eos")],  # first correct: sample 1
    [("no", "eos"), ("nope", "eos"), ("no", "eos"), ("nah", "eos")],  # all wrong
    [("ok cut", "length"), ("no", "eos"), ("", "eos"), ("no", "eos")],  # the correct one was cut
    [("", "eos"), ("ok cut", "length"), ("  ", "eos"), ("no cut", "length")],  # nothing usable
    [("ok", "eos"), ("ok!", "eos"), ("no", "eos"), ("ok?", "eos")],
]


class OkTask:
    name = "oks"

    def sample(self, split, n, seed):
        return [Problem("oks", split, f"{split}-{i}", f"question {i}", {"i": i}) for i in range(n)]

    def score(self, problem, completion):
        ok = completion.startswith("ok")
        return Score(float(ok), ok, True, {"reason": "right" if ok else "wrong"})


class Scripted:
    def __init__(self, tokenizer, problems):
        self.by_prompt = {tuple(prompt_ids(tokenizer, p.messages())): s for p, s in zip(problems, SAMPLED)}

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, seed=0, **kw):
        return [
            [
                Sample(list(p), [ord(c) for c in t], [-1.0] * len(t), t, stop)
                for t, stop in self.by_prompt[tuple(p)][:n]
            ]
            for p in prompts
        ]


def _generate(tokenizer, **kw):
    task = OkTask()
    sampler = Scripted(tokenizer, task.sample("train", len(SAMPLED), 0))
    args = dict(n=4, ranker=None, temperature=1.0, max_new_tokens=8, seed=0) | kw
    return generate_best_of_n(sampler, tokenizer, task, "train", len(SAMPLED), **args)


def _answers(rows):
    return [r["messages"][-1]["content"] for r in rows]


def test_verifier_keeps_the_first_usable_correct_answer_and_counts_the_rest(tokenizer):
    rows, counts = _generate(tokenizer)
    assert _answers(rows) == ["ok one", "ok"]
    assert rows[0]["messages"][:-1] == OkTask().sample("train", 1, 0)[0].messages()
    assert rows[0]["messages"][-1]["role"] == "assistant"
    assert counts["rows"] == 2 and counts["prompts"] == 5 and counts["yield"] == pytest.approx(2 / 5)
    assert counts["no_row"] == {"all_wrong": 1, "no_usable_correct": 1, "all_empty_or_cut": 1}
    assert counts["sample_accuracy"] == pytest.approx(7 / 20) and counts["kept_correct"] == 1.0
    kept, counts = _generate(tokenizer, keep_truncated=True)  # a cut answer is then usable
    assert _answers(kept) == ["ok one", "ok cut", "ok cut", "ok"]
    assert counts["no_row"] == {"all_wrong": 1}


def test_a_reward_model_keeps_its_top_usable_answer_right_or_wrong(tokenizer):
    calls = []

    def longest(prompts, completions):  # a "reward model": longer is better
        calls.append(len(completions))
        return [float(len(c)) for c in completions]

    rows, counts = _generate(tokenizer, ranker=longest)
    assert calls == [20]  # every sample of every prompt scored in one call
    # ties go to the earlier sample: "ok one" and "ok two" tie at 6 characters
    assert _answers(rows) == ["ok one", "nope", "no", "ok!"]
    assert counts["no_row"] == {"all_empty_or_cut": 1}
    assert counts["kept_correct"] == pytest.approx(2 / 4)


RECIPE = """\
name: t
model: {preset: nano}
tasks:
  arithmetic: {max_digits: 1}
  treasure_hunt: {}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 10}
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}
  - kind: sft
    data:
      best_of_n: BON
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}
"""


def test_the_sft_source_parses_and_names_its_tasks():
    stage = parse_recipe(RECIPE.replace("BON", "{tasks: [arithmetic], n: 8, prompts_per_task: 16}")).stages[1]
    bon = stage.data.best_of_n
    assert (bon.tasks, bon.n, bon.prompts_per_task, bon.rank, bon.temperature) == (
        ["arithmetic"],
        8,
        16,
        "verifier",
        1.0,
    )


@pytest.mark.parametrize(
    ("bon", "error"),
    [
        ("{tasks: [arithmetic], n: 0}", "r.yaml:12: stages[1].data.best_of_n.n: Input should be greater than or equal to 1"),
        ("{tasks: [arithmetc]}", "r.yaml:12: stages[1].data.best_of_n.tasks[0]: stage 'sft' uses task 'arithmetc'"),
        ("{tasks: [treasure_hunt]}", "r.yaml:12: stages[1].data.best_of_n.tasks[0]: 'treasure_hunt' is an environment task"),
        ("{tasks: [arithmetic], rank: reward_model}", "stages[1].data.best_of_n.reward_model: rank: reward_model needs a reward model"),
        ("{tasks: [arithmetic], rank: reward_model, reward_model: pretrain}", "stages[1].data.best_of_n.reward_model: stage 'pretrain' is a pretrain stage"),
        ("{tasks: [arithmetic], temperature: 0}", "stages[1].data.best_of_n.temperature: Input should be greater than 0"),
        ("{n: 4}", "stages[1].data.best_of_n.tasks: Field required"),
    ],
)  # fmt: skip
def test_bad_values_are_located_errors(bon, error, tmp_path):
    with pytest.raises(RecipeError) as err:
        parse_recipe(RECIPE.replace("BON", bon), "r.yaml", tmp_path)
    assert error in str(err.value)


MICRO = """\
name: bon-sft
model: {preset: tiny, seed: 0}
tasks:
  even:
    task: dataset
    data: rows.jsonl
    prompt: question
    rewards: [my_rewards:even]
    test_fraction: 0.5
stages:
  - kind: pretrain
    corpus: {tasks: [even], problems_per_task: 20}
    max_len: 32
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0, progress: false}
  - kind: sft
    data:
      best_of_n: {tasks: [even], n: 4, prompts_per_task: 8, max_new_tokens: 6, keep_truncated: true}
      eval_problems: 0
    max_len: 64
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0, progress: false}
"""


def test_micro_sft_on_best_of_n_rows(tmp_path, capsys):
    folder = tmp_path / "proj"
    folder.mkdir()
    rows = [{"question": f"say something about {i}", "answer": "x"} for i in range(40)]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "my_rewards.py").write_text(
        "def even(completions, **kw):\n    return [float(len(c) % 2 == 0) for c in completions]\n"
    )
    (folder / "r.yaml").write_text(MICRO)
    run = tmp_path / "run"
    assert main(["run", str(folder / "r.yaml"), "--output-dir", str(run)]) == 0
    summary = json.loads((run / "02-sft" / "sft.json").read_text())
    c = summary["best_of_n"]["even"]
    assert c["prompts"] == 8 and 0 < c["rows"] <= 8 and c["yield"] == c["rows"] / 8
    assert c["kept_correct"] == 1.0  # the verifier keeps only correct answers
    examples, report = load_rows(run / "02-sft" / "best_of_n.jsonl")  # ordinary TRL rows
    assert len(examples) == c["rows"] and not report.skipped
    assert all(len(e.messages[-1]["content"]) % 2 == 0 for e in examples)  # each one verified
    assert summary["data"]["examples"] == c["rows"]
    assert f"best-of-4 (verifier) on even: {c['rows']} rows from 8 prompts" in capsys.readouterr().err
    html = (run / "report.html").read_text()
    assert "best-of-N rows (sampled from the starting model, top-ranked kept)" in html
    assert f"<td>even</td><td>8</td><td>4</td><td>{c['rows']}</td><td>{round(100 * c['yield'])}%</td>" in html
