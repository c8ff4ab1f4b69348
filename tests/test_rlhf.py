"""RLHF-PPO with a learned reward (issue 11 item 4): the KL penalty in the reward token by token
(by hand, and as verl's apply_kl_penalty and TRL's PPOTrainer build it), a reward model's scores
flowing through the reward plumbing, the gold verifier reward logged and never trained on at
weight 0, the recipe's refusals, the stage hash over the reward model's files, the monitors' gold
and the report's proxy-vs-gold figures."""

import json
from dataclasses import dataclass, replace

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from temper.algorithms.policy import kl_penalized_rewards
from temper.models import build_preset
from temper.models.presets import preset_config
from temper.rewards import monitors
from temper.rewards.reward_model import RewardModel
from temper.rollout.trajectory import Segment, Trajectory
from temper.tasks.base import Problem, Score
from temper.train.rl import RLConfig, train_rl
from temper.train.rl_update import policy_with_value, prepare
from temper.train.rollouts import batch_scores, grade_episodes, model_scorer
from test_bad_recipes import BASE, _dry_run  # noqa: E402  (tests/ is on sys.path)
from test_rl_update import _off_policy, _rollouts  # noqa: E402

F64 = torch.float64


# ---------------------------------------------------------------- KL in the reward, per token


def _ref_logprobs_by_hand(reference, prompts, completions_R_T, mask_R_T, temperature):
    """log ref(y_t | x, y_<t) of every completion token, one unpadded sequence at a time."""
    out = torch.zeros(completions_R_T.shape, dtype=F64)
    for r, prompt in enumerate(prompts):
        n = int(mask_R_T[r].sum())
        ids = torch.tensor([prompt + completions_R_T[r, :n].tolist()])
        logits = reference(input_ids=ids).logits[0].to(F64) / temperature
        logp = torch.log_softmax(logits, -1)
        for t in range(n):  # token t of the completion is predicted at position len(prompt) - 1 + t
            out[r, t] = logp[len(prompt) - 1 + t, completions_R_T[r, t]]
    return out


def _verl_apply_kl_penalty(scores_R, old_log_probs, ref_log_prob, response_mask, beta):
    """verl/trainer/ppo/ray_trainer.py apply_kl_penalty (kl_penalty="kl", i.e. k1) on the scores
    a reward manager puts at the last valid response token (NaiveRewardManager:
    reward_tensor[i, valid_response_length - 1] = score)."""
    token_level_scores = torch.zeros_like(old_log_probs)
    valid = response_mask.sum(-1).long()
    for i, n in enumerate(valid.tolist()):
        token_level_scores[i, n - 1] = scores_R[i]
    kld = (old_log_probs - ref_log_prob) * response_mask
    return token_level_scores - beta * kld


def _trl_ppo_rewards(scores_R, logprobs, ref_logprobs, response_mask, kl_coef):
    """TRL's PPOTrainer (trl <= 0.2x, `trl/trainer/ppo_trainer.py`, removed from TRL 1.x) with
    kl_estimator k1: logprobs past the response are INVALID_LOGPROB in both (their kl is 0), the
    score goes one position past the last response token when the row has room
    (`actual_end = sequence_lengths_p1` if < width, else `sequence_lengths`)."""
    INVALID_LOGPROB = 1.0
    padding_mask = ~response_mask.bool()
    logprobs = logprobs.masked_fill(padding_mask, INVALID_LOGPROB)
    ref_logprobs = ref_logprobs.masked_fill(padding_mask, INVALID_LOGPROB)
    kl = logprobs - ref_logprobs
    non_score_reward = -kl_coef * kl
    rewards = non_score_reward.clone()
    sequence_lengths = response_mask.sum(-1).long() - 1
    sequence_lengths_p1 = sequence_lengths + 1
    actual_start = torch.arange(rewards.size(0))
    actual_end = torch.where(sequence_lengths_p1 < rewards.size(1), sequence_lengths_p1, sequence_lengths)
    rewards[actual_start, actual_end] += scores_R
    return rewards


