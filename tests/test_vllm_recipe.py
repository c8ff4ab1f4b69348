"""recipes/vllm/cpu.yaml (`sampler: vllm`) and recipes/vllm/server_cpu.yaml (`sampler:
vllm_server`) end to end on the CPU, shrunk: pretrain (the shipped base, reused) -> SFT -> GRPO ->
eval, in the vLLM venv (`make test-vllm`). The SFT stage runs once; each recipe's run starts from a
copy of it (the runner skips the complete stages), and an HF-sampler run of the same GRPO stage
from the same model and seeds is the reference.

What each test would catch: a vLLM stage that does not complete, or whose engine drifts from the
trainer after a sync (`vllm_check_sync` stops the run past 1e-3); rollouts drawn by another
sampler than the recipe's (provenance), with no mismatch diagnostics; an engine whose samples are
not the policy's (wrong stop ids, temperature, prompt ids): its mean reward leaves the HF
sampler's by more than noise; an eval stage that cannot generate with the recipe's backend."""

import json
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

from vllm_probe import skip_without_a_vllm_engine

skip_without_a_vllm_engine()

import temper  # noqa: E402

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "vllm"
STEPS = 8


def shrunk(name: str, sampler: str | None = None, stages: int | None = None) -> dict:
    recipe = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())
    pretrain, sft, rl, ev = recipe["stages"]
    sft["train"] |= {"max_steps": 120, "eval_every": 0}
    sft["data"]["eval_problems"] = 0
    rl["probe_groups"] = 0
    rl["gate"]["n_problems"] = 32
    rl["train"] |= {"steps": STEPS, "prompts_per_step": 16, "eval_every": 0, "eval_problems": 40}
    ev |= {"n_problems": 40, "k": 2, "models": ["rl"], "splits": ["test"]}
    if sampler is not None:
        rl["sampler"] = ev["sampler"] = sampler
        if sampler == "hf":
            rl.pop("vllm_check_sync")
    recipe["stages"] = recipe["stages"][:stages]
    return recipe


def run(recipe: dict, out: Path):
    return temper.run(recipe, output_dir=out, base_dir=RECIPES)


def rewards(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "03-rl" / "metrics.jsonl").read_text().splitlines()]
    return [r["reward"] for r in rows if "reward" in r]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vllm_recipe") / "sft"
    run(shrunk("cpu", stages=2), out)
    return out


@pytest.fixture(scope="module")
def hf_rewards(sft_run, tmp_path_factory) -> list[float]:
    out = tmp_path_factory.mktemp("vllm_recipe") / "hf"
    shutil.copytree(sft_run, out)
    run(shrunk("cpu", sampler="hf", stages=3), out)
    return rewards(out)


@pytest.mark.parametrize(("name", "kind"), [("server_cpu", "VLLMServerSampler"), ("cpu", "VLLMSampler")])
def test_a_vllm_recipe_runs_sft_grpo_eval_within_noise_of_the_hf_sampler(
    name, kind, sft_run, hf_rewards, tmp_path
):
    out = tmp_path / name
    shutil.copytree(sft_run, out)
    (out / "recipe.yaml").unlink()  # the folder is this recipe's run from here on
    result = run(shrunk(name), out)
    assert (out / "02-sft" / "stage.json").exists() and (out / "04-eval" / "stage.json").exists()

    rows = [json.loads(line) for line in (out / "03-rl" / "rollouts.jsonl").read_text().splitlines()]
    assert {r["sampler"]["kind"] for r in rows} == {kind}
    assert sorted({r["policy_version"] for r in rows}) == list(range(STEPS))
    metrics = [json.loads(line) for line in (out / "03-rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward" in m]
    assert len(steps) == STEPS
    # the trainer's logprobs against the engine's at sampling time: fp32 on both sides
    assert all(0 <= m["mismatch/max_abs"] < 1e-2 for m in steps), [m["mismatch/max_abs"] for m in steps]

    # 8 steps x 16 prompts x 8 samples per run: the mean reward's standard error is ~0.02 per
    # sampler; a broken engine (its samples not the policy's) is off by far more
    got, want = rewards(out), hf_rewards
    assert abs(statistics.mean(got) - statistics.mean(want)) < 0.1, (got, want)

    evaluated = result.metrics["eval"]["arithmetic"]
    assert list(evaluated) == ["pretrain", "rl"]  # the run's starting model first, then the stage's
    for model in evaluated.values():
        assert model["test"]["n_problems"] == 40 and len(model["test"]["greedy_correct"]) == 40
    assert evaluated["rl"]["test"]["greedy_correct"].count("1") > 8  # the SFT'd model answers some
