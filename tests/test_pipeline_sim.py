"""The pipeline simulator (`temper.train.pipeline_sim`, its inputs from `pipeline_fit`, `temper simulate`): schedules computed by
hand, the staleness of the deterministic mode, the length bias of dropping stale episodes, the fit
of a run's logs (a hand-written one and a real 3-step run) and the command."""

import json
import random
import statistics
from dataclasses import replace

import pytest

from fakes import FirstByteTask
from temper import cli
from temper.models import build_preset
from temper.train.pipeline_fit import fit_linear, pipeline_from_file, pipeline_from_run, step_lengths
from temper.train.pipeline_sim import Pipeline, Schedule, sampling_version, schedules, simulate
from temper.train.rl import train_rl
from temper.train.rl_config import RLConfig


def _one(gen: float, train: float, **kw) -> Pipeline:
    """One episode per step taking `gen` seconds, an update taking `train`."""
    return Pipeline(1, 1, (1,), gen_per_episode=gen, train_per_batch=train, **kw)


def _ends(p: Pipeline, k: int, steps: int = 5, **kw) -> list[float]:
    return list(simulate(p, Schedule(k, steps=steps, **kw)).update_ends)


def test_lockstep_takes_sampling_plus_training_per_step():
    assert _ends(_one(2, 1), k=0) == [3, 6, 9, 12, 15]


def test_one_step_ahead_takes_the_slower_side_per_step_after_warm_up():
    # batch 0 [0,2], update 0 [2,3]; batch 1 (version 0) [2,4], update 1 [4,5]; batch 2 (version 1) [4,6]...
    assert _ends(_one(2, 1), k=1) == [3, 5, 7, 9, 11]
    # the trainer slower: batch 2 waits for version 1 at 3, update t ends at 3 + 2t
    assert _ends(_one(1, 2), k=0) == [3, 6, 9, 12, 15]
    assert _ends(_one(1, 2), k=1) == [3, 5, 7, 9, 11]


@pytest.mark.parametrize("gen, train", [(2, 1), (1, 2), (3, 3)])
def test_no_staleness_beats_the_slower_side(gen, train):
    for k in (1, 2, 5, 20):
        p = simulate(_one(gen, train), Schedule(k, steps=12))
        assert p.steady_seconds_per_step == pytest.approx(max(gen, train))


def test_sync_time_delays_the_next_version():
    # update t and its sync: 1 + 0.5; k=0: 2 + 1.5 per step; k=1: batch 2 waits for version 1 at 3.5
    assert _ends(_one(2, 1, sync=0.5), k=0, steps=3) == [3.5, 7, 10.5]
    assert _ends(_one(2, 1, sync=0.5), k=1, steps=3) == [3.5, 5.5, 7.5]


def test_contention_slows_both_sides_while_they_overlap():
    # batch 0 alone [0,2]; then update 0 and batch 1 share the CPU at half speed: update 0 ends at 4,
    # batch 1 has 1 s of work left, alone: ends at 5; update 1 and batch 2 overlap again...
    assert _ends(_one(2, 1, contention=2.0), k=1) == [4, 7, 10, 13, 15]
    assert _ends(_one(2, 1, contention=2.0), k=0) == [3, 6, 9, 12, 15]  # never overlapping


def test_workers_split_a_batch_and_episodes_share_a_worker():
    p = Pipeline(2, 2, (2,), gen_per_token=1.0, train_per_batch=1.0)  # 4 episodes of 2 s
    assert _ends(p, k=0, steps=3) == [9, 18, 27]
    two = Pipeline(2, 2, (2,), gen_per_token=1.0, train_per_batch=1.0, workers=2)
    assert _ends(two, k=0, steps=3) == [5, 10, 15]
    # processor sharing: episodes of 1 and 3 s started together end at 2 and 4, the batch at 4
    mixed = Pipeline(1, 2, (1, 3), gen_per_token=1.0, train_per_batch=1.0)
    run = simulate(mixed, Schedule(0, steps=3, seed=1))
    ends = [0.0, *run.update_ends]
    assert [b - a for a, b in zip(ends, ends[1:])] == [sum(row) + 1 for row in run.lengths]


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_deterministic_staleness_is_min_of_step_and_k(k):
    p = Pipeline(2, 3, (5, 50, 500), gen_per_token=0.01, train_per_batch=0.7, workers=2, slots=2)
    run = simulate(p, Schedule(k, steps=8, seed=3))
    assert [set(row) for row in run.staleness] == [{min(t, k)} for t in range(8)]
    assert [sampling_version(t, k) for t in range(4)] == [max(0, t - k) for t in range(4)]