def test_kl_in_the_reward_token_by_token_matches_a_hand_computation_verl_and_trl(tokenizer):
    """kl_mode reward with gae: r_t = -beta (log pi_old(y_t) - log ref(y_t)) at every completion
    token, plus the sequence's score on its last token (InstructGPT eq. 2 per token); with gamma =
    lam = 1 and a zero value head the advantage of token t is sum_{t' >= t} r_t'."""
    beta, temperature = 0.05, 0.7
    config = RLConfig(
        advantage="gae", kl_mode="reward", kl_coef=beta, gamma=1.0, lam=1.0, whiten_advantages=False,
        temperature=temperature, max_new_tokens=6,
    )  # fmt: skip
    policy = build_preset("nano", tokenizer, seed=0).to(F64)
    reference = build_preset("nano", tokenizer, seed=3).to(F64).requires_grad_(False)
    module = policy_with_value(policy, config).to(F64)  # the value head starts at 0: V = 0 everywhere
    batch = _off_policy(module, _rollouts(G=2, N=3, seed=4, vocab=len(tokenizer)), noise=0.3)
    batch = replace(batch, rewards_G_N=torch.tensor([[0.3, -1.2, 2.0], [0.0, 0.7, -0.4]], dtype=F64))
    p = prepare(batch, module, reference, config)

    mask = batch.mask_R_T
    old = batch.old_logprobs_R_T.to(F64)
    with torch.no_grad():
        ref = _ref_logprobs_by_hand(reference, batch.prompts, batch.completions_R_T, mask, temperature)
    scores = batch.rewards_G_N.reshape(-1)
    R, T = mask.shape
    by_hand = torch.zeros(R, T, dtype=F64)
    for r in range(R):
        n = int(mask[r].sum())
        for t in range(n):
            by_hand[r, t] = -beta * (old[r, t] - ref[r, t]) + (scores[r] if t == n - 1 else 0.0)
    to_go = by_hand.flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(p.ref_kl, (old - ref) * mask)
    torch.testing.assert_close(p.advantages, to_go)
    torch.testing.assert_close(p.returns * mask, to_go)

    # the same token rewards as verl's apply_kl_penalty builds them, on identical tensors
    ours = kl_penalized_rewards(scores, p.ref_kl, mask, beta)
    torch.testing.assert_close(ours, by_hand)
    torch.testing.assert_close(ours, _verl_apply_kl_penalty(scores, old, p.ref_logp, mask.to(F64), beta))
    # TRL puts the score one token later (past the last response token): the same return from
    # every response token when gamma = 1 (one extra column so that every row has room)
    pad = lambda x: torch.cat([x, torch.zeros(R, 1, dtype=x.dtype)], -1)  # noqa: E731
    trl = _trl_ppo_rewards(scores, pad(old), pad(p.ref_logp), pad(mask), beta)
    trl_to_go = trl.flip(-1).cumsum(-1).flip(-1)[:, :T] * mask
    torch.testing.assert_close(trl_to_go, to_go)


def test_kl_in_the_reward_changes_the_advantages_by_minus_beta_k1():
    """The penalty is what makes the advantages differ from the unpenalized ones: beta = 0 gives
    the outcome alone, and the difference is exactly -beta x the k1 summed to go."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    kl = torch.tensor([[0.5, -0.2, 0.1], [0.3, 0.4, 9.0]], dtype=F64)
    scores = torch.tensor([1.0, -1.0], dtype=F64)
    with_kl = kl_penalized_rewards(scores, kl, mask, 0.1)
    without = kl_penalized_rewards(scores, kl, mask, 0.0)
    torch.testing.assert_close(
        with_kl - without, torch.tensor([[-0.05, 0.02, -0.01], [-0.03, -0.04, 0.0]], dtype=F64)
    )


# ---------------------------------------------------------------- a reward model as a component


def _reward_model(tokenizer, seed=0) -> RewardModel:
    config = preset_config("nano", tokenizer)
    config.num_labels = 1
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    return RewardModel(AutoModelForSequenceClassification.from_config(config).eval(), tokenizer.pad_token_id)


def _trajectory(prompt, completion, score):
    return Trajectory(
        [Segment(prompt, None, False), Segment(completion, [0.0] * len(completion), True, 0)],
        step_rewards=[0.0], signals=[{}], score=score, last_stop="eos",
    )  # fmt: skip


class CountingScorer:
    def __init__(self):
        self.calls = []

    def score(self, prompt_ids, completion_ids, batch_size=32):
        self.calls.append((prompt_ids, completion_ids))
        return [float(sum(p) + 10 * sum(c)) for p, c in zip(prompt_ids, completion_ids, strict=True)]


def test_batch_scores_call_each_scorer_once_per_round_and_split_by_group():
    right, wrong = Score(1.0, True, True, {}), Score(0.0, False, True, {})
    groups = [
        [_trajectory([1], [2], right), _trajectory([1], [3, 4], wrong)],
        [_trajectory([5], [6], wrong)],
    ]
    scorer = CountingScorer()
    out = batch_scores({"reward_model": scorer}, groups)
    assert len(scorer.calls) == 1 and scorer.calls[0] == ([[1], [1], [5]], [[2], [3, 4], [6]])
    assert out == [{"reward_model": [21.0, 71.0]}, {"reward_model": [65.0]}]


def test_a_reward_model_component_enters_the_reward_with_its_weight_and_the_gold_stays_in_the_score():
    problem = Problem("t", "train", "0", "q")
    right, wrong = Score(1.0, True, True, {}), Score(0.0, False, True, {})
    episodes = [_trajectory([1], [2], right), _trajectory([1], [3], wrong)]
    group = grade_episodes(
        problem,
        episodes,
        {"reward_model": 0.5, "outcome": 0.0},
        8,
        0,
        given=[{"reward_model": -2.0}, {"reward_model": 4.0}],
    )
    assert group.rewards == [-1.0, 2.0]
    assert [r.parts for r in group.rollouts] == [
        {"reward_model": -2.0, "outcome": 1.0},
        {"reward_model": 4.0, "outcome": 0.0},
    ]
    assert [r.score.reward for r in group.rollouts] == [1.0, 0.0]
    with pytest.raises(ValueError, match="'reward_model' needs its scorer"):
        grade_episodes(problem, episodes, {"reward_model": 1.0}, 8, 0)


@dataclass
class FirstByte:
    """Gold reward 1 when the completion's first character is below 'P' (or, inverted, at or above)."""

    inverted: bool = False
    name: str = "first_byte"

    def sample(self, split, n, seed):
        return [Problem(self.name, split, f"{seed}-{i}", f"q{(seed + i) % 7}") for i in range(n)]

    def score(self, problem, completion):
        ok = bool(completion) and (completion[0] < "P") != self.inverted
        return Score(float(ok), ok, bool(completion), {})

    def demonstration(self, problem):
        return "A"

    def corpus_text(self, problem):
        return problem.prompt


