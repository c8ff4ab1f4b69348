"""treasure_hunt as an environment task: disjoint map splits, BFS episodes through the agent loop
with their step rewards and signals, multi-turn SFT that never trains on observations, and an
agent-RL micro-run whose reward rises."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from fakes import Script  # tests/ is on the path (pytest rootdir mode)
from temper.catalog import make_task
from temper.data.chat import IGNORE, prompt_ids, tokenize_example
from temper.data.formats import Example
from temper.envs.treasure_hunt import GridMap
from temper.envs.treasure_task import INSTRUCTIONS, TreasureConfig, TreasureHuntTask, offset_text
from temper.models import build_preset
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.stages.sft import demonstrations
from temper.train.rl import RLConfig, train_rl


def small(**kw) -> TreasureHuntTask:
    return make_task("treasure_hunt", **({"train_maps": 40, "test_maps": 40, "ood_maps": 40} | kw))


def test_splits_are_disjoint_and_deterministic():
    task = small()
    train, test, ood = (set(task.map_seeds(s)) for s in ("train", "test", "ood"))
    assert train and test and ood
    assert not train & test and not train & ood and not test & ood
    seen = {p.data["seed"] for p in task.sample("train", 200, 0)}
    assert seen == train  # 200 draws with repeats cover all 40 (fewer where a map is too long)
    held = task.sample("test", 100, 0)
    assert len(held) == len(test) and len({p.id for p in held}) == len(held)  # no repeats
    assert [p.prompt for p in task.sample("test", 5, 3)] == [p.prompt for p in task.sample("test", 5, 3)]
    assert {len(p.data["rows"]) for p in task.sample("ood", 5, 0)} == {task.config.size + 2}
    assert all(len(p.data["path"]) <= p.data["max_steps"] for p in task.sample("ood", 40, 0))
    bare = small(instructions=False).sample("test", 1, 0)[0].prompt
    assert task.sample("test", 1, 0)[0].prompt == f"{INSTRUCTIONS}\n{bare}"
    with pytest.raises(ValueError, match="overlap"):
        TreasureConfig(train_maps=10, test_seed=5)


def test_offset_text():
    assert offset_text((1, 1), (3, 0)) == "d2 l1"
    assert offset_text((2, 0), (0, 4)) == "u2 r4"
    assert offset_text((2, 2), (2, 3)) == "r1"


def bfs_reply(text: str, j: int) -> str:
    """The scripted policy: the move the BFS path takes at the shown observation (looked up)."""
    last = text.rsplit("<|user|>", 1)[1].split("<|end|>")[0]
    return BFS_MOVES[last]


BFS_MOVES: dict[str, str] = {}


def test_a_bfs_policy_wins_through_the_agent_loop_with_step_rewards_and_signals(tokenizer):
    task = small()
    problem = task.sample("test", 1, 0)[0]
    path = problem.data["path"]
    conversation = task.demonstration_messages(problem)
    BFS_MOVES.clear()
    BFS_MOVES.update(
        {conversation[i]["content"]: conversation[i + 1]["content"] for i in range(0, len(conversation), 2)}
    )
    [[traj]] = run_episodes(
        Script(tokenizer, bfs_reply), tokenizer, [[task.make_env(problem)]], [0],
        EpisodeLimits(max_turns=task.max_turns, max_new_tokens=8),
    )  # fmt: skip
    assert traj.stop_reason == "done" and traj.turns == len(path)
    assert traj.messages == conversation  # the episode is the SFT demonstration, turn by turn
    assert traj.score.correct and traj.score.reward == 1.0 and traj.score.parsed
    assert traj.score.details == {"reason": "treasure", "steps": len(path), "invalid_moves": 0}
    assert traj.step_rewards == pytest.approx([0.1] * len(path))  # every BFS step gets closer
    flags = dict(closer=1, farther=0, bumped=0, invalid=0, trap=0, treasure=0)
    assert traj.signals[:-1] == [flags] * (len(path) - 1)
    assert traj.signals[-1] == flags | {"treasure": 1, "won_steps": len(path)}


def play(task: TreasureHuntTask, grid: str, moves: list[str]):
    env = task.make_env(task.problem_of(GridMap.parse(grid), "train", "m"))
    env.reset()
    return [env.step(m) for m in moves]


def test_bumps_invalid_moves_traps_and_the_step_limit():
    task = small(max_steps=4, progress=0.25)
    up, down, chat, right = play(task, "S.$\n#..", ["up", "down", "I think so", "right"])
    assert up.signals == dict(closer=0, farther=0, bumped=1, invalid=0, trap=0, treasure=0)  # the edge
    assert down.signals["bumped"] == 1 and down.reward == 0.0  # a wall
    assert chat.signals["invalid"] == 1 and chat.signals["bumped"] == 0 and chat.reward == 0.0
    assert right.done  # step 4 of 4: the limit
    assert right.signals["closer"] == 1 and right.reward == 0.25
    assert not right.score.correct and right.score.reward == 0.0 and not right.score.parsed
    assert right.score.details["reason"] == "step_limit" and right.score.details["invalid_moves"] == 1
    assert right.messages == []
    (left,) = play(task, ".S.$", ["left"])
    assert left.signals["farther"] == 1 and left.reward == -0.25 and not left.done
    assert left.messages == [{"role": "user", "content": "r3\n###\n#@.\n###"}]
    (trap,) = play(task, "S^\n.$", ["right"])
    assert trap.done and trap.signals["trap"] == 1 and trap.reward == 0.0
    assert trap.score.details["reason"] == "trap" and trap.score.parsed and not trap.score.correct


def test_sft_trains_every_move_and_never_an_observation(tokenizer):
    task = small()
    ctx = SimpleNamespace(tasks={"treasure_hunt": task})
    [example] = demonstrations(ctx, ["treasure_hunt"], "train", 1, 0)
    problem = task.sample("train", 1, 0)[0]
    assert example.messages == task.demonstration_messages(problem)
    assert [m["role"] for m in example.messages] == ["user", "assistant"] * len(problem.data["path"])
    tok = tokenize_example(tokenizer, example, 512)
    trained = "".join(
        tokenizer.decode([t], skip_special_tokens=False)
        for t, lab in zip(tok.input_ids, tok.labels)
        if lab != IGNORE
    )
    assert trained == "".join(f"{m}<|end|>" for m in problem.data["path"])
    assert task.score(problem, task.demonstration(problem)).correct  # the single-turn view agrees


class LineTask(TreasureHuntTask):
    """One map, `S.$`, for every split: the answer is always `right`, twice."""

    def sample(self, split, n, seed):
        return [self.problem_of(GridMap.parse("S.$"), split, f"line{i}") for i in range(n)]


def test_agent_rl_raises_the_reward_on_a_trivially_learnable_map(tokenizer, tmp_path):
    """A mechanism check that holds on every CPU: SFT on random moves until every sample is a
    well-formed move but `right` is no likelier than the other three (80 steps left half the
    samples garbled, and whether RL then learned anything depended on the CPU's rounding); then
    the policy's probability of opening with `right` (teacher-forced, not sampled) must rise from
    about 1/4 to most of the mass, and the sampled reward with it."""
    task = LineTask(TreasureConfig(max_steps=3))
    model = build_preset("nano", tokenizer, seed=1)
    torch.manual_seed(0)
    problem = task.sample("train", 1, 0)[0]
    rows = []
    for first, second in [("up", "right"), ("down", "left"), ("left", "up"), ("right", "down")]:
        env = task.make_env(problem)
        messages = env.reset() + [{"role": "assistant", "content": first}]
        messages += env.step(first).messages + [{"role": "assistant", "content": second}]
        rows.append(tokenize_example(tokenizer, Example("line", 1, messages=messages), 256))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(300):
        for row in rows:
            out = model(input_ids=torch.tensor([row.input_ids]), labels=torch.tensor([row.labels]))
            out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    prompt = prompt_ids(tokenizer, task.make_env(problem).reset())
    right = tokenizer.encode("right<|end|>", add_special_tokens=False)

    def logprob_of_right() -> float:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + right])).logits[0, len(prompt) - 1 : -1]
        return float(logits.log_softmax(-1).gather(1, torch.tensor(right)[:, None]).sum())

    before = logprob_of_right()
    assert -2.5 < before < -0.8, before  # about log 1/4: no move favoured yet
    config = RLConfig(
        steps=12, prompts_per_step=4, group_size=8, max_new_tokens=6, max_turns=3, max_episode_tokens=200, lr=1e-3, seed=0,
        progress=False, rewards={"outcome": 1.0, "process": 1.0},
    )  # fmt: skip
    result = train_rl(model, tokenizer, [task], config, tmp_path)
    rewards = [row["reward"] for row in result.history]
    assert logprob_of_right() > math.log(0.5), (before, logprob_of_right(), rewards)  # most of the mass
    assert sum(rewards[-3:]) > sum(rewards[:3]), rewards
