"""The agent loop: token-exact trajectories over multi-turn and inline-tool episodes, limits, and
single-turn tasks through `TaskEnv` sampling exactly what plain sampling gave."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from fakes import Script
from temper import guard
from temper.catalog import make_task
from temper.data.chat import prompt_ids, render_ids
from temper.envs.base import StepResult, TaskEnv
from temper.rollout import HFSampler
from temper.rollout.loop import EpisodeLimits, action_text, run_episodes
from temper.rollout.sampler import Sample
from temper.tasks.base import Score


class CodeEnv:
    """Inline tool: `<code>...</code>` is answered with `<interpreter>RESULT</interpreter>` in the
    same turn (here the 'interpreter' evaluates a product, no sandbox); the turn's end is graded."""

    stop = ("</code>",)

    def __init__(self):
        self.seen: list[str] = []

    def reset(self):
        return [{"role": "user", "content": "What is 6*7?"}]

    def step(self, action):
        self.seen.append(action)
        if action.endswith("</code>"):
            a, b = action[action.index("<code>") + 6 : -7].split("*")
            return StepResult(
                inline=f"<interpreter>{int(a) * int(b)}</interpreter>", signals={"tool_calls": 1}
            )
        right = action.strip().endswith("42")
        return StepResult(done=True, score=Score(float(right), right, True))


class WalkEnv:
    """Chat turns: each move is answered with a new user observation; the third action ends it.
    Step k's process reward is k / 10."""

    stop = ()

    def __init__(self, sleep: float = 0.0, fail: bool = False, hold: threading.Event | None = None):
        self.k, self.sleep, self.fail, self.hold = 0, sleep, fail, hold

    def reset(self):
        return [{"role": "system", "content": "walk"}, {"role": "user", "content": "at 0"}]

    def step(self, action):
        time.sleep(self.sleep)
        if self.hold is not None:  # hung until the test lets it go (a minute at most)
            self.hold.wait(60)
        if self.fail:
            raise RuntimeError("the env broke")
        self.k += 1
        if self.k == 3:
            return StepResult(done=True, reward=0.3, score=Score(1.0, True, True))
        return StepResult(messages=[{"role": "user", "content": f"at {self.k}"}], reward=self.k / 10)


def test_inline_tool_episode_is_token_exact(tokenizer):
    def reply(text, j):
        return "Answer: 42" if "<interpreter>" in text else "<code>6*7</code> ignored"

    env = CodeEnv()
    [[traj]] = run_episodes(
        Script(tokenizer, reply), tokenizer, [[env]], [5], EpisodeLimits(max_new_tokens=40)
    )
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = prompt_ids(tokenizer, [{"role": "user", "content": "What is 6*7?"}])
    assert [s.token_ids for s in traj.segments] == [
        prompt,
        enc("<code>6*7</code>"),
        enc("<interpreter>42</interpreter>"),
        enc("Answer: 42") + [tokenizer.eos_token_id],
    ]
    assert [s.trainable for s in traj.segments] == [False, True, False, True]
    assert [s.turn for s in traj.segments] == [-1, 0, -1, 1]
    n1, n2, n3 = (len(s.token_ids) for s in traj.segments[1:])
    assert traj.trainable_mask == [True] * n1 + [False] * n2 + [True] * n3
    assert traj.token_turns == [0] * n1 + [-1] * n2 + [1] * n3
    # the sampler's logprobs kept verbatim at policy tokens, 0 at environment tokens
    assert traj.completion_logprobs == [-(t + 1) / 100 for t in range(n1)] + [0.0] * n2 + [
        -(t + 1) / 100 for t in range(n3)
    ]
    assert env.seen == ["<code>6*7</code>", "Answer: 42"]  # the action includes the stop string
    assert traj.stop_reason == "done" and traj.score.correct and traj.turns == 2
    assert traj.signals == [{"tool_calls": 1}, {}]
    assert traj.messages[-1] == {
        "role": "assistant",
        "content": "<code>6*7</code><interpreter>42</interpreter>Answer: 42",
    }