def _rlhf_run(tokenizer, tmp_path, task, outcome_weight):
    torch.manual_seed(0)
    model = build_preset("nano", tokenizer, seed=1)
    reference = build_preset("nano", tokenizer, seed=1).requires_grad_(False)
    config = RLConfig(
        steps=2, prompts_per_step=2, group_size=4, max_new_tokens=3, lr=1e-2, seed=0, progress=False,
        advantage="gae", kl_mode="reward", kl_coef=0.05,
        rewards={"reward_model": 1.0, "outcome": outcome_weight}, reward_model="rm",
    )  # fmt: skip
    result = train_rl(
        model, tokenizer, [task], config, tmp_path, reference=reference,
        scorers={"reward_model": model_scorer("reward_model", _reward_model(tokenizer))},
    )  # fmt: skip
    return model, result


def test_the_update_does_not_depend_on_the_gold_reward_at_outcome_weight_0(tokenizer, tmp_path):
    """Two runs whose verifiers disagree on every sample (one is the other inverted) train the same
    weights when the outcome's weight is 0, and log opposite gold rewards; at weight 0.5 they differ."""
    a, run_a = _rlhf_run(tokenizer, tmp_path / "a", FirstByte(), 0.0)
    b, run_b = _rlhf_run(tokenizer, tmp_path / "b", FirstByte(inverted=True), 0.0)
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y)
    for ra, rb in zip(run_a.history, run_b.history, strict=True):
        assert ra["reward/gold"] + rb["reward/gold"] == pytest.approx(1.0)  # every sample graded opposite
        assert ra["reward/reward_model"] == rb["reward/reward_model"] and ra["reward"] == rb["reward"]
        assert ra["reward/outcome"] == ra["reward/gold"]
    assert 0 < run_a.history[0]["reward/gold"] < 1  # the verifiers really did disagree
    assert "kl_ref" in run_a.history[-1] and "kl_ref_seq" in run_a.history[-1]
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/gold"] for r in rows] == [r["reward/gold"] for r in run_a.history]

    c, _ = _rlhf_run(tokenizer, tmp_path / "c", FirstByte(), 0.5)
    d, _ = _rlhf_run(tokenizer, tmp_path / "d", FirstByte(inverted=True), 0.5)
    assert any(
        not torch.equal(x, y) for x, y in zip(c.state_dict().values(), d.state_dict().values(), strict=True)
    )


def test_train_rl_refuses_a_reward_model_component_without_its_scorer(tokenizer, tmp_path):
    model = build_preset("nano", tokenizer, seed=1)
    config = RLConfig(
        steps=1, prompts_per_step=1, group_size=2, rewards={"reward_model": 1.0}, progress=False
    )
    with pytest.raises(ValueError, match="'reward_model' needs a scorer"):
        train_rl(model, tokenizer, [FirstByte()], config, tmp_path)


