"""A process reward model as a dense RL reward: each step's score on the token that ends it
(`process_reward_model_mode: dense`, PPO/GAE), or the min / product of the step scores as one
outcome score per completion (any estimator)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from temper.models import build_preset
from temper.rewards.process_reward_model import PRM, ProcessRewardModel, TokenRewards, prm_scorer
from temper.rollout.sampler import Sample
from temper.stages.markers import stage_settings
from temper.tasks.base import Problem, Score
from temper.train.features.process_reward_model import ProcessRewardModelSpec
from temper.train.rl import RLConfig
from temper.train.rl_config import rl_rules
from temper.train.rl_update import backward_minibatch, loss_terms, policy_with_value, prepare
from temper.train.rollouts import grade_episodes, one_step, to_batch
from test_bad_recipes import BASE, _dry_run  # noqa: E402  (tests/ is on sys.path)
from test_rl_update import _grads, _rollouts  # noqa: E402

F64 = torch.float64
TEXT = "10-1=9, 9*8=72, 72/3=24\nAnswer: (10-1)*8/3"
# byte tokens: "10-1=9" ends at index 5, "9*8=72" at 13, "72/3=24" at 22; the answer step at the
# eos, the completion's last token
ENDS = [5, 13, 22, len(TEXT)]


class _PositionLogits(torch.nn.Module):
    """A stand-in PRM backbone + head whose logit at sequence position i is 0.1 i - 1: every
    step's score is known by hand, sigma(0.1 (len(prompt) + t) - 1) at completion token t."""

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the module a device

    def forward(self, input_ids, attention_mask):
        B, T = input_ids.shape
        z = 0.1 * torch.arange(T, dtype=torch.float32).expand(B, T) - 1.0
        return type("Out", (), {"logits": z[..., None]})()