def test_deterministic_schedules_train_the_same_episodes_as_sync():
    p = Pipeline(4, 4, tuple(range(10, 400, 10)), gen_per_token=0.01, train_per_batch=2.0)
    runs = [simulate(p, s) for s in schedules([0, 1, 2], steps=10, seed=5)]
    sync = runs[0]
    for run in runs:
        if run.schedule.mode == "deterministic":
            assert run.lengths == sync.lengths
    two = simulate(replace(p, workers=2, slots=3), Schedule(1, steps=10, seed=5))  # shares of a batch
    assert [sorted(row) for row in two.lengths] == [sorted(row) for row in sync.lengths]
    asap0 = simulate(p, Schedule(0, "asap", steps=10, seed=5))  # k=0 as soon as possible is lockstep
    assert asap0.update_ends == pytest.approx(sync.update_ends)
    same = [sorted(row) for row in sync.lengths]
    assert [sorted(row) for row in asap0.lengths] == same  # (asap's rows are in order of ending)


def test_asap_trains_the_episodes_that_finished_first():
    # two workers, 1 s episodes, 3 s updates, k=2: e0, e1 (version 0) end at 1, update 0 takes e0;
    # e2 (version 0) ends at 2; the cap (version + k + 1 episodes) waits for version 1 at 4: e3;
    # update 1 takes e1 (staleness 1), update 2 at 7 e2 (2), update 3 e3 (version 1: 2)...
    p = Pipeline(1, 1, (1,), gen_per_episode=1.0, train_per_batch=3.0, workers=2)
    run = simulate(p, Schedule(2, "asap", steps=5))
    assert run.update_ends == (4, 7, 10, 13, 16)
    assert run.staleness == ((0,), (1,), (2,), (2,), (2,))
    assert run.generated == 7  # e6 started at 13, ended at 14


def test_dropping_stale_episodes_biases_toward_short_ones_and_keeping_all_does_not():
    """Long episodes end last, so they are the ones older than k at the update that would train
    them: dropping them leaves the short ones; keeping them trains every episode eventually."""
    p = Pipeline(4, 8, tuple(range(10, 400, 10)), gen_per_token=0.01, train_per_batch=2.0)
    sync = simulate(p, Schedule(0, steps=50))
    keep = simulate(p, Schedule(1, "asap", "keep", steps=50))
    drop = simulate(p, Schedule(1, "asap", "drop", steps=50))
    assert keep.mean_length == pytest.approx(sync.mean_length, rel=0.02)
    assert drop.mean_length < 0.95 * sync.mean_length
    assert drop.dropped > 0 and keep.dropped == 0
    assert drop.max_staleness == 1 < keep.max_staleness  # kept episodes may be older than k
    assert min(min(row) for row in keep.staleness) == 0


def test_random_pipelines_keep_the_invariants():
    rng = random.Random(0)
    for trial in range(200):
        p = Pipeline(
            rng.randint(1, 3),
            rng.randint(1, 3),
            tuple(rng.randint(0, 50) for _ in range(rng.randint(1, 4))),
            gen_per_token=rng.choice([0, 0.01, 0.1]),
            gen_per_episode=rng.choice([0, 0.1, 1]),
            train_per_batch=rng.choice([0, 0.5, 3]),
            sync=rng.choice([0, 0.2]),
            workers=rng.randint(1, 3),
            slots=rng.choice([None, 1, 2]),
            contention=rng.choice([1, 1.5]),
        )
        mode, stale = rng.choice(["deterministic", "asap"]), rng.choice(["keep", "drop"])
        s = Schedule(rng.randint(0, 3), mode, stale, steps=rng.randint(1, 10), seed=trial)
        run = simulate(p, s)
        assert len(run.update_ends) == s.steps and list(run.update_ends) == sorted(run.update_ends)
        assert all(len(row) == p.batch for row in run.lengths)
        if s.mode == "deterministic":
            assert [set(row) for row in run.staleness] == [{min(t, s.k)} for t in range(s.steps)]
        elif s.stale == "drop":
            assert run.max_staleness <= s.k
        # nothing beats doing the updates back to back
        assert run.seconds >= s.steps * p.train_per_batch + s.steps * p.sync - 1e-9