def test_three_turn_chat_episode_masks_every_environment_token(tokenizer):
    moves = {"at 0": "left", "at 1": "up", "at 2": "down"}

    def reply(text, j):
        last_user = text.rsplit("<|user|>", 1)[1].split("<|end|>")[0]
        return moves[last_user]

    [[traj]] = run_episodes(Script(tokenizer, reply), tokenizer, [[WalkEnv()]], [1], EpisodeLimits())
    conversation = [
        {"role": "system", "content": "walk"},
        {"role": "user", "content": "at 0"},
        {"role": "assistant", "content": "left"},
        {"role": "user", "content": "at 1"},
        {"role": "assistant", "content": "up"},
        {"role": "user", "content": "at 2"},
        {"role": "assistant", "content": "down"},
    ]
    assert traj.messages == conversation
    full = render_ids(tokenizer, conversation, add_generation_prompt=False)
    ids = traj.prompt_ids + traj.completion_ids
    assert ids == full  # the segments are exactly the template's rendering
    # token by token: trained exactly on the assistant contents and their end-of-turn token
    trained = [
        tokenizer.decode([t], skip_special_tokens=False)
        for t, m in zip(traj.completion_ids, traj.trainable_mask)
        if m
    ]
    assert "".join(trained) == "left<|end|>up<|end|>down<|end|>"
    env_text = tokenizer.decode(
        [t for t, m in zip(traj.completion_ids, traj.trainable_mask) if not m], skip_special_tokens=False
    )
    assert env_text == "<|user|>at 1<|end|><|assistant|><|user|>at 2<|end|><|assistant|>"
    assert [s.turn for s in traj.segments if s.trainable] == [0, 1, 2]
    assert traj.step_rewards == [0.1, 0.2, 0.3]


def test_limits_end_episodes_with_their_reason(tokenizer):
    script = Script(tokenizer, lambda text, j: "left")
    [[a, b]] = run_episodes(script, tokenizer, [[WalkEnv(), WalkEnv()]], [0], EpisodeLimits(max_turns=2))
    assert a.stop_reason == b.stop_reason == "max_turns" and a.turns == 2 and a.score is None
    [[c]] = run_episodes(script, tokenizer, [[WalkEnv()]], [0], EpisodeLimits(max_tokens=12))
    assert c.stop_reason == "max_tokens" and len(c.completion_ids) >= 12
    long = Script(tokenizer, lambda text, j: "x" * 30)
    [[d]] = run_episodes(long, tokenizer, [[WalkEnv()]], [0], EpisodeLimits(max_new_tokens=8))
    assert d.stop_reason == "length" and d.policy_tokens == 8


def test_a_hung_or_broken_env_ends_its_episode_not_the_batch(tokenizer):
    script = Script(tokenizer, lambda text, j: "left")
    hold = threading.Event()
    t0 = time.perf_counter()
    try:
        [[slow, fine], [broken]] = run_episodes(
            script,
            tokenizer,
            [[WalkEnv(hold=hold), WalkEnv()], [WalkEnv(fail=True)]],
            [0, 1],
            EpisodeLimits(step_timeout=0.3),
        )
        # the batch did not wait for the hung step (a minute): the bound only tells waiting from not
        # waiting, generous so that a busy machine passes it
        assert time.perf_counter() - t0 < 30
    finally:
        hold.set()  # the abandoned step ends here, not in a later test that counts user-code threads
        for t in guard.user_threads():
            t.join(10)
    assert slow.stop_reason == "timeout" and slow.score is None
    assert fine.stop_reason == "done" and fine.score.correct
    assert broken.stop_reason == "env_error" and "the env broke" in broken.signals[-1]["error"]


def test_round_zero_samples_a_group_once_with_its_seed_then_each_episode_alone(tokenizer):
    script = Script(tokenizer, lambda text, j: "left")
    run_episodes(script, tokenizer, [[WalkEnv(), WalkEnv()], [WalkEnv(), WalkEnv()]], [7, 8], EpisodeLimits())
    first, second = script.calls[0], script.calls[1]
    assert (first["prompts"], first["n"], first["seed"]) == (2, 2, [7, 8])
    assert (second["prompts"], second["n"]) == (4, 1) and len(set(second["seed"])) == 4
    assert set(script.calls[2]["seed"]).isdisjoint(second["seed"])  # a new seed every round


def test_action_text_keeps_the_stop_string(tokenizer):
    ids = tokenizer.encode("<code>1</code>\n", add_special_tokens=False)
    sample = Sample([1], ids, [0.0] * len(ids), "<code>1", "stop")
    assert action_text(sample, tokenizer, ["</code>"]) == "<code>1</code>"
    assert action_text(Sample([1], ids, [0.0] * len(ids), "abc", "eos"), tokenizer, ["</code>"]) == "abc"


