"""corpus.mix: named sources at token shares (temper.data.mix), through the recipe and the stage;
the synthetic languages and the translated task that give continued pre-training a new language."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from temper.catalog import make_task
from temper.data.formats import Example
from temper.data.mix import mix_examples
from temper.recipe import RecipeError, parse_recipe
from temper.tasks.language import SOURCE, Language


def _rows(name: str, n: int, length: int) -> list[Example]:
    return [Example(source=name, line=i + 1, text="x" * length) for i in range(n)]


def _tokens(ex: Example) -> int:
    return len(ex.text)


def test_each_source_gives_its_share_of_the_tokens_interleaved_evenly():
    sources = {"new": _rows("new", 500, 7), "old": _rows("old", 500, 13), "none": _rows("none", 5, 3)}
    examples, stats = mix_examples(sources, {"new": 0.8, "old": 0.2, "none": 0.0}, 10_000, _tokens, seed=0)
    assert stats["none"]["tokens"] == 0 and not any(e.source == "none" for e in examples)
    for name, share in (("new", 0.8), ("old", 0.2)):
        s = stats[name]
        assert s["target_tokens"] == share * 10_000 and 0 <= s["tokens"] - s["target_tokens"] < 13
        assert abs(s["realised_share"] - share) < 0.002
    # evenly: every tenth of the corpus holds the sources at about their shares (not old last)
    tenth = len(examples) // 10
    for k in range(10):
        part = examples[k * tenth : (k + 1) * tenth]
        new = sum(_tokens(e) for e in part if e.source == "new") / sum(_tokens(e) for e in part)
        assert 0.75 < new < 0.85, (k, new)
    again, _ = mix_examples(sources, {"new": 0.8, "old": 0.2, "none": 0.0}, 10_000, _tokens, seed=0)
    other, _ = mix_examples(sources, {"new": 0.8, "old": 0.2, "none": 0.0}, 10_000, _tokens, seed=1)
    assert again == examples and [e.line for e in other] != [e.line for e in examples]


def test_a_short_source_is_read_again_and_the_shares_must_sum_to_one():
    sources = {"a": _rows("a", 10, 10), "b": _rows("b", 1000, 10)}
    examples, stats = mix_examples(sources, {"a": 0.5, "b": 0.5}, 1000, _tokens, seed=0)
    assert stats["a"] == {"share": 0.5, "target_tokens": 500, "tokens": 500, "examples": 50, "passes": 5,
                          "realised_share": 0.5}  # fmt: skip
    assert sorted(e.line for e in examples if e.source == "a") == sorted(list(range(1, 11)) * 5)
    with pytest.raises(ValueError, match="must sum to 1, got 0.9"):
        mix_examples(sources, {"a": 0.5, "b": 0.4}, 1000, _tokens, seed=0)
    with pytest.raises(ValueError, match="'a' has no text"):
        mix_examples({"a": [], "b": sources["b"]}, {"a": 0.5, "b": 0.5}, 1000, _tokens, seed=0)


RECIPE = """\
name: mix
model: {preset: nano}
tasks:
  arithmetic: {max_digits: 2}
  arithmetic_cy: {task: translated, base: arithmetic, options: {max_digits: 2}, script: cyrillic}
stages:
  - kind: pretrain
    corpus:
      mix:
        new: {tasks: [arithmetic_cy], share: 0.75}
        old: {tasks: [arithmetic], share: 0.25}
      tokens: 20000
      problems_per_task: 200
    max_len: 64
    train: {max_steps: 2, batch_size: 2, progress: false}
