"""`temper --help`, `temper run --dry-run` and the refusal of a bad recipe read configs only: none
of them imports torch, transformers or the other heavy libraries (they are imported where a stage
runs). Checked in a fresh interpreter's `sys.modules`, so the test does not depend on the
machine's load, as a timing would."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = (
    "torch",
    "transformers",
    "datasets",
    "peft",
    "accelerate",
    "matplotlib",
    "safetensors",
    "tokenizers",
    "ray",
)

PROBE = """
import json, sys
from temper import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "heavy": [m for m in HEAVY if m in sys.modules]}), file=sys.stderr)
"""


def _run(*args: str, cwd: Path = ROOT) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.replace("HEAVY", repr(HEAVY)), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    last = proc.stderr.strip().splitlines()[-1]
    return json.loads(last) | {"out": proc.stdout, "err": proc.stderr}


def test_importing_the_cli_imports_no_heavy_library():
    code = f"import sys, temper.cli, temper.recipe; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src")}
    )
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize(
    "args",
    [["--help"], ["sft", "--help"], ["rl", "--help"], ["run", "recipes/quickstart.yaml", "--dry-run"]],
    ids=["help", "sft-help", "rl-help", "dry-run"],
)
def test_help_and_the_dry_run_import_no_heavy_library(args):
    r = _run(*args)
    assert r["code"] in (0, None) and r["heavy"] == [], r["err"][-2000:]
    if "--dry-run" in args:  # the plan was made: every stage listed
        assert "4. eval" in r["out"] + r["err"]


def test_a_bad_recipe_is_refused_without_a_heavy_library(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: {preset: tiny}\nstages:\n  - kind: sft\n    bogus: 1\n")
    r = _run("run", str(bad))
    assert r["code"] == 2 and "bogus" in r["err"] and r["heavy"] == [], r["err"][-2000:]


def test_the_shipped_recipes_dry_run_without_a_heavy_library():
    """A recipe's validation and plan (tasks built, feature rules run) stays on configs. Not the
    multi_tool task's: building it makes its tools' JSON schemas with transformers' `get_json_schema`."""
    for recipe in [
        "agent_treasure_hunt.yaml",
        "agent_calculator.yaml",
        "rlhf_ppo.yaml",
        "dpo_arithmetic.yaml",
    ]:
        r = _run("run", f"recipes/{recipe}", "--dry-run")
        assert r["code"] in (0, None) and r["heavy"] == [], (recipe, r["err"][-2000:])
