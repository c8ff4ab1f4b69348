"""experiments/multiseed.py: what a seed changes in a recipe, and the paired-difference interval."""

import json
import os
import statistics
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "experiments"))
import multiseed  # noqa: E402  (experiments/, put on the path above)
import tables  # noqa: E402

RECIPE = """
name: t
model: {preset: nano}
tasks: {arithmetic: {}}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic]}
  - kind: sft
    data: {tasks: [arithmetic]}
  - kind: dpo
    source: sft
    data: {generate: &pairs {tasks: [arithmetic], seed: 7}}
  - kind: sft
    name: chosen
    source: sft
    data: {pairs: *pairs}
"""


def test_a_seed_reaches_the_varied_stages_and_their_generated_pairs_only():
    _, text = multiseed.seeded_recipe(RECIPE, 3, ["dpo", "chosen"])
    stages = {s.get("name", s["kind"]): s for s in yaml.safe_load(text)["stages"]}
    assert stages["dpo"]["train"]["seed"] == 3 and stages["dpo"]["data"]["generate"]["seed"] == 3
    assert stages["chosen"]["data"]["pairs"]["seed"] == 3 and stages["chosen"]["data"]["seed"] == 1003
    assert "train" not in stages["sft"] and "seed" not in stages["sft"]["data"]
    # the alias the stages share: varying one stage leaves the other's pairs seed as written
    _, text = multiseed.seeded_recipe(RECIPE, 3, ["dpo"])
    stages = {s.get("name", s["kind"]): s for s in yaml.safe_load(text)["stages"]}
    assert stages["dpo"]["data"]["generate"]["seed"] == 3 and stages["chosen"]["data"]["pairs"]["seed"] == 7


def test_paired_difference_is_the_mean_with_a_t_interval():
    diffs = [0.01, 0.03, 0.08]
    m, s = statistics.mean(diffs), statistics.stdev(diffs)
    half = 4.303 * s / 3**0.5  # t(0.975, 2 df)
    assert multiseed.paired(diffs) == f"{100 * m:+.1f} [{100 * (m - half):+.1f}, {100 * (m + half):+.1f}]"
    assert multiseed.paired([0.02]) == "+2.0"
    with pytest.raises(statistics.StatisticsError):
        multiseed.paired([])


# --- the sweep: grid, resume, worker budget, tables --------------------------------------------

SWEEP = """
name: sweep
model: {preset: nano}
tasks:
  gp: {task: general_points, n_cards: 3, target: 12}
stages:
  - kind: pretrain
    corpus: {tasks: [gp]}
    train: {max_steps: 2, warmup_steps: 1}
  - kind: sft
    data: {tasks: [gp]}
    train: {max_steps: 2, warmup_steps: 1}
  - kind: eval
    splits: [test, ood]
"""


def test_the_grid_is_the_product_of_the_axes_and_overrides_reach_tasks_and_named_stages():
    axes = [
        multiseed.parse_axis("tasks.gp.n_cards=2,3"),
        multiseed.parse_axis("stages.sft.train.lr=0.001,0.01"),
    ]
    assert axes[0] == ("tasks.gp.n_cards", [2, 3])  # values read as YAML: ints, not strings
    assert multiseed.parse_axis("tasks.gp.face_values_id=[10,10,10],[11, 12, 13]") == (
        "tasks.gp.face_values_id",
        [[10, 10, 10], [11, 12, 13]],
    )
    cells = multiseed.expand_grid(axes)
    assert cells == [
        {"tasks.gp.n_cards": 2, "stages.sft.train.lr": 0.001},
        {"tasks.gp.n_cards": 2, "stages.sft.train.lr": 0.01},
        {"tasks.gp.n_cards": 3, "stages.sft.train.lr": 0.001},
        {"tasks.gp.n_cards": 3, "stages.sft.train.lr": 0.01},
    ]
    assert multiseed.expand_grid([]) == [{}]  # no grid: one cell, the recipe as written
    assert [multiseed.cell_name(c) for c in cells[:2]] == ["n_cards=2,lr=0.001", "n_cards=2,lr=0.01"]
    # two axes with the same leaf are named by their full keys
    assert multiseed.cell_name({"tasks.a.seed": 1, "stages.sft.train.seed": 2}) == (
        "tasks.a.seed=1,stages.sft.train.seed=2"
    )
    recipe, text = multiseed.seeded_recipe(SWEEP, 4, ["sft"], cells[3])
    data = yaml.safe_load(text)
    assert data["tasks"]["gp"] == {"task": "general_points", "n_cards": 3, "target": 12}
    assert data["stages"][1]["train"] == {"max_steps": 2, "warmup_steps": 1, "lr": 0.01, "seed": 4}
    assert "lr" not in data["stages"][0]["train"]  # the pretrain stage keeps its settings
    assert recipe.stages[1].train.lr == 0.01
    with pytest.raises(SystemExit, match="no stage named 'rl'"):
        multiseed.seeded_recipe(SWEEP, 0, ["sft"], {"stages.rl.train.lr": 1.0})
    with pytest.raises(SystemExit, match="KEY=V1"):
        multiseed.parse_axis("tasks.gp.n_cards")


