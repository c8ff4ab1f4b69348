"""The Python API (`temper.api`): the same recipe, validation, messages and run as the YAML path;
Python objects named as a recipe names them; `source: base`; `environment_factory`."""

from __future__ import annotations

import contextlib
import dataclasses
import doctest
import io
import json
import re
from pathlib import Path

import pytest
import yaml

import temper
from temper import api
from temper.cli import main
from temper.recipe import RecipeError, parse_recipe

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "tests" / "pinned" / "start"  # the tiny base after the quickstart's SFT


def correct(completions, answer, **kwargs):
    """1.0 when the completion ends with `Answer: <the row's answer>`."""
    return [
        1.0 if c.strip().endswith(f"Answer: {a}") else 0.0 for c, a in zip(completions, answer, strict=True)
    ]


def rows(n: int = 100) -> list[dict[str, str]]:
    return [
        {"prompt": f"{a}+{b}=", "completion": f"Answer: {a + b}", "answer": str(a + b)}
        for a in range(10)
        for b in range(10)
    ][:n]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory with tests/pinned/start where the docstrings' examples look for it."""
    (tmp_path / "tests" / "pinned").mkdir(parents=True)
    (tmp_path / "tests" / "pinned" / "start").symlink_to(START)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_docstring_examples_run(workdir):
    """Each function's example runs (a dry run: validated, inputs checked, the plan returned)."""
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    ran = []
    for fn in (api.run, api.sft, api.grpo, api.eval):
        (test,) = finder.find(fn, globs={"temper": temper})
        assert test.examples, fn.__name__
        runner.run(test)
        ran.append(fn.__name__)
    assert runner.summarize(verbose=False).failed == 0
    assert ran == ["run", "sft", "grpo", "eval"]


def test_two_recipes_plan_the_same_through_run(tmp_path, monkeypatch):
    """The quick part of the next test, in the default suite: a preset recipe and a user-data one."""
    monkeypatch.chdir(tmp_path)
    _same_plans([ROOT / "recipes" / "quickstart.yaml", ROOT / "recipes" / "grpo_custom_reward.yaml"])


@pytest.mark.slow
def test_every_shipped_recipe_plans_the_same_through_run(tmp_path, monkeypatch):
    """`temper.run(dict)` of each shipped recipe says what `temper run FILE --dry-run` says: the
    same validated plan (or the same refusal). (About 3 minutes on 2 busy cores.)"""
    monkeypatch.chdir(tmp_path)
    recipes = sorted((ROOT / "recipes").glob("*.yaml"))
    assert len(recipes) > 30
    _same_plans(recipes)


def _same_plans(recipes: list[Path]) -> None:
    for path in recipes:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["run", str(path), "--dry-run"])
        said = out.getvalue().strip() if rc == 0 else err.getvalue().strip()
        try:
            plan = "\n".join(
                temper.run(yaml.safe_load(path.read_text()), base_dir=path.parent, dry_run=True).plan
            )
        except RecipeError as error:
            plan = f"temper: error: {error}"
        assert plan == said, path.name
        assert re.search(r"^1\. ", plan, re.M), path.name  # a plan, not two equal refusals


def test_a_bad_keyword_says_what_the_recipe_says(workdir):
    """`prompt_per_step=` is refused as `train: {prompt_per_step: ...}` is, with the same message,
    at the call and the key path instead of file:line; and the valid keys hold no ClassVar."""
    with pytest.raises(RecipeError) as called:
        temper.grpo(str(START), rows(), [correct], prompt_per_step=2, dry_run=True)
    text = f"""name: r
model: {{path: {START}}}
tasks: {{data: {{task: dataset, data: x.jsonl}}}}
stages:
  - kind: rl
    tasks: [data]
    train: {{prompt_per_step: 2}}
"""
    with pytest.raises(RecipeError) as recipe:
        parse_recipe(text, "r.yaml")
    (line,) = [x.strip() for x in str(called.value).splitlines() if "prompt_per_step" in x]
    (want,) = [x.strip() for x in str(recipe.value).splitlines() if "prompt_per_step" in x]
    assert line.startswith(
        "temper.grpo: train.prompt_per_step: unknown key 'prompt_per_step'; did you mean 'prompts_per_step'?"
    )
    assert want.startswith("r.yaml:7: stages[0].train.prompt_per_step: ")
    assert line.split("train.prompt_per_step: ", 1)[1] == want.split("train.prompt_per_step: ", 1)[1]


def test_valid_keys_are_the_fields_without_classvars():
    from temper.train.rl_config import RLConfig

    text = "name: r\nmodel: {preset: tiny}\nstages:\n  - kind: pretrain\n  - kind: rl\n    tasks: [a]\n    train: {prompt_per_step: 2}\n"
    with pytest.raises(RecipeError) as err:
        parse_recipe(text, "r.yaml")
    listed = str(err.value).split("Valid keys: ")[1].splitlines()[0].split(", ")
    assert listed == [f.name for f in dataclasses.fields(RLConfig)]
    assert "HASHED_WHEN_SET" in RLConfig.__dataclass_fields__ or any(
        "HASHED" in k for k in RLConfig.__dataclass_fields__
    ), "the ClassVar this test is about is gone: test another block that has one"