def test_a_prediction_is_a_function_of_its_seed():
    p = Pipeline(2, 4, (3, 30, 300), gen_per_token=0.01, train_per_batch=1.0)
    s = Schedule(2, "asap", "drop", steps=20, seed=7)
    assert simulate(p, s) == simulate(p, s)
    assert simulate(p, s).lengths != simulate(p, Schedule(2, "asap", "drop", steps=20, seed=8)).lengths


def test_fit_linear_recovers_a_line_and_falls_back_to_nonnegative_coefficients():
    assert fit_linear([1, 2, 3], [2.5, 4.5, 6.5]) == pytest.approx((2.0, 0.5))
    assert fit_linear([4, 4], [2.0, 4.0]) == pytest.approx((0.75, 0.0))  # x does not vary: through 0
    assert fit_linear([1, 2], [1.0, 4.0]) == pytest.approx((1.8, 0.0))  # intercept < 0: through 0 (9 / 5)
    assert fit_linear([1, 2], [3.0, 1.0]) == pytest.approx((0.0, 2.0))  # slope < 0: the mean


def _step(step, n, length, sample, train, prepare=0.0):
    return {
        "step": step,
        "response_length": length,
        "rollout_tokens_per_s": n * length / sample,
        "time/sample": sample,
        "time/prepare": prepare,
        "time/train": train,
    }