def test_single_turn_task_through_task_env_samples_what_plain_sampling_gave(nano, tokenizer):
    """The refactor's promise: a Task run as one-step TaskEnvs gets the very samples (ids and
    logprobs) the RL loop drew before environments existed, and the task's grades."""
    task = make_task("arithmetic")
    problems = task.sample("train", 3, seed=0)
    sampler = HFSampler(nano, tokenizer)
    seeds = [11, 12, 13]
    plain = sampler.sample(
        [prompt_ids(tokenizer, p.messages()) for p in problems],
        4,
        max_new_tokens=12,
        temperature=1.0,
        seed=seeds,
    )
    torch.manual_seed(123)  # the loop must not depend on global RNG state either
    trajs = run_episodes(
        sampler,
        tokenizer,
        [[TaskEnv(task, p) for _ in range(4)] for p in problems],
        seeds,
        EpisodeLimits(max_new_tokens=12),
    )
    for group, samples, problem in zip(trajs, plain, problems, strict=True):
        for traj, s in zip(group, samples, strict=True):
            assert traj.completion_ids == s.token_ids and traj.completion_logprobs == s.logprobs
            assert traj.score == task.score(problem, s.text)
            assert traj.stop_reason == "done" and traj.truncated == (s.stop_reason == "length")


@pytest.mark.parametrize("bad", [[1], [1, 2, 3]])
def test_seeds_must_match_groups(tokenizer, bad):
    with pytest.raises(ValueError, match="seeds"):
        run_episodes(
            Script(tokenizer, lambda t, j: "x"), tokenizer, [[WalkEnv()], [WalkEnv()]], bad, EpisodeLimits()
        )


def test_multi_turn_batch_scores_exactly_the_policy_tokens(tokenizer):
    """to_batch + pack on a 3-turn episode: the packed forward gives, at every policy token, the
    logprob a plain forward of the whole conversation gives there, and nothing at environment tokens."""
    from temper.models import build_preset
    from temper.tasks.base import Problem
    from temper.train.rl_update import PolicyWithValue, Prepared, forward_rows
    from temper.train.rollouts import grade_episodes, to_batch

    moves = {"at 0": "left", "at 1": "up", "at 2": "down"}
    script = Script(tokenizer, lambda text, j: moves[text.rsplit("<|user|>", 1)[1].split("<|end|>")[0]])
    short = Script(tokenizer, lambda text, j: "<code>2*3</code>")
    [[walk]] = run_episodes(script, tokenizer, [[WalkEnv()]], [0], EpisodeLimits())
    [[single]] = run_episodes(short, tokenizer, [[CodeEnv()]], [0], EpisodeLimits(max_turns=1))
    problem = Problem("walk", "train", "0", "walk")
    group = grade_episodes(problem, [walk, single], {"outcome": 1.0, "process": 0.5}, 48, 0)
    assert group.rewards == [1.0 + 0.5 * 0.6, 0.0]  # outcome + 0.5 x (0.1 + 0.2 + 0.3); max_turns: 0
    assert group.rollouts[1].stop == "max_turns" and group.rollouts[1].score.details["reason"] == "max_turns"
    batch = to_batch([group])
    # the process part goes per turn (weighted), the rest stays the row's reward
    assert torch.allclose(batch.rewards_G_N, torch.tensor([[1.0, 0.0]]))
    assert torch.allclose(batch.step_rewards_R_K, torch.tensor([[0.05, 0.1, 0.15], [0.0, 0.0, 0.0]]))
    assert batch.turns_R.tolist() == [3, 1]
    assert batch.mask_R_T[0].tolist()[: len(walk.completion_ids)] == walk.trainable_mask
    assert batch.turn_R_T[0].tolist()[: len(walk.completion_ids)] == walk.token_turns
    assert batch.turn_R_T[1].tolist() == [0] * single.policy_tokens + [-1] * (
        batch.mask_R_T.shape[1] - single.policy_tokens
    )

    model = build_preset("nano", tokenizer, seed=0).double()
    module = PolicyWithValue(model)
    p = Prepared(batch.prompts, batch.completions_R_T, batch.mask_R_T, batch.old_logprobs_R_T, *[None] * 5)
    out, _ = forward_rows(module, p)
    for r, t in enumerate([walk, single]):
        ids = torch.tensor([t.prompt_ids + t.completion_ids])
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
        want = logp[len(t.prompt_ids) - 1 :].gather(-1, ids[0, len(t.prompt_ids) :, None]).squeeze(-1)
        n = len(t.completion_ids)
        mask = batch.mask_R_T[r, :n]
        assert torch.allclose(out.logp[r, :n][mask], want[mask], atol=1e-10)
        assert (out.logp[r, :n][~mask] == 0).all()