def _sigma(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _episode(tokenizer, prompt: list[int], text: str, correct: bool):
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    sample = Sample(prompt, ids, [-0.1] * len(ids), text, "eos")
    return one_step(sample, Score(float(correct), correct, True, {}))


def _group(tokenizer, weights, mode="dense", texts=(TEXT, "3*8=24\nAnswer: 3*8"), correct=(True, False)):
    prompt = tokenizer.encode("Cards: 10 1 8 3", add_special_tokens=False)
    episodes = [_episode(tokenizer, prompt, t, c) for t, c in zip(texts, correct, strict=True)]
    problem = Problem("p", "general_points", "Cards: 10 1 8 3", {})
    prm = ProcessRewardModel(_PositionLogits(), tokenizer)
    (given,) = prm_scorer(prm, mode)([problem], [episodes])
    return grade_episodes(problem, episodes, weights, 64, 0, given=given), len(prompt)


def test_each_steps_score_sits_on_the_token_that_ends_the_step(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert [tokenizer.decode(ids[e]) for e in ENDS[:3]] == ["9", "2", "4"] and ENDS[3] == len(ids) - 1
    w = 0.5
    group, p = _group(tokenizer, {"outcome": 1.0, PRM: w})
    first = group.rollouts[0]
    by_hand = {e: w * _sigma(0.1 * (p + e) - 1) for e in ENDS}
    assert first.token_rewards == pytest.approx(by_hand)
    # the reward and the logged part are the return the steps add: outcome + w * sum of step scores
    assert first.parts[PRM] == pytest.approx(sum(by_hand.values()) / w)
    assert first.reward == pytest.approx(1.0 + sum(by_hand.values()))
    assert first.parts["prm_steps"] == 4 and first.parts["prm_min"] == pytest.approx(_sigma(0.1 * p - 0.5))
    # the second answer has one equation, "3*8=24" ending at index 5, and the answer step
    assert sorted(group.rollouts[1].token_rewards) == [5, len("3*8=24\nAnswer: 3*8")]

    batch = to_batch([group])
    expected = torch.zeros(batch.mask_R_T.shape)
    for r, rollout in enumerate(group.rollouts):
        for t, v in rollout.token_rewards.items():
            expected[r, t] = v
    torch.testing.assert_close(batch.token_rewards_R_T, expected)
    # the scalar reward is what is left: the outcome alone, so nothing is counted twice
    torch.testing.assert_close(batch.rewards_G_N, torch.tensor([[1.0, 0.0]]))


def test_gae_credits_each_step_with_its_reward_and_the_rest(tokenizer):
    """gamma = lam = 1, a zero value head, no whitening, no KL: the advantage of token t is the
    sum of every token reward from t on, the outcome included (on the last token)."""
    w = 0.5
    group, _ = _group(tokenizer, {"outcome": 1.0, PRM: w})
    config = RLConfig(advantage="gae", gamma=1.0, lam=1.0, whiten_advantages=False, max_new_tokens=64)
    module = policy_with_value(build_preset("nano", tokenizer, seed=0), config)
    batch = to_batch([group])
    p = prepare(batch, module, None, config)
    for r, rollout in enumerate(group.rollouts):
        n = len(rollout.trajectory.completion_ids)
        rewards = [rollout.token_rewards.get(t, 0.0) for t in range(n)]
        rewards[-1] += rollout.score.reward
        to_go = [sum(rewards[t:]) for t in range(n)]
        assert p.advantages[r, :n].tolist() == pytest.approx(to_go, abs=1e-5)
        assert rollout.reward == pytest.approx(sum(rewards))  # the logged reward is the return


def test_min_and_product_modes_give_one_outcome_score_and_no_token_rewards(tokenizer):
    dense, p = _group(tokenizer, {PRM: 1.0})
    steps = [v for _, v in sorted(dense.rollouts[0].token_rewards.items())]
    for mode, value in (("min", min(steps)), ("product", math.prod(steps))):
        group, _ = _group(tokenizer, {PRM: 1.0}, mode)
        assert group.rollouts[0].token_rewards == {}
        assert group.rollouts[0].reward == pytest.approx(value)
        assert to_batch([group]).token_rewards_R_T is None


def test_every_estimator_counts_token_rewards_once(tokenizer):
    """An outcome estimator sees outcome + the token rewards' sum; a turn estimator the same on
    turn 0 of a single-turn row; with the sum moved into the scalar reward, each gives the same."""
    from temper.algorithms.estimators import ESTIMATORS, AdvantageInputs

    g = torch.Generator().manual_seed(0)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, 3:] = False
    tokens = torch.rand(4, 5, generator=g, dtype=F64) * mask
    outcome = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)
    moved = outcome + tokens.sum(-1).reshape(2, 2)
    for name in ("grpo", "rloo", "dr_grpo", "turn_grpo", "turn_reinforce"):
        a, _ = ESTIMATORS[name](AdvantageInputs(outcome, mask, token_rewards_R_T=tokens))
        b, _ = ESTIMATORS[name](AdvantageInputs(moved, mask))
        torch.testing.assert_close(a, b, msg=name)


def _dense_batch(tokenizer, weight: float, outcome: float = 0.0):
    """A rollout batch of random completions whose outcome is constant, with PRM-like token rewards
    weight x u (u in [0, 1)) on a few tokens of each row."""
    batch = _rollouts(G=2, N=3, seed=5, vocab=len(tokenizer))
    g = torch.Generator().manual_seed(1)
    ends = (torch.rand(batch.mask_R_T.shape, generator=g) < 0.4) & batch.mask_R_T
    steps = torch.rand(batch.mask_R_T.shape, generator=g) * ends
    return replace(
        batch, rewards_G_N=torch.full_like(batch.rewards_G_N, outcome), token_rewards_R_T=weight * steps
    )


def _update_gradient(tokenizer, batch, config):
    torch.manual_seed(0)
    module = policy_with_value(build_preset("nano", tokenizer, seed=0), config).to(F64)
    p = prepare(batch, module, None, config)
    module.zero_grad(set_to_none=True)
    backward_minibatch(module, p, loss_terms(config, p), config, {})
    return p, _grads(module)