def test_code_is_named_by_module_and_lambdas_are_refused(workdir):
    assert api.code_name(correct, "x") == f"{__name__}:correct"
    assert api.code_name("rewards.py:f", "x") == "rewards.py:f"
    with pytest.raises(
        RecipeError, match=r"temper.grpo: tasks.data.rewards\[1\]: '<lambda>' cannot be named"
    ):
        temper.grpo(
            str(START), rows(), [correct, lambda completions, **kw: [0.0] * len(completions)], dry_run=True
        )

    def inner(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(RecipeError, match="defined inside"):
        api.code_name(inner, "x")


def test_rows_are_written_once_by_their_digest(workdir):
    """The same rows and arguments are the same run (so a second call skips or resumes it);
    other rows, another run; the rows' file is named by their digest and holds them."""
    a = temper.sft(str(START), rows(), max_steps=2, dry_run=True)
    b = temper.sft(str(START), rows(), max_steps=2, dry_run=True)
    c = temper.sft(str(START), rows(50), max_steps=2, dry_run=True)
    assert a.run_dir == b.run_dir != c.run_dir
    from datasets import Dataset, DatasetDict

    assert temper.sft(str(START), Dataset.from_list(rows()), max_steps=2, dry_run=True).run_dir == a.run_dir
    with pytest.raises(RecipeError, match=r"pass one split, e.g. ds\['train'\]"):
        temper.grpo(str(START), DatasetDict(train=Dataset.from_list(rows())), [correct], dry_run=True)
    (written,) = (a.run_dir / "inputs").glob("*.jsonl")
    assert [json.loads(x) for x in written.read_text().splitlines()] == rows()
    assert str(written.relative_to(workdir)) in a.plan[1]
    with pytest.raises(RecipeError, match=r"temper.sft: stages\[0\].data.files\[0\]: row 0 is a int"):
        temper.sft(str(START), [1, 2], dry_run=True)


def test_source_base_starts_again_from_the_recipe_model(workdir):
    from temper.runner import _inputs
    from temper.stages.context import StageContext

    stages = [{"kind": "sft", "data": {"tasks": ["arithmetic"]}}, {"kind": "sft", "name": "again"}]
    recipe = {"name": "r", "model": {"path": str(START)}, "tasks": {"arithmetic": {}}}
    for source in ("base", str(START), "start"):  # the option, the model's path, its name
        stages[1]["source"] = source
        temper.run({**recipe, "stages": stages}, dry_run=True)
        parsed = api.validate_recipe(api.registered({**recipe, "stages": stages}, workdir, "t"), "t", workdir)
        ctx = StageContext(workdir, workdir, {}, {}, models={"sft": workdir / "m"}, model_hashes={"sft": "h"})
        assert _inputs(parsed, 1, ctx) == (START, parsed.model.weights())
    stages[1]["source"] = "qwen3-tiny"
    with pytest.raises(RecipeError) as err:
        temper.run({**recipe, "stages": stages}, dry_run=True)
    assert (
        "temper.run: stages[1].source: stage 'again' refers to 'qwen3-tiny', which is not an earlier "
        "model stage ['sft'] (write `source: base` to start from the recipe's model)"
    ) in str(err.value)
    # a stage named base is the stage
    stages[0]["name"], stages[1]["source"] = "base", "base"
    parsed = api.validate_recipe({**recipe, "stages": stages}, "t", workdir)
    ctx = StageContext(workdir, workdir, {}, {}, models={"base": workdir / "m"}, model_hashes={"base": "h"})
    assert _inputs(parsed, 1, ctx) == (workdir / "m", "h")


VAULT = '''
class Vault:
    """A TRL environment class: guess the secret number."""

    def reset(self, **row):
        self.secret = int(row["secret"])
        return " (between 1 and 100)"

    def guess(self, number: int) -> str:
        """Guess the code.

        Args:
            number: the guess
        """
        return "open" if number == self.secret else "lower" if number > self.secret else "higher"


def opened(completions, secret, environments, **kwargs):
    """1.0 when the final answer names the secret (completions: the episode's messages, as TRL's)."""
    return [1.0 if str(s) in c[-1]["content"] else 0.0 for c, s in zip(completions, secret)]
'''


def test_environment_factory_renders_the_tools_and_grades_with_rewards(workdir):
    from transformers import AutoTokenizer

    from temper.catalog import make_recipe_task
    from temper.data.chat import prompt_ids
    from temper.models.chat import template_text

    (workdir / "vault.py").write_text(VAULT)
    (workdir / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": "Open the vault.", "secret": s}) + "\n" for s in range(30, 50))
    )
    entry = {
        "task": "dataset",
        "data": "rows.jsonl",
        "environment_factory": "vault.py:Vault",
        "rewards": ["vault.py:opened"],
    }
    task = make_recipe_task("vault", entry, workdir)
    problem = task.sample("train", 1, 0)[0]
    env = task.make_env(problem)
    messages = env.reset()
    assert messages[-1]["content"] == "Open the vault. (between 1 and 100)"
    assert [t["function"]["name"] for t in env.tools] == ["guess"]
    tokenizer = AutoTokenizer.from_pretrained(START)
    tokenizer.chat_template = template_text("chatml")  # (the start model's own renders no tools)
    rendered = tokenizer.decode(prompt_ids(tokenizer, messages, env.tools))
    assert '"name": "guess"' in rendered and "the guess" in rendered
    secret = problem.data["row"]["secret"]
    step = env.step(f'<tool_call>{{"name": "guess", "arguments": {{"number": {secret}}}}}</tool_call>')
    assert step.messages == [{"role": "tool", "name": "guess", "content": "open"}]
    final = env.step(f"The code is {secret}.")
    assert final.done and final.score.correct and final.score.reward == 1.0
    wrong = task.make_env(problem)
    wrong.reset()
    assert wrong.step("The code is 0.").score.reward == 0.0
    with pytest.raises(ValueError, match="not both"):
        make_recipe_task("vault", {**entry, "env": "vault.py:opened"}, workdir)
    # from Python, the class itself (named by its module and name)
    import sys

    sys.path.insert(0, str(workdir))
    try:
        import vault

        plan = temper.grpo(
            str(START), "rows.jsonl", [vault.opened], environment_factory=vault.Vault, steps=1, dry_run=True
        ).plan
        assert plan[1].startswith("1. rl: ")
        entry = api.registered({"tasks": {"v": {"environment_factory": vault.Vault}}}, workdir, "t")
        assert entry["tasks"]["v"]["environment_factory"] == "vault:Vault"
    finally:
        sys.path.remove(str(workdir))
        sys.modules.pop("vault", None)


def test_python_pipeline_sft_grpo_eval(workdir):
    """The README's "In Python" example, on the tiny model with tiny caps: SFT -> GRPO -> eval of
    one's own model, rows and reward function, each a run folder with its model and metrics."""
    data = rows()
    sft = temper.sft(str(START), data, max_steps=4, batch_size=4, warmup_steps=0, progress=False)
    rl = temper.grpo(
        sft.model,
        data,
        [correct],
        steps=2,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=8,
        probe_groups=0,
        progress=False,
    )
    ev = temper.eval(rl.model, data, [correct], n_problems=4, k=2, max_new_tokens=8)
    assert (sft.model / "config.json").exists() and (rl.model / "config.json").exists() and ev.model is None
    assert sft.metrics["sft"]["steps"] == 4 and rl.metrics["rl"]["steps"] == 2
    assert rl.metrics["rl"]["final"]["reward_fn/correct"] >= 0
    (row,) = ev.metrics["eval"]["data"].values()
    assert list(row) == ["test"] and row["test"]["n_problems"] == 4
    assert 0 <= row["test"]["metrics"]["greedy_accuracy"]["value"] <= 1
    recorded = yaml.safe_load((rl.run_dir / "recipe.yaml").read_text())
    assert recorded["tasks"]["data"]["rewards"] == [f"{__name__}:correct"]
    again = temper.sft(str(START), data, max_steps=4, batch_size=4, warmup_steps=0, progress=False)
    assert again == sft  # same call: the complete run, skipped


@pytest.mark.slow
def test_the_readme_example_runs_as_a_script(tmp_path):
    """The README's "In Python" block, run as the script a user would write (its reward function
    lives in `__main__`), with its budgets capped by keyword as tests/pinned_recipes.py caps a
    recipe's: SFT -> GRPO -> eval from the shipped tiny base, in under 20 lines."""
    import os
    import subprocess
    import sys

    from pinned_recipes import CAPS

    readme = (ROOT / "README.md").read_text()
    block = readme.split("### In Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(block.splitlines()) < 20
    caps = {**CAPS, "n_problems": 4, "k": 2, "max_new_tokens": 8}
    script = re.sub(
        r"\b(\w+)=(\d+)\b",
        lambda m: f"{m[1]}={min(int(m[2]), caps[m[1]])}" if m[1] in caps else m[0],
        block,
    )
    assert script != block  # the budgets were found (a renamed keyword would run the full example)
    (tmp_path / "example.py").write_text(script)
    for folder in ("checkpoints", "examples"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "greedy_accuracy" in done.stdout
    (rl,) = (tmp_path / "runs").glob("rl-*")
    assert yaml.safe_load((rl / "recipe.yaml").read_text())["tasks"]["data"]["rewards"] == [
        "__main__:correct"
    ]