def test_turn_credit_flows_from_episodes_to_token_advantages(tokenizer):
    """prepare() on a batch of multi-turn episodes: turn_reinforce credits each turn with its own
    return minus the group's mean return at that turn index; environment tokens get nothing."""
    from temper.models import build_preset
    from temper.tasks.base import Problem
    from temper.train.rl_config import RLConfig
    from temper.train.rl_update import PolicyWithValue, prepare
    from temper.train.rollouts import grade_episodes, to_batch

    moves = {"at 0": "left", "at 1": "up", "at 2": "down"}
    script = Script(tokenizer, lambda text, j: moves[text.rsplit("<|user|>", 1)[1].split("<|end|>")[0]])
    [[a, b]] = run_episodes(script, tokenizer, [[WalkEnv(), WalkEnv()]], [0], EpisodeLimits())
    [[c, d]] = run_episodes(script, tokenizer, [[WalkEnv(), WalkEnv()]], [0], EpisodeLimits(max_turns=2))
    problem = Problem("walk", "train", "0", "walk")
    # group: a full episode (outcome 1, steps .1 .2 .3) and one cut at 2 turns (steps .1 .2, outcome 0)
    group = grade_episodes(problem, [a, c], {"outcome": 1.0, "process": 1.0}, 48, 0)
    config = RLConfig(advantage="turn_reinforce", group_size=2)
    p = prepare(to_batch([group]), PolicyWithValue(build_preset("nano", tokenizer, seed=0)), None, config)
    # returns: a = [1.6, 1.5, 1.3], c = [0.3, 0.2]; turn means [0.95, 0.85]; turn 2 has one row (0)
    want = {0: [0.65, 0.65, 0.0], 1: [-0.65, -0.65]}
    for r, t in enumerate([a, c]):
        n = len(t.completion_ids)
        for k, value in enumerate(want[r]):
            at = torch.tensor([x == k for x in t.token_turns])
            assert torch.allclose(p.advantages[r, :n][at], torch.tensor(value), atol=1e-6)
        env = torch.tensor([x == -1 for x in t.token_turns])
        assert (p.advantages[r, :n][env] == 0).all()


def test_groups_whose_environment_failed_are_left_out_of_training_not_rewarded_zero(tokenizer):
    from temper.tasks.base import Problem
    from temper.train.rl import collect_groups
    from temper.train.rl_config import RLConfig

    class Walks:
        name = "walks"

        def sample(self, split, n, seed):
            return [Problem("walks", split, str(i), "walk") for i in range(n)]

        def make_env(self, problem):
            return WalkEnv(fail=problem.id == "1")

    script = Script(tokenizer, lambda text, j: "left")
    config = RLConfig(prompts_per_step=3, group_size=2, max_new_tokens=8, rewards={"outcome": 1.0})
    groups, stats = collect_groups(script, tokenizer, [Walks()], config, step=0)
    assert [g.rollouts[0].problem.id for g in groups] == ["0", "2"]
    assert stats["env_failed_groups"] == 1
    assert all(r.stop == "eos" and r.score.correct for g in groups for r in g.rollouts)


def test_a_template_that_rewrites_history_ends_the_episode_instead_of_misaligning(tokenizer):
    import copy

    rewriting = copy.deepcopy(tokenizer)
    # earlier assistant turns rendered upper-cased: not what was sampled (as templates that drop
    # past reasoning do)
    rewriting.chat_template = tokenizer.chat_template.replace(
        "{% if m['content'] %}{{ m['content'] }}{% endif %}",
        "{% if m['content'] %}{{ m['content'] | upper }}{% endif %}",
    )
    assert rewriting.chat_template != tokenizer.chat_template
    script = Script(rewriting, lambda text, j: "left")
    [[t]] = run_episodes(script, rewriting, [[WalkEnv()]], [0], EpisodeLimits())
    assert (
        t.stop_reason == "not_prefix" and t.turns == 1 and "re-renders the history" in t.signals[-1]["error"]
    )
    assert len(t.segments) == 2  # nothing appended after the mismatch


def test_environment_time_is_each_episodes_own(tokenizer):
    script = Script(tokenizer, lambda text, j: "left")
    [[slow, fast]] = run_episodes(script, tokenizer, [[WalkEnv(sleep=0.5), WalkEnv()]], [0], EpisodeLimits())
    assert slow.seconds_in_env >= 1.5  # three steps of 0.5 s
    # stepped in parallel: not charged the slow one's 1.5 s (a second of slack for a busy machine)
    assert fast.seconds_in_env < 1.0