# ---------------------------------------------------------------- the recipe


RM_LINE = 18  # BASE's rl `train:` line


@pytest.mark.parametrize(
    ("train", "key", "message"),
    [
        (
            "{steps: 4, rewards: {reward_model: 1.0}}",
            "stages[2].train.rewards.reward_model",
            "needs a reward model",
        ),
        (
            "{steps: 4, rewards: {outcome: 1.0}, reward_model: rm}",
            "stages[2].train.reward_model",
            "is never used: no reward_model component",
        ),
        (
            "{steps: 4, rewards: {reward_model: 1.0}, reward_model: nowhere}",
            "stages[2].train.reward_model",
            "'nowhere' is neither an earlier reward_model stage [] nor a folder",
        ),
        (
            "{steps: 4, rewards: {reward_model: 1.0}, reward_model: sft}",
            "stages[2].train.reward_model",
            "stage 'sft' is a sft stage, not a reward_model stage",
        ),
        (
            "{steps: 4, rewards: {reward_model: 1.0}, reward_model: eval}",  # a later stage
            "stages[2].train.reward_model",
            "'eval' is neither an earlier reward_model stage",
        ),
    ],
)
def test_a_recipe_with_a_bad_reward_model_is_refused_at_its_key(tmp_path, capsys, train, key, message):
    lines = BASE.splitlines()
    lines[RM_LINE - 1] = f"    train: {train}"
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert _dry_run(path, tmp_path) == 2
    err = capsys.readouterr().err
    located = [
        row.strip() for row in err.splitlines() if row.strip().startswith(f"{path}:{RM_LINE}: {key}: ")
    ]
    assert any(message in row for row in located), err


def test_a_recipe_naming_a_reward_model_folder_passes(tmp_path, capsys):
    (tmp_path / "my_rm").mkdir()
    lines = BASE.splitlines()
    lines[RM_LINE - 1] = (
        "    train: {steps: 4, rewards: {reward_model: 1.0, outcome: 0.0}, reward_model: my_rm}"
    )
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert _dry_run(path, tmp_path) == 0, capsys.readouterr().err
    assert "reward model 'my_rm'" in capsys.readouterr().out


def test_the_stage_hash_covers_the_reward_models_files(tmp_path):
    from temper.recipe import parse_recipe
    from temper.runner import _stage_hash
    from temper.stages.context import StageContext

    rm = tmp_path / "rm_out" / "reward_model"
    rm.mkdir(parents=True)
    (rm / "model.safetensors").write_bytes(b"weights v1")
    (tmp_path / "policy").mkdir()
    text = (
        "name: h\nmodel: {path: policy}\ntasks: {arithmetic: {max_digits: 2}}\nstages:\n"
        "  - kind: rl\n    tasks: [arithmetic]\n"
        "    train: {steps: 2, rewards: {reward_model: 1.0}, reward_model: rm_out/reward_model}\n"
    )
    recipe = parse_recipe(text, base_dir=tmp_path)
    ctx = StageContext(run_dir=tmp_path / "run", base_dir=tmp_path, tasks={}, task_options=recipe.tasks)
    first = _stage_hash(recipe, 0, ctx)
    assert _stage_hash(recipe, 0, ctx) == first
    (rm / "model.safetensors").write_bytes(b"weights v2")
    second = _stage_hash(recipe, 0, ctx)
    assert second != first
    (rm / "extra.json").write_text("{}")
    assert _stage_hash(recipe, 0, ctx) not in (first, second)
    # an earlier stage's name means its folder's reward_model/, recorded by the runner
    named = parse_recipe(text.replace("rm_out/reward_model", "rm_out"), base_dir=tmp_path)
    ctx.stage_dirs["rm_out"] = tmp_path / "elsewhere"
    unseen = _stage_hash(named, 0, ctx)
    ctx.stage_dirs["rm_out"] = tmp_path / "rm_out"
    assert _stage_hash(named, 0, ctx) != unseen


# ---------------------------------------------------------------- monitors and report


def _rows(proxy, gold):
    return [
        {
            "step": i + 1,
            "reward": p,
            "reward/reward_model": p,
            "reward/gold": g,
            "accuracy": 0.5,
            "kl_ref_seq": 0.5 * i,
        }
        for i, (p, g) in enumerate(zip(proxy, gold, strict=True))
    ]