def test_dense_rewards_do_not_depend_on_the_micro_batch_split(tokenizer):
    config = RLConfig(advantage="gae", max_new_tokens=8, lam=0.9)
    batch = _dense_batch(tokenizer, 0.5)
    p, full = _update_gradient(tokenizer, batch, config)
    assert full.abs().max() > 1e-5
    for micro in (1, 2, 4):
        q, split = _update_gradient(tokenizer, batch, replace(config, micro_batch_size=micro))
        torch.testing.assert_close(q.advantages, p.advantages, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(split, full, rtol=1e-10, atol=1e-12)


def test_the_weight_moves_the_update(tokenizer):
    """Constant outcomes and a zero value head: with weight 0 there is nothing to learn (zero
    advantages, zero returns, a zero gradient); any weight > 0 moves the update, and two weights
    move it differently."""
    config = RLConfig(advantage="gae", max_new_tokens=8, whiten_advantages=False)
    _, none = _update_gradient(tokenizer, _dense_batch(tokenizer, 0.0), config)
    assert none.abs().max() == 0
    _, half = _update_gradient(tokenizer, _dense_batch(tokenizer, 0.5), config)
    _, one = _update_gradient(tokenizer, _dense_batch(tokenizer, 1.0), config)
    assert half.abs().max() > 1e-4 and (one - half).abs().max() > 1e-4


def test_the_rules_refuse_dense_step_rewards_without_gae():
    spec = ProcessRewardModelSpec("prm")
    config = RLConfig(steps=1, advantage="grpo", rewards={PRM: 1.0}, process_reward_model=spec)
    [(where, message)] = rl_rules(config)
    assert where == ("train", PRM, "mode") and "need a per-token estimator (advantage: gae)" in message
    assert rl_rules(replace(config, advantage="gae")) == []
    assert rl_rules(replace(config, process_reward_model=ProcessRewardModelSpec("prm", "min"))) == []


def test_a_multi_turn_episode_is_refused(tokenizer):
    from temper.rollout.trajectory import Segment, Trajectory

    t = Trajectory(
        [Segment([1, 2], None, False), Segment([3], [0.0], True, 0), Segment([4], None, False),
         Segment([5], [0.0], True, 1)],
        step_rewards=[0.0, 0.0], signals=[{}, {}],
    )  # fmt: skip
    prm = ProcessRewardModel(_PositionLogits(), tokenizer)
    with pytest.raises(ValueError, match="single-turn"):
        prm_scorer(prm)([Problem("p", "t", "", {})], [[t]])


def test_token_rewards_total():
    assert TokenRewards((1, 4), (0.25, 0.5)).total == 0.75


# ---------------------------------------------------------------- the recipe

RL_LINE = 18  # BASE's rl `train:` line
PRM_STAGE = """\
  - kind: process_reward_model
    name: prm
    source: sft
    data: {tasks: [general_points], prompts_per_task: 4, eval_prompts: 0, k: 2}
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}
"""


def _recipe(tmp_path, train: str, with_prm: bool = True):
    lines = BASE.replace(
        "  arithmetic: {max_digits: 2}", "  arithmetic: {max_digits: 2}\n  general_points: {}"
    )
    lines = lines.splitlines()
    rl = RL_LINE  # one line later: the general_points task
    lines[rl] = f"    train: {train}"
    if with_prm:
        lines[rl - 4 : rl - 4] = PRM_STAGE.rstrip("\n").splitlines()
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("train", "key", "message"),
    [
        ("{steps: 4, rewards: {process_reward_model: 1.0}, advantage: gae}", "train.rewards.process_reward_model", "needs a process reward model"),
        ("{steps: 4, rewards: {outcome: 1.0}, process_reward_model: {model: prm}}", "train.process_reward_model", "is never used"),
        (
            "{steps: 4, rewards: {process_reward_model: 1.0}, process_reward_model: {model: prm}}",
            "train.process_reward_model.mode",
            "dense step rewards need a per-token estimator (advantage: gae)",
        ),
        (
            "{steps: 4, rewards: {process_reward_model: 1.0}, process_reward_model: {model: sft}, advantage: gae}",
            "train.process_reward_model.model",
            "stage 'sft' is a sft stage, not a process_reward_model stage",
        ),
        (
            "{steps: 4, rewards: {process_reward_model: 1.0}, process_reward_model: {model: nowhere}, advantage: gae}",
            "train.process_reward_model.model",
            "'nowhere' is neither an earlier process_reward_model stage ['prm'] nor a folder",
        ),
        (  # the flat keys the block replaced: said at their line, with the new form
            "{steps: 4, rewards: {process_reward_model: 1.0}, process_reward_model: prm, process_reward_model_mode: min}",
            "train.process_reward_model_mode",
            "moved into the process_reward_model block: process_reward_model: {model: NAME, mode: dense | min | product}",
        ),
    ],
)  # fmt: skip
def test_a_bad_process_reward_model_is_refused_at_its_key(tmp_path, capsys, train, key, message):
    assert _dry_run(_recipe(tmp_path, train), tmp_path) == 2
    err = capsys.readouterr().err
    assert any(f".{key}: " in row and message in row for row in err.splitlines()), err