def test_a_chat_tool_call_episode_renders_tools_and_never_trains_on_the_result(tokenizer):
    """ToolEnv through the loop: the tools are in the prompt (the template's system part), the
    call is the policy's, the `tool` turn is the environment's, the answer is graded."""
    from temper.envs.tool_env import ToolEnv
    from temper.tools.calls import ToolRegistry

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first addend
            b: the second addend
        """
        return a + b

    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    env = ToolEnv(
        [{"role": "user", "content": "2+3?"}],
        ToolRegistry([add]),
        lambda answer: Score(1.0, "5" in answer, True),
    )

    def reply(text, j):
        return "It is 5." if "<|tool|>" in text else call

    [[t]] = run_episodes(Script(tokenizer, reply), tokenizer, [[env]], [0], EpisodeLimits(max_new_tokens=96))
    assert t.stop_reason == "done" and t.score.correct and t.turns == 2
    assert '"name": "add"' in tokenizer.decode(t.prompt_ids)  # the schema reached the prompt
    text = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    assert [text(s.token_ids) for s in t.segments[1:]] == [
        call + "<|end|>",
        "<|tool|>5<|end|><|assistant|>",
        "It is 5.<|end|>",
    ]
    assert [s.trainable for s in t.segments[1:]] == [True, False, True]
    assert t.signals[0] == {"tool_calls": 1, "tool_errors": 0}


def test_a_turn_with_a_stray_special_token_is_the_policys_failure_not_the_templates(tokenizer):
    """The policy wrote a special token inside its turn: no template renders that back, so the
    episode ends as "bad_tokens" (graded 0 and trained on), not "not_prefix" (left out)."""
    from temper.tasks.base import Problem
    from temper.train.rl import collect_groups
    from temper.train.rl_config import RLConfig

    # sample 0 of the first turn writes the stray token; every other turn is clean
    script = Script(
        tokenizer, lambda text, j: "le<|user|>ft" if j == 0 and text.count("<|assistant|>") == 1 else "left"
    )
    assert tokenizer.convert_tokens_to_ids("<|user|>") in script._one([1], "le<|user|>ft", 48, ()).token_ids
    [[bad, good]] = run_episodes(script, tokenizer, [[WalkEnv(), WalkEnv()]], [0], EpisodeLimits())
    assert bad.stop_reason == "bad_tokens" and "round trip" in bad.signals[-1]["error"]
    assert good.stop_reason == "done"

    class Walks:
        name = "walks"

        def sample(self, split, n, seed):
            return [Problem("walks", split, str(i), "walk") for i in range(n)]

        def make_env(self, problem):
            return WalkEnv()

    config = RLConfig(prompts_per_step=1, group_size=2, max_new_tokens=8, rewards={"outcome": 1.0})
    groups, stats = collect_groups(script, tokenizer, [Walks()], config, step=0)
    assert "env_failed_groups" not in stats and [r.reward for r in groups[0].rollouts] == [0.0, 1.0]


def test_mean_signals_sums_each_episode_then_averages_and_skips_strings():
    from temper.rollout.trajectory import Segment, Trajectory, mean_signals

    a = Trajectory(
        [Segment([1], None, False)],
        signals=[{"tool_calls": 1, "tier": "bwrap"}, {"tool_calls": 1, "ok": True}],
    )
    b = Trajectory([Segment([1], None, False)], signals=[{"tool_calls": 0, "errors": 0.5}])
    assert mean_signals([a, b]) == {"errors": 0.25, "ok": 0.5, "tool_calls": 1.0}


class CutWalkEnv(WalkEnv):
    """A WalkEnv with `cut`: records the reasons it was asked for and answers one signal."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.cuts: list[str] = []

    def step(self, action):
        result = super().step(action)
        result.signals = {"walked": 1}
        return result

    def cut(self, reason):
        self.cuts.append(reason)
        return {"kept_rules": 1, "walked": 10}