def test_a_run_log_is_fitted_per_token_and_per_episode(tmp_path):
    # 6 episodes per step: sampling 0.01 s/token + 0.5 s/episode, training 0.002 s/token + 1 s
    rows = [
        _step(s + 1, 6, L, 0.01 * 6 * L + 0.5 * 6, 0.002 * 6 * L + 0.7, 0.3)
        for s, L in enumerate([10, 20, 40])
    ]
    (tmp_path / "02-rl").mkdir()
    (tmp_path / "02-rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "03-sft").mkdir()  # a later stage, not an RL one
    (tmp_path / "03-sft" / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    rollouts = [
        {"step": s, "problem": f"p{s}-{i // 3}", "completion": "x" * (c * s)}
        for s in (1, 2, 3)
        for i, c in enumerate([1, 2, 3, 1, 2, 3])
    ]
    (tmp_path / "02-rl" / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    p = pipeline_from_run(tmp_path)
    assert (p.prompts, p.group_size) == (2, 3)
    assert p.gen_per_token == pytest.approx(0.01) and p.gen_per_episode == pytest.approx(0.5)
    assert p.train_per_token == pytest.approx(0.002) and p.train_per_batch == pytest.approx(1.0)
    # characters scaled to each step's mean tokens: step 1 has 1, 2, 3 chars for a mean of 10 tokens
    assert sorted(set(p.lengths)) == [5, 10, 15, 20, 30, 40, 60]
    assert pipeline_from_run(tmp_path, workers=3, group_size=6).prompts == 1


def test_logged_lengths_keep_the_step_mean_and_the_length_limit():
    sampler = {"max_new_tokens": 8}
    rows = [
        {"completion": "abc", "stop": "length", "sampler": sampler},  # hit the limit: 8 tokens
        {"completion": "a", "stop": "eos", "sampler": sampler},  # 21 - 8 = 13 tokens left, by characters:
        {"completion": "abc", "stop": "eos", "sampler": sampler},  # 13/4 and 39/4, capped at the limit
    ]
    assert step_lengths(rows, 7.0) == [8, 3, 8]
    multi = {"completion": "ab", "stop": "length", "sampler": sampler, "episode": []}  # limit per turn
    assert step_lengths([multi, multi | {"completion": "a", "stop": "eos"}], 15.0) == [20, 10]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tokenizer):
    out = tmp_path_factory.mktemp("run") / "02-rl"
    config = RLConfig(steps=3, prompts_per_step=2, group_size=3, max_new_tokens=6, progress=False, seed=0)
    train_rl(build_preset("nano", tokenizer, seed=1), tokenizer, [FirstByteTask()], config, out)
    return out


def test_a_real_run_folder_is_read(tiny_run):
    metrics = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    p = pipeline_from_run(tiny_run.parent)  # the run's folder: its RL stage is found
    assert (p.prompts, p.group_size) == (2, 3)
    assert len(p.lengths) == 3 * 6  # log_rollouts (2) covers every group of the step
    # every episode logged with its recorded token count: the lengths are the run's, exactly
    assert statistics.fmean(p.lengths) == pytest.approx(
        statistics.fmean(r["response_length"] for r in metrics), abs=1e-9
    )
    # the fitted lines at the run's mean tokens per step give back its mean seconds (exactly for a
    # least-squares line with an intercept, nearly through the origin: the tokens hardly vary)
    tokens = statistics.fmean(r["response_length"] * 6 for r in metrics)
    sampling = statistics.fmean(r["time/sample"] for r in metrics)
    training = statistics.fmean(r["time/train"] + r["time/prepare"] for r in metrics)
    assert p.gen_per_token * tokens + p.gen_per_episode * 6 == pytest.approx(sampling, rel=0.1)
    assert p.train_per_token * tokens + p.train_per_batch == pytest.approx(training, rel=0.1)


def test_the_command_prints_inputs_and_a_row_per_schedule(tiny_run, capsys):
    assert (
        cli.main(["simulate", str(tiny_run), "--k", "0", "1", "2", "--steps", "6", "--contention", "1.5"])
        == 0
    )
    out = capsys.readouterr().out
    assert "batch: 2 prompts x 3 = 6 episodes" in out and "contention x1.5" in out
    labels = [line.split("  ")[0].strip() for line in out.splitlines() if line.startswith(("sync", "k="))]
    assert labels == [
        "sync",
        "k=1 det",
        "k=1 asap-keep",
        "k=1 asap-drop",
        "k=2 det",
        "k=2 asap-keep",
        "k=2 asap-drop",
    ]


def test_a_file_of_inputs_is_read_and_a_bad_field_named(tmp_path, capsys):
    good = tmp_path / "pipe.json"
    good.write_text(json.dumps({"prompts": 2, "group_size": 2, "lengths": [4, 8], "gen_per_token": 0.1}))
    assert cli.main(["simulate", str(good), "--k", "1", "--steps", "4"]) == 0
    assert "k=1 asap-drop" in capsys.readouterr().out
    yaml_file = tmp_path / "pipe.yaml"
    yaml_file.write_text("prompts: 2\ngroup_size: 2\nlengths: [4, 8]\ngen_per_token: 0.1\n")
    assert pipeline_from_file(yaml_file, workers=2) == pipeline_from_file(good, workers=2, slots=None)
    assert pipeline_from_file(yaml_file, workers=2).workers == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"prompts": 2, "group_size": 2, "lengths": [4], "gen_per_tokens": 0.1}))
    assert cli.main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:1: field 'gen_per_tokens': unknown field; did you mean 'gen_per_token'?" in err
    bad.write_text(json.dumps({"prompts": 2, "group_size": 2, "lengths": [4], "contention": 0.5}))
    assert cli.main(["simulate", str(bad)]) == 2
    assert (
        f"{bad}:1: field 'contention': contention must be a factor >= 1, got 0.5" in capsys.readouterr().err
    )
    assert cli.main(["simulate", str(good), "--workers", "0"]) == 2  # a bad flag is the command line's
    assert "command line:1: field 'workers': workers must be an integer >= 1" in capsys.readouterr().err