def test_jobs_lay_out_cells_and_seeds_and_fixed_overrides_do_not_name_folders(tmp_path):
    jobs, recipes = multiseed.build_jobs(SWEEP, tmp_path, [0, 1], ["sft"], [{}])
    assert [j.run_dir for j in jobs] == [tmp_path / "seed-0", tmp_path / "seed-1"]  # the old layout
    cells = multiseed.expand_grid([multiseed.parse_axis("tasks.gp.target=10,24")])
    jobs, recipes = multiseed.build_jobs(SWEEP, tmp_path, [0, 1], ["sft"], cells, {"tasks.gp.n_cards": 2})
    assert [j.run_dir.relative_to(tmp_path).as_posix() for j in jobs] == [
        "target=10/seed-0",
        "target=10/seed-1",
        "target=24/seed-0",
        "target=24/seed-1",
    ]
    assert all(yaml.safe_load(j.text)["tasks"]["gp"]["n_cards"] == 2 for j in jobs)
    assert set(recipes) == {"target=10", "target=24"}


def _finish(job):
    """Plant what a finished run leaves: its recipe and every stage's completion marker."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    (job.run_dir / "recipe.yaml").write_text(job.text)
    for i, stage in enumerate(yaml.safe_load(job.text)["stages"]):
        out = multiseed.stage_dir(job.run_dir, i, stage.get("name", stage["kind"]))
        out.mkdir(exist_ok=True)
        (out / "stage.json").write_text("{}")


def test_a_resumed_sweep_runs_only_the_unfinished_jobs(tmp_path):
    cells = multiseed.expand_grid([multiseed.parse_axis("tasks.gp.target=10,24")])
    jobs, _ = multiseed.build_jobs(SWEEP, tmp_path, [0, 1], ["sft"], cells)
    for job in jobs:
        _finish(job)
    # jobs[1]: killed in its eval (no marker); jobs[2]: a finished run of another recipe text
    (multiseed.stage_dir(jobs[1].run_dir, 2, "eval") / "stage.json").unlink()
    (jobs[2].run_dir / "recipe.yaml").write_text(jobs[2].text.replace("max_steps: 2", "max_steps: 3"))
    assert [multiseed.finished(j) for j in jobs] == [True, False, False, True]
    ran = []
    status = multiseed.run_sweep(
        jobs, tmp_path, 1, 2, run=lambda job, base, threads, log: ran.append((job, threads, log)) or 1.0
    )
    assert ran == [(jobs[1], 2, False), (jobs[2], 2, False)]
    assert [status[j] for j in jobs] == ["skipped", "ran in 1 s", "ran in 1 s", "skipped"]

    def crash(job, base, threads, log):
        raise RuntimeError("boom")

    status = multiseed.run_sweep(jobs, tmp_path, 1, 2, run=crash)  # a failure is reported, not fatal
    assert status[jobs[1]] == status[jobs[2]] == "failed: RuntimeError: boom"


def test_workers_times_threads_never_exceeds_the_cores():
    assert multiseed.budget(None, None, cores=2, jobs=6) == (2, 1)  # one worker per core
    assert multiseed.budget(1, None, cores=2, jobs=6) == (1, 2)  # one worker gets both cores
    assert multiseed.budget(None, None, cores=2, jobs=1) == (1, 2)  # no idle worker for one job
    assert multiseed.budget(None, None, cores=16, jobs=3) == (3, 5)
    assert multiseed.budget(2, 1, cores=2, jobs=6) == (2, 1)
    assert multiseed.budget(None, 2, cores=4, jobs=6) == (2, 2)  # --threads alone: the workers that fit
    with pytest.raises(SystemExit, match="more than the 2 cores"):
        multiseed.budget(2, 2, cores=2, jobs=6)
    with pytest.raises(SystemExit, match="more than the 2 cores"):
        multiseed.budget(3, None, cores=2, jobs=6)


def _plant_eval(job, greedy: dict[tuple[str, str], float], parse: float):
    _finish(job)
    result = {"gp": {}}
    for (model, split), value in greedy.items():
        result["gp"].setdefault(model, {})[split] = {
            "k": 1,
            "metrics": {
                "greedy_accuracy": {"value": value},
                "mean@1": {"value": value / 2},
                "parse_rate": {"value": parse},
            },
        }
    (multiseed.stage_dir(job.run_dir, 2, "eval") / "eval.json").write_text(json.dumps(result))
    for i, name in ((0, "pretrain"), (1, "sft")):  # the compute table reads each model stage's summary
        out = multiseed.stage_dir(job.run_dir, i, name)
        (out / "stage.json").write_text(json.dumps({"seconds": 10.0 * (i + 1)}))
        (out / f"{name}.json").write_text(json.dumps({"tokens": 1000}))


def test_the_grid_table_and_plot_give_each_cell_its_spread_over_seeds(tmp_path):
    cells = multiseed.expand_grid([multiseed.parse_axis("tasks.gp.target=10,24")])
    jobs, recipes = multiseed.build_jobs(SWEEP, tmp_path, [0, 1, 2], ["sft"], cells)
    for n, job in enumerate(jobs):
        greedy = {("sft", "test"): 0.1 * (n + 1), ("sft", "ood"): 0.01 * n}
        _plant_eval(job, greedy, parse=0.9)
    done = {}
    for job in jobs:
        done.setdefault(job.cell, (recipes[job.cell], {}))[1][job.seed] = job.run_dir
    lines = multiseed.grid_table(done)
    assert lines[:2] == [
        "| cell | model | split | greedy accuracy % | parse rate % | seeds |",
        "|---|---|---|---|---|---|",
    ]
    # target=24 holds jobs 3, 4, 5: test 40, 50, 60 %, ood 3, 4, 5 %
    assert (
        f"| target=24 | sft | test | {tables.spread([0.4, 0.5, 0.6], 100, 1)} | 90.0 ± 0.0 [90.0, 90.0] | 3 |"
        in lines
    )
    assert "| target=24 | sft | test | 50.0 ± 10.0 [40.0, 60.0] | 90.0 ± 0.0 [90.0, 90.0] | 3 |" in lines
    assert "| target=10 | sft | ood | 1.0 ± 1.0 [0.0, 2.0] | 90.0 ± 0.0 [90.0, 90.0] | 3 |" in lines
    assert len(lines) == 2 + 2 * 2
    multiseed.grid_plot(done, tmp_path / "grid.png", "sweep")
    assert (tmp_path / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _record_worker(job, base_dir, threads, log):
    """A stand-in for run_job in a spawned worker: what process and thread budget it ran with."""
    import os

    import torch

    job.run_dir.mkdir(parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "omp": os.environ.get("OMP_NUM_THREADS"), "threads": threads, "log": log}
    (job.run_dir / "worker.json").write_text(json.dumps(record | {"torch": torch.get_num_threads()}))
    return 0.0


@pytest.mark.slow  # the spawned workers import torch and temper: tens of seconds on a loaded machine
def test_parallel_jobs_run_in_spawned_workers_with_the_thread_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # run_sweep sets the workers' own value
    jobs, _ = multiseed.build_jobs(SWEEP, tmp_path, [0, 1], ["sft"], [{}])
    status = multiseed.run_sweep(jobs, tmp_path, 2, 1, run=_record_worker)
    assert [status[j] for j in jobs] == ["ran in 0 s", "ran in 0 s"]
    records = [json.loads((j.run_dir / "worker.json").read_text()) for j in jobs]
    assert {r["pid"] for r in records}.isdisjoint({os.getpid()})  # not in the test's process
    assert all(r["omp"] == "1" and r["torch"] == 1 and r["threads"] == 1 and r["log"] for r in records)


def test_a_shared_start_runs_once_and_each_seed_skips_it(tmp_path, capsys):
    """The leading stages no seed changes (here the pretrain) run once into `shared/`; every seed
    gets a copy whose hash the runner accepts, so only the varied stages and the eval run per seed."""
    text = SWEEP.replace(
        "splits: [test, ood]", "splits: [test]\n    n_problems: 2\n    k: 1\n    max_new_tokens: 4"
    )
    jobs, _ = multiseed.build_jobs(text, tmp_path, [0, 1], ["sft"], [{}])
    ((start, seeds),) = multiseed.shared_start(jobs, ["sft"])
    assert start.run_dir == tmp_path / "shared" and seeds == jobs
    assert [s["kind"] for s in yaml.safe_load(start.text)["stages"]] == ["pretrain"]
    status = multiseed.run_sweep(jobs, tmp_path, 1, 1, vary=["sft"])
    assert all(status[j].startswith("ran") for j in jobs) and multiseed.finished(start)
    shared = json.loads((tmp_path / "shared" / "01-pretrain" / "stage.json").read_text())
    for job in jobs:
        assert json.loads((job.run_dir / "01-pretrain" / "stage.json").read_text()) == shared
        assert multiseed.finished(job)
    assert " ".join(capsys.readouterr().err.split()).count("pretrain: complete, skipped") == 2
    assert multiseed.shared_start(jobs, ["pretrain", "sft"]) == []  # nothing leads unchanged


def test_a_cell_with_one_seed_or_a_varied_first_stage_has_no_shared_start(tmp_path):
    jobs, _ = multiseed.build_jobs(SWEEP, tmp_path, [0], ["sft"], [{}])
    assert multiseed.shared_start(jobs, ["sft"]) == []


def test_a_lone_shared_start_gets_every_core_of_the_budget():
    assert multiseed.start_budget(2, 1, 1) == (1, 2)  # one start: both cores, not one idle
    assert multiseed.start_budget(4, 2, 2) == (2, 4)
    assert multiseed.start_budget(2, 1, 3) == (2, 1)  # as many starts as workers: the seeds' budget
    assert multiseed.start_budget(1, 2, 1) == (1, 2)