def test_an_episode_the_loop_ends_asks_the_env_for_its_end_signals_once(tokenizer):
    script = Script(tokenizer, lambda text, j: "left")
    envs = [CutWalkEnv(), CutWalkEnv(), CutWalkEnv()]
    [[turns], [tokens], [done]] = run_episodes(
        script, tokenizer, [[envs[0]], [envs[1]], [envs[2]]], [0, 1, 2], EpisodeLimits(max_turns=2)
    )
    assert turns.stop_reason == "max_turns" and envs[0].cuts == ["max_turns"]
    # added to the last step's signals: the rewards stay one per step
    assert turns.signals == [{"walked": 1}, {"walked": 11, "kept_rules": 1}] and len(turns.step_rewards) == 2
    assert turns.score is None
    long = Script(tokenizer, lambda text, j: "x" * 30)
    env = CutWalkEnv()
    [[cut]] = run_episodes(long, tokenizer, [[env]], [0], EpisodeLimits(max_new_tokens=8))
    assert cut.stop_reason == "length" and env.cuts == ["length"]
    env = CutWalkEnv()
    [[budget]] = run_episodes(script, tokenizer, [[env]], [0], EpisodeLimits(max_tokens=12))
    assert budget.stop_reason == "max_tokens" and env.cuts == ["max_tokens"]
    # an env that ended its own episode, failed or hung is not asked
    hold = threading.Event()
    env, broken, slow = CutWalkEnv(), CutWalkEnv(fail=True), CutWalkEnv(hold=hold)
    try:
        [[own], [bad], [hung]] = run_episodes(
            script, tokenizer, [[env], [broken], [slow]], [0, 1, 2], EpisodeLimits(step_timeout=0.3)
        )
    finally:
        hold.set()  # the abandoned step ends with this test, not in a later one
        for t in guard.user_threads():
            t.join(10)
    assert (own.stop_reason, bad.stop_reason, hung.stop_reason) == ("done", "env_error", "timeout")
    assert env.cuts == broken.cuts == slow.cuts == []


class CompactingEnv:
    """Rewrites its history after the first move (the system turn dropped, the question
    summarised), then extends that history as it is; the third move ends it."""

    stop = ()

    def __init__(self, bad: bool = False):
        self.k, self.bad, self.history = 0, bad, []

    def reset(self):
        return [{"role": "system", "content": "walk"}, {"role": "user", "content": "at 0"}]

    def step(self, action):
        self.k += 1
        if self.k == 3:
            return StepResult(done=True, score=Score(1.0, True, True))
        if self.k == 1:
            self.history = [{"role": "user", "content": "summary: at 0"}]
        self.history += [
            {"role": "assistant", "content": action},
            {"role": "user", "content": f"at {self.k}"},
        ]
        return StepResult(history=["not a message"] if self.bad else list(self.history))


def test_a_rewritten_history_starts_a_row_and_an_extended_one_stays_in_it(tokenizer):
    """The first history does not extend the tokens: a new row whose prompt is its rendering; the
    second extends the new row: its tokens are appended there. The token budget counts each row's
    tokens after its prompt (a budget of exactly those is not exceeded)."""
    moves = {"at 0": "left", "at 1": "up", "at 2": "down"}

    def reply(text, j):
        return moves[text.rsplit("<|user|>", 1)[1].split("<|end|>")[0]]

    script = Script(tokenizer, reply)
    [[traj]] = run_episodes(script, tokenizer, [[CompactingEnv()]], [1], EpisodeLimits())
    assert traj.stop_reason == "done" and traj.turns == 3
    first, second = traj.rows
    assert [s.trainable for s in first.segments] == [False, True]
    assert [(s.trainable, s.starts_row) for s in second.segments] == [
        (False, True), (True, False), (False, False), (True, False)
    ]  # fmt: skip
    history = [
        {"role": "user", "content": "summary: at 0"},
        {"role": "assistant", "content": "left"},
        {"role": "user", "content": "at 1"},
    ]
    assert second.prompt_ids == prompt_ids(tokenizer, history)
    assert second.prompt_ids + second.completion_ids == render_ids(
        tokenizer, [*history, {"role": "assistant", "content": "up"}, {"role": "user", "content": "at 2"},
                    {"role": "assistant", "content": "down"}], add_generation_prompt=False,
    )  # fmt: skip
    assert traj.completion_ids == first.completion_ids + second.completion_ids
    [[exact]] = run_episodes(
        script, tokenizer, [[CompactingEnv()]], [1], EpisodeLimits(max_tokens=len(traj.completion_ids))
    )
    assert exact.stop_reason == "done" and exact.completion_ids == traj.completion_ids
    [[bad]] = run_episodes(script, tokenizer, [[CompactingEnv(bad=True)]], [1], EpisodeLimits())
    assert bad.stop_reason == "env_error" and "a history that is not a list" in bad.error
    with pytest.raises(ValueError, match="no messages, inline text or done"):
        StepResult(history=[], done=True)