def test_the_monitors_judge_a_learned_reward_by_the_gold_reward():
    config = monitors.MonitorConfig(window=6, min_steps=4)
    rows = _rows([0.1, 0.3, 0.5, 0.7, 0.9, 1.1], [0.6, 0.55, 0.5, 0.4, 0.35, 0.3])
    kind, _, values = monitors.gold(rows)
    assert kind == "reward/gold" and values == [r["reward/gold"] for r in rows]
    out = monitors.step_monitors(rows[-1], rows[:-1], [1.0], [3], config)
    assert out["monitor/divergence/flag"] == 1 and out["monitor/divergence"] == pytest.approx(2.0, abs=0.05)
    assert out["monitor/component/reward/reward_model/flag"] == 1
    assert "monitor/component/reward/gold/flag" not in out  # the gold is no component
    honest = _rows([0.1, 0.3, 0.5, 0.7, 0.9, 1.1], [0.3, 0.35, 0.4, 0.5, 0.55, 0.6])
    assert monitors.step_monitors(honest[-1], honest[:-1], [1.0], [3], config)["monitor/divergence/flag"] == 0


def test_the_report_draws_proxy_and_gold_against_steps_and_sqrt_kl(tmp_path):
    from temper.report.rl import _proxy_gold, proxy_gold_kl_figure, rl_figure

    rows = _rows([0.1, 0.3, 0.5, 0.7], [0.6, 0.7, 0.65, 0.5])
    fig = proxy_gold_kl_figure(rows, "t")
    ax = fig.axes[0]
    (proxy,) = ax.lines
    assert proxy.get_linestyle() == "None"  # points: the KL of successive steps need not grow
    assert list(proxy.get_xdata()) == pytest.approx([(0.5 * i) ** 0.5 for i in range(4)])
    assert list(proxy.get_ydata()) == [0.1, 0.3, 0.5, 0.7]
    (gold,) = fig.axes[1].lines
    assert list(gold.get_ydata()) == [0.6, 0.7, 0.65, 0.5]
    assert (
        proxy_gold_kl_figure([{k: v for k, v in r.items() if k != "reward/gold"} for r in rows], "t") is None
    )
    full = rl_figure(rows, "t")
    titles = [a.get_ylabel() for a in full.axes]
    assert "reward model score" in titles and "gold reward" in titles
    assert _proxy_gold in [draw for draw, wants in __import__("temper.report.rl", fromlist=["PANELS"]).PANELS]


# ---------------------------------------------------------------- the stages end to end


MICRO = """\
name: micro_rlhf
model: {preset: nano, seed: 0}
tasks:
  arithmetic: {max_digits: 1, ood_digits: 2}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 300}
    max_len: 64
    train: {max_steps: 20, batch_size: 8, lr: 0.003, warmup_steps: 5, log_every: 5, progress: false}
  - kind: sft
    data: {tasks: [arithmetic], problems_per_task: 100, eval_problems: 8}
    train: {max_steps: 10, batch_size: 8, lr: 0.001, warmup_steps: 2, log_every: 5, progress: false}
  - kind: reward_model
    name: rm
    data: {files: [pairs.jsonl]}
    max_len: 64
    train: {max_steps: 4, batch_size: 4, warmup_steps: 0, progress: false}
  - kind: rl
    name: ppo
    tasks: [arithmetic]
    probe_groups: 2
    train:
      steps: 2
      prompts_per_step: 2
      group_size: 4
      max_new_tokens: 8
      advantage: gae
      kl_mode: reward
      kl_coef: 0.05
      rewards: {reward_model: 1.0, outcome: 0.0}
      reward_model: rm
      progress: false
"""


@pytest.mark.slow
def test_micro_rlhf_recipe_end_to_end(tmp_path, capsys):
    from temper.cli import main

    pairs = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}],
         "chosen": [{"role": "assistant", "content": f"Answer: {a + b}"}],
         "rejected": [{"role": "assistant", "content": f"Answer: {a + b + 1}"}]}
        for a in range(4) for b in range(4)
    ]  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    recipe = tmp_path / "micro.yaml"
    recipe.write_text(MICRO)
    run = tmp_path / "run"
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "04-ppo" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert {"reward/reward_model", "reward/gold", "reward/outcome", "kl_ref", "kl_ref_seq"} <= set(row)
        assert row["reward"] == pytest.approx(row["reward/reward_model"])  # outcome weight 0
    summary = json.loads((run / "04-ppo" / "rl.json").read_text())
    assert summary["reward_model"] == str(run / "03-rm" / "reward_model")
    assert summary["probe"]["groups"] == 2
    html = (run / "report.html").read_text()
    assert "proxy and gold vs sqrt KL" in html
    capsys.readouterr()
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0  # a rerun skips every stage
    assert "ppo: complete, skipped" in capsys.readouterr().err
