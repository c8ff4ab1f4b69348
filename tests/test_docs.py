"""The README and docs/ stay true: the recipe reference is what the configs say, the README's recipe
validates, every relative link resolves, and the site builds."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from temper.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _reference_tool():
    spec = importlib.util.spec_from_file_location("recipe_reference", ROOT / "tools" / "recipe_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recipe_reference_is_generated_from_the_configs():
    tool = _reference_tool()
    assert tool.OUT.read_text() == tool.reference(), "run python tools/recipe_reference.py"


def test_the_reference_lists_every_key_of_a_stage_and_its_docstring():
    from temper.stages import registry
    from temper.train.rl_config import RLConfig

    text = _reference_tool().reference()
    rl = text[text.index("### `kind: rl`") : text.index("### `kind: rft`")]
    missing = [f.name for f in dataclasses.fields(RLConfig) if f"| `{f.name}` |" not in rl]
    assert not missing
    assert "| `HASHED_WHEN_SET` |" not in text  # a ClassVar is no recipe key
    assert set(registry.kinds()) == set(re.findall(r"^### `kind: (\w+)`", text, re.M))
    # a description is the attribute docstring, on one line
    assert "| `group_size` | int | 8 | Samples per prompt (G in GRPO). |" in rl


def test_the_readme_recipe_is_a_valid_recipe():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    assert blocks, "the README shows a recipe"
    # its paths are written as from recipes/ (where grpo_custom_reward.yaml lives)
    recipe = parse_recipe(blocks[0], "README.md", base_dir=ROOT / "recipes")
    assert [s.kind for s in recipe.stages] == ["sft", "rl", "eval"]


def test_the_readme_environment_class_plays_through_its_recipe_entry(tmp_path: Path):
    """The "Your agent" example as a user would copy it: the class and reward function into
    vault.py, the task entry into a recipe; its tool reaches the prompt and a right answer scores."""
    import yaml

    from temper.catalog import make_recipe_task

    agent = (ROOT / "README.md").read_text().split("## Your agent", 1)[1]
    (tmp_path / "vault.py").write_text(re.findall(r"```python\n(.*?)```", agent, re.S)[0])
    (tmp_path / "vaults.jsonl").write_text('{"prompt": "Open the vault.", "secret": 37}\n' * 4)
    (name, entry), *_ = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", agent, re.S)[0])["tasks"].items()
    task = make_recipe_task(name, entry, tmp_path)
    env = task.make_env(task.sample("train", 1, 0)[0])
    assert env.reset()[-1]["content"] == "Open the vault. (between 1 and 100)"
    assert [t["function"]["name"] for t in env.tools] == ["guess"]
    step = env.step('<tool_call>{"name": "guess", "arguments": {"number": 50}}</tool_call>')
    assert step.messages[0]["content"] == "lower"
    final = env.step("The code is 37.")
    assert final.done and final.score.reward == 1.0


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "recipe" / "index.html").exists()