"""


@pytest.mark.parametrize(
    "old, new, says",
    [
        ("share: 0.25}", "share: 0.35}", "stages[0].corpus.mix: the shares must sum to 1, got 1.1"),
        ("      tokens: 20000\n", "", "stages[0].corpus.tokens: a mix needs tokens"),
        (
            "      mix:\n",
            "      tasks: [arithmetic]\n      mix:\n",
            "stages[0].corpus.mix: with a mix, name the tasks",
        ),
        ("tasks: [arithmetic], share", "share", "stages[0].corpus.mix.old: an empty source"),
        (
            "tasks: [arithmetic], share",
            "tasks: [arithmetc], share",
            "r.yaml:11: stages[0].corpus.mix.old.tasks[0]: stage 'pretrain' uses task 'arithmetc', which is not",
        ),
    ],
)
def test_a_bad_mix_is_a_recipe_error_at_its_key(old, new, says):
    assert old in RECIPE
    with pytest.raises(RecipeError) as err:
        parse_recipe(RECIPE.replace(old, new), "r.yaml")
    assert says in str(err.value), str(err.value)


def test_a_mixed_pretrain_stage_records_what_each_source_gave(tmp_path):
    from temper.runner import run_recipe

    out = run_recipe(parse_recipe(RECIPE, "mix.yaml"), tmp_path, tmp_path / "run", RECIPE)
    summary = json.loads(next(Path(out).glob("*-pretrain/pretrain.json")).read_text())
    mix = summary["mix"]
    assert set(mix) == {"new", "old"} and summary["settings"]["corpus"]["tokens"] == 20000
    assert abs(mix["new"]["realised_share"] - 0.75) < 0.01 and abs(mix["old"]["realised_share"] - 0.25) < 0.01
    assert mix["new"]["passes"] == -(-mix["new"]["examples"] // 200) > 1  # 200 problems, read again
    assert summary["data"]["tokens"] == mix["new"]["tokens"] + mix["old"]["tokens"]
    report = (Path(out) / "report.html").read_text()
    assert "<caption>corpus mix (highlighted: a source read more than once)</caption>" in report
    for name, share in (("new", "75%"), ("old", "25%")):
        m = mix[name]
        row = f"<td>{name}</td><td>{share}</td><td>{100 * m['realised_share']:.1f}%</td><td>{m['tokens']:,}</td>"
        assert ("<tr class='warn'>" if m["passes"] > 1 else "<tr>") + row in report


def test_a_language_is_a_bijection_into_its_script_with_the_words_reversed():
    cy = Language("cyrillic", seed=0)
    text = "Cards: 8 A 5 Q. Make 24  with (+ - * /).\n12+7=19\nAnswer: 19"
    said = cy.translate(text)
    assert cy.back(said) == text and not set(said) & set(SOURCE)
    assert (
        said.split("\n")[2] == cy.translate("Answer: 19") == f"{cy.translate('19')} {cy.translate('Answer:')}"
    )
    assert cy.translate("Answer:") == "".join(cy.forward[c] for c in "Answer") + ":"  # ':' passes through
    assert len(set(cy.forward.values())) == len(SOURCE)  # one letter per source character
    assert Language("cyrillic", seed=1).forward != cy.forward and Language("cyrillic", 0) == cy
    assert cy.share_of(said) == 1.0 and cy.share_of(text) == 0.0 and cy.share_of("..") == 0.0
    assert cy.share_of(cy.translate("ab") + "cd") == 0.5
    with pytest.raises(ValueError, match="already holds"):
        cy.translate("Ж")
    with pytest.raises(ValueError, match="unknown script"):
        Language("klingon")


@pytest.mark.parametrize("script", ["cyrillic", "greek", "georgian"])
def test_lower_casing_never_makes_two_characters_of_a_language_alike(script):
    """The contamination screen lower-cases: a map that sent 1 to 'И' and 2 to 'и' made 205 of
    4,000 train prompts 'equal' to test prompts."""
    f = Language(script, seed=2).forward
    for a in SOURCE:
        for b in SOURCE:
            if a.lower() != b.lower():
                assert f[a].lower() != f[b].lower(), (a, b)
            elif script != "georgian":  # a cased script keeps the source's pairs: lower() commutes
                assert f[a].lower() == f[b].lower(), (a, b)


def test_the_translated_task_poses_and_grades_the_same_problems_in_the_language():
    base = make_task("arithmetic", max_digits=2)
    task = make_task("translated", base="arithmetic", options={"max_digits": 2}, script="georgian", seed=3)
    cy = task.language
    for p, q in zip(base.sample("test", 20, 5), task.sample("test", 20, 5), strict=True):
        assert (q.id, q.data, q.task) == (p.id, p.data, "translated") and q.prompt == cy.translate(p.prompt)
        demo = task.demonstration(q)
        assert demo == cy.translate(base.demonstration(p)) and task.corpus_text(q) == cy.translate(
            base.corpus_text(p)
        )
        good = task.score(q, demo)
        assert good.correct and good.details["language_share"] == 1.0
        # the right answer in the source language is not an answer in this one
        assert not task.score(q, base.demonstration(p)).correct
        wrong = cy.translate(base.demonstration(p).replace("Answer: ", "Answer: 1"))
        assert not task.score(q, wrong).correct
    with pytest.raises(ValueError, match="cannot wrap another translated"):
        make_task("translated", base="translated")


def test_identify_names_the_script_most_of_a_text_is_written_in():
    from temper.tasks.language import identify

    langs = {n: Language(n, 0, reverse_words=False) for n in ("cyrillic", "greek", "georgian")}
    assert identify(langs["greek"].translate("12+7=19"), langs) == "greek"
    assert identify(langs["georgian"].translate("12+7=19") + "ab", langs) == "georgian"
    assert identify("12+7=19", langs) == "source" and identify("+= ,", langs) == "none"
    # any letter of the block counts, mapped or not (a model's free text)
    assert identify("ЖЖЖ ab", langs) == "cyrillic"
    assert Language("greek", reverse_words=False).translate("a b") == Language("greek").translate("b a")


def test_the_thinking_language_task_asks_for_a_language_and_reads_which_one_the_trace_used():
    task = make_task(
        "thinking_language", base="arithmetic", options={"max_digits": 2},
        sft_languages=["cyrillic", "greek"], ood_languages=["georgian"],
    )  # fmt: skip
    base = make_task("arithmetic", max_digits=2)
    asked = {
        sp: [p.data["reasoning_language"] for p in task.sample(sp, 60, 1)] for sp in ("train", "test", "ood")
    }
    assert set(asked["train"]) == set(asked["test"]) == {"cyrillic", "greek"} and set(asked["ood"]) == {
        "georgian"
    }
    ood, test = task.sample("ood", 5, 1), base.sample("test", 5, 1)
    assert [p.id for p in ood] == [p.id for p in test] and {p.split for p in ood} == {"ood"}
    p = ood[0]
    assert p.messages() == [
        {"role": "system", "content": "reasoning language: georgian"},
        *test[0].messages(),
    ]
    demo = task.demonstration(p)
    trace, answer = demo.split("\n")
    assert answer == base.demonstration(test[0]).split("\n")[-1] and trace == task.language(
        "georgian"
    ).translate(base.demonstration(test[0]).split("\n")[0])
    good = task.score(p, demo)
    assert good.correct and good.details["trace_language"] == "georgian" and good.details["trace_in_asked"]
    # the right answer with the trace in a language it was not asked for: correct, not in the asked one
    other = task.language("greek").translate(base.demonstration(test[0]).split("\n")[0]) + "\n" + answer
    s = task.score(p, other)
    assert s.correct and s.details["trace_language"] == "greek" and not s.details["trace_in_asked"]
    assert task.score(p, base.demonstration(test[0])).details["trace_language"] == "source"
    line = task.corpus_text(task.sample("train", 1, 0)[0])
    name, text = line.split(": ", 1)
    assert name in ("cyrillic", "greek", "georgian") and task.language(name).back(text) == base.corpus_text(
        base.sample("train", 1, 0)[0]
    )
    with pytest.raises(ValueError, match="ood must be unseen"):
        make_task("thinking_language", sft_languages=["greek"], ood_languages=["greek"])


def test_a_base_pre_trained_without_a_language_never_reads_it():
    task = make_task("thinking_language", base="arithmetic", languages=["cyrillic", "greek"])
    names = Counter(task.corpus_text(p).split(": ", 1)[0] for p in task.sample("train", 400, 0))
    assert set(names) == {"cyrillic", "greek"} and min(names.values()) > 150  # both, about evenly
    georgian = task.language("georgian").block
    assert not any(set(task.corpus_text(p)) & georgian for p in task.sample("train", 400, 0))