@pytest.mark.parametrize(
    "train",
    [
        "{steps: 4, rewards: {outcome: 1.0, process_reward_model: 0.5}, process_reward_model: {model: prm}, advantage: gae}",
        "{steps: 4, rewards: {process_reward_model: 1.0}, process_reward_model: {model: prm, mode: min}}",
    ],
)
def test_a_good_process_reward_model_passes_and_the_plan_names_it(tmp_path, capsys, train):
    assert _dry_run(_recipe(tmp_path, train), tmp_path) == 0, capsys.readouterr().err
    assert "process reward model 'prm'" in capsys.readouterr().out


def test_the_stage_hash_covers_the_prm_and_leaves_earlier_rl_stages_as_they_were(tmp_path):
    from temper.recipe import parse_recipe
    from temper.stages.registry import get

    plain = parse_recipe(_recipe(tmp_path, "{steps: 4}", with_prm=False).read_text(), base_dir=tmp_path)
    rl = plain.stages[2]
    # fields added after runs were recorded stay out of the hash at their defaults
    assert not {"process_reward_model", "process_reward_model_mode"} & set(stage_settings(rl)["train"])
    assert get("rl").uses(rl) == []
    text = _recipe(
        tmp_path,
        "{steps: 4, rewards: {process_reward_model: 1.0}, process_reward_model: {model: prm, mode: min}}",
    ).read_text()
    used = parse_recipe(text, base_dir=tmp_path).stages[3]
    # the block hashes as the flat keys it replaced did (runs recorded before it stay complete)
    settings = stage_settings(used)["train"]
    assert settings["process_reward_model"] == "prm" and settings["process_reward_model_mode"] == "min"
    dense = _recipe(
        tmp_path,
        "{steps: 4, rewards: {process_reward_model: 1.0}, process_reward_model: {model: prm}, advantage: gae}",
    ).read_text()
    settings = stage_settings(parse_recipe(dense, base_dir=tmp_path).stages[3])["train"]
    assert (
        settings["process_reward_model"] == "prm" and "process_reward_model_mode" not in settings
    )  # its default
    # a typed use: the recipe checks prm is a process_reward_model stage, the hash covers its files
    assert get("rl").uses(used) == [(("train", PRM, "model"), "prm", PRM)]


def test_the_experiment_adds_seed_copies_of_both_arms_before_the_eval():
    import sys
    from pathlib import Path

    import yaml

    sys.path.insert(0, str(Path(__file__).parents[1] / "experiments"))
    import prm_dense_reward  # noqa: E402  (experiments/, put on the path above)

    from temper.recipe import parse_recipe

    path = Path(__file__).parents[1] / "recipes" / "prm_dense_reward.yaml"
    data = yaml.safe_load(path.read_text())
    assert prm_dense_reward.seeded(data, [0]) == data  # seed 0 is the recipe as written
    seeded = prm_dense_reward.seeded(data, [0, 2])
    names = [s.get("name", s["kind"]) for s in seeded["stages"]]
    assert names[-3:] == ["ppo_outcome_s2", "ppo_prm_s2", "eval"]
    recipe = parse_recipe(yaml.safe_dump(seeded, sort_keys=False), base_dir=path.parent)
    twin, first = recipe.stages[names.index("ppo_prm_s2")], recipe.stages[names.index("ppo_prm")]
    assert twin.train.seed == 2 and first.train.seed == 0
    assert replace(twin.train, seed=0) == first.train  # nothing else differs
