"""A context budget in the agent loop (`temper.rollout.context`): truncation and self-summaries
split an episode into rows at exact tokens, the summary is trained in the row that sampled it and
never sent to the env, every row gets the episode's one advantage, the env's grade of a summary
becomes the `summary` reward component, and memory_corridor's demonstrations have the shape the
loop builds."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from fakes import Script
from temper import guard
from temper.catalog import make_task
from temper.data.chat import prompt_ids
from temper.envs.base import StepResult
from temper.rewards.components import RewardInput, combine
from temper.rollout.context import ContextPolicy, head, summarised, summary_request, truncated
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.tasks.base import Score

TASK = {"role": "user", "content": "Walk to 4 and say the word."}
SYSTEM = {"role": "system", "content": "sys"}


class LongWalk:
    """Shows a word once (after the first action), then one long observation per step; the fifth
    action is graded: right when it is the word. Grades summaries (1 when one holds the word)."""

    stop = ()

    def __init__(self, policy: ContextPolicy, word: str = "plum", grade_fails: str = ""):
        self.context_budget, self.word, self.grade_fails = policy, word, grade_fails
        self.k, self.seen, self.graded = 0, [], []

    def reset(self):
        return [SYSTEM, TASK]

    def step(self, action):
        self.seen.append(action)
        self.k += 1
        if self.k == 5:
            right = action.strip() == self.word
            return StepResult(done=True, score=Score(float(right), right, True))
        shown = f"The word is {self.word}. " if self.k == 1 else ""
        return StepResult(messages=[{"role": "user", "content": f"{shown}at {self.k} " + "." * 20}])

    def summary_reward(self, text):
        self.graded.append(text)
        if self.grade_fails == "raise":
            raise RuntimeError("grader broke")
        if self.grade_fails == "hang":
            time.sleep(5)
        if self.grade_fails == "nan":
            return float("nan")
        return float(self.word in text)


def walker(keep: bool):
    """Walks; asked for a note, keeps the word (keep) or not; at 4 says the word it can still see."""

    def reply(text, j):
        last = text.rsplit("<|user|>", 1)[-1]
        if last.startswith("Note?"):
            seen = re.findall(r"word is (\w+)|note: (\w+)", text)
            return f"note: {seen[-1][0] or seen[-1][1]}" if keep and seen else "note: walking"
        if last.startswith("at 4"):
            seen = re.findall(r"word is (\w+)|note: (\w+)", text)
            return (seen[-1][0] or seen[-1][1]) if seen else "no idea"
        return "walk"

    return reply


def compactions(t) -> float:
    """The episode's `compactions` signal: the loop counts each truncation or summary there."""
    return sum(s.get("compactions", 0) for s in t.signals)


def play(tokenizer, env, max_new=8):
    [[t]] = run_episodes(
        Script(tokenizer, walker(True)),
        tokenizer,
        [[env]],
        [0],
        EpisodeLimits(max_new_tokens=max_new, max_tokens=2000),
    )
    return t


def test_head_summarised_and_truncated_keep_the_task_and_the_latest_observation():
    turns = [
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "o1"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "o2"},
        {"role": "tool", "content": "o2b"},
    ]
    messages = [SYSTEM, TASK, *turns]
    assert head(messages) == [SYSTEM, TASK]
    assert summarised(messages, "N") == [SYSTEM, TASK, {"role": "assistant", "content": "N"}, turns[-1]]
    assert truncated(messages, lambda h: len(h) <= 5) == [SYSTEM, TASK, *turns[2:]]  # the oldest turn dropped
    assert truncated(messages, lambda h: True) == messages
    assert truncated(messages, lambda h: False) == [
        SYSTEM,
        TASK,
        turns[3],
        turns[4],
    ]  # what answered the last action
    assert summary_request(ContextPolicy(instruction="Note?")) == {"role": "user", "content": "Note?"}
    for bad in ({"max_tokens": -1}, {"summary_max_tokens": 0}, {"on_overflow": "drop"}):
        with pytest.raises(ValueError):
            ContextPolicy(**bad)


def test_a_summary_is_a_trained_turn_the_env_never_steps_and_the_next_row_starts_from_it(tokenizer):
    policy = ContextPolicy(
        max_tokens=120, on_overflow="summarise", summary_max_tokens=16, instruction="Note?"
    )
    env = LongWalk(policy)
    t = play(tokenizer, env)
    assert t.stop_reason == "done" and t.score.correct, t.error
    assert env.seen == ["walk"] * 4 + ["plum"]  # the summaries never reached step
    assert t.summaries and all(s == "note: plum" for s in t.summaries)
    assert env.graded == t.summaries and t.summary_rewards == [1.0] * len(t.summaries)
    rows = t.rows
    assert len(rows) == len(t.summaries) + 1 == compactions(t) + 1
    first, second = rows[0], rows[1]
    # the first row ends with the env segment (the observation, the request, the assistant header), then the summary
    *_, asked, summary = first.segments
    assert not asked.trainable and asked.logprobs is None
    assert tokenizer.decode(asked.token_ids, skip_special_tokens=False).endswith(
        "<|user|>Note?<|end|><|assistant|>"
    )
    assert summary.trainable and tokenizer.decode(summary.token_ids, skip_special_tokens=True) == "note: plum"
    assert summary.logprobs == [
        -(i + 1) / 100 for i in range(len(summary.token_ids))
    ]  # the sampler's, verbatim
    actions_before = sum(1 for s in first.segments if s.trainable) - 1
    assert summary.turn == actions_before  # it belongs to the next action
    # the next row: head + the summary as the policy's turn + the latest observation, as its prompt
    conversation = tokenizer.decode(first.prompt_ids + first.completion_ids, skip_special_tokens=False)
    latest = conversation.rsplit("<|user|>", 2)[-2].removesuffix("<|end|>")
    last_obs = {"role": "user", "content": latest}
    expected = prompt_ids(tokenizer, [SYSTEM, TASK, {"role": "assistant", "content": "note: plum"}, last_obs])
    assert second.segments[0].starts_row and second.prompt_ids == expected
    # no row's prompt holds the word's observation after the first: the note carried it
    assert all("word is" not in tokenizer.decode(r.prompt_ids) for r in rows[1:])
    assert sum(s.get("summaries", 0) for s in t.signals) == len(t.summaries)
    assert sum(s.get("summary_reward", 0) for s in t.signals) == len(t.summaries)


def test_under_truncation_the_early_fact_is_gone_and_every_row_fits(tokenizer):
    policy = ContextPolicy(max_tokens=120, on_overflow="truncate")
    env = LongWalk(policy)
    t = play(tokenizer, env)
    assert t.stop_reason == "done" and not t.score.correct  # at 4 the word was out of the context
    assert env.seen[-1] == "no idea" and not t.summaries and env.graded == []
    assert len(t.rows) == compactions(t) + 1 > 1
    for row in t.rows:
        assert len(row.prompt_ids) + 8 <= 120  # the prompt and the next action's allowance fit
        assert tokenizer.decode(row.prompt_ids, skip_special_tokens=False).startswith(
            tokenizer.decode(prompt_ids(tokenizer, [SYSTEM, TASK])[:-1], skip_special_tokens=False)
        )  # the task is always kept
    assert all(not s.trainable for r in t.rows for s in r.segments[:1])
    assert [r.segments[0].why for r in t.rows[1:]] == ["truncate"] * int(compactions(t))


def test_without_a_budget_nothing_changes(tokenizer):
    env = LongWalk(ContextPolicy(max_tokens=0))
    t = play(tokenizer, env)
    assert len(t.rows) == 1 and compactions(t) == 0 and t.score.correct


def test_every_row_of_a_summarised_episode_gets_its_episodes_advantage(tokenizer):
    """A group of two: one keeps the word in its notes (wins), one does not (loses); every row of
    each gets its episode's GRPO advantage, and the statistics are of the two episodes."""
    from temper.algorithms.estimators import ESTIMATORS, AdvantageInputs
    from temper.train.rollouts import grade_episodes, rollout_record, to_batch

    policy = ContextPolicy(
        max_tokens=120, on_overflow="summarise", summary_max_tokens=16, instruction="Note?"
    )
    keeps, loses = LongWalk(policy), LongWalk(policy)
    [[good]] = run_episodes(
        Script(tokenizer, walker(True)),
        tokenizer,
        [[keeps]],
        [0],
        EpisodeLimits(max_new_tokens=8, max_tokens=2000),
    )
    [[bad]] = run_episodes(
        Script(tokenizer, walker(False)),
        tokenizer,
        [[loses]],
        [0],
        EpisodeLimits(max_new_tokens=8, max_tokens=2000),
    )
    assert good.score.correct and not bad.score.correct and len(good.rows) == len(bad.rows) > 1
    problem = make_task("arithmetic").sample("test", 1, 0)[0]
    group = grade_episodes(problem, [good, bad], {"outcome": 1.0, "summary": 0.5}, 8, 0)
    assert group.rewards == [1.0 + 0.5 * 1.0, 0.0]
    batch = to_batch([group])
    n = len(good.rows)
    assert batch.episode_R.tolist() == [0] * n + [1] * n
    sampled = [s.token_ids for s in good.segments + bad.segments if s.trainable]
    trained = [batch.completions_R_T[r][batch.mask_R_T[r]].tolist() for r in range(2 * n)]
    assert sum(trained, []) == sum(sampled, [])  # every sampled token trained once, nothing else
    a = ESTIMATORS["grpo"](AdvantageInputs(batch.rewards_G_N, batch.mask_R_T, episode_R=batch.episode_R))[0]
    per_row = [float(a[r][batch.mask_R_T[r]].unique()) for r in range(2 * n)]
    assert per_row == pytest.approx([0.7071] * n + [-0.7071] * n, abs=1e-4)  # never re-normalised per row

    record = rollout_record(1, group, tokenizer)[0]  # rollouts.jsonl and the report read these
    assert record["rows"] == n and record["summaries"] == good.summaries
    starts = [s for s in record["episode"] if s.get("row_start")]
    assert len(starts) == n - 1 and {s["cause"] for s in starts} == {"summarised"}
    assert [s["text"] for s in record["episode"] if s.get("summary")] == [
        f"{s}<|end|>" for s in good.summaries
    ]


def test_the_summary_component_is_the_mean_grade_and_its_weight_counts():
    x = RewardInput(Score(1.0, True, True), 10, 8, False, summary=0.5)
    assert combine(x, {"outcome": 1.0, "summary": 0.4}) == (
        pytest.approx(1.2),
        {"outcome": 1.0, "summary": 0.5},
    )
    assert combine(x, {"outcome": 1.0, "summary": 0.0})[0] == 1.0


@pytest.mark.parametrize(
    ("fails", "reason", "said"),
    [("raise", "env_error", "summary_reward raised: RuntimeError: grader broke"),
     ("nan", "env_error", "not a finite number"),
     ("hang", "timeout", "summary_reward")],
)  # fmt: skip
def test_a_failing_summary_grader_ends_its_episode_with_one_line(tokenizer, fails, reason, said):
    policy = ContextPolicy(
        max_tokens=120, on_overflow="summarise", summary_max_tokens=16, instruction="Note?"
    )
    with guard.time_limit(0.5):
        t = play(tokenizer, LongWalk(policy, grade_fails=fails))
    assert t.stop_reason == reason and said in t.error and "\n" not in t.error


def test_memory_corridor_grades_notes_against_listing_every_box():
    task = make_task("memory_corridor", context_tokens=160)
    problem = task.sample("test", 1, 0)[0]
    env = task.make_env(problem)
    key = problem.data["key"]
    assert env.summary_reward(f"Key in box {key}.") == 1.0
    assert env.summary_reward(f"key in box {key}, not box {key % 4 + 1}") == 0.0  # two boxes: no kept fact
    assert env.summary_reward("box 1 box 2 box 3 box 4") == 0.0
    assert env.summary_reward("Walking on.") == 0.0
    assert env.context_budget == ContextPolicy(160, "summarise", 24, "Note?")
    assert make_task("memory_corridor").make_env(problem).context_budget.on is False


def test_memory_corridor_demonstrations_are_rows_of_the_loops_shape():
    """With the summarise harness a demonstration is several (prompt, completion) rows: the first
    prompt is the task; each completion but the last ends with the request and a note, and the
    next row's prompt (never trained) is the task, that note and the latest observation, as the
    loop compacts; a note that drops the key stays dropped, and the door opens the key's box only
    when it is still known."""
    task = make_task("memory_corridor", context_tokens=160, demo_keep=0.5)
    whole = make_task("memory_corridor")
    kept = lost = 0
    for problem in task.sample("train", 40, 0):
        rows = task.demonstration_rows(problem)
        [(task_prompt, episode)] = whole.demonstration_rows(problem)
        assert (
            task_prompt == rows[0][0] == [{"role": "user", "content": "Corridor. Say look, walk or open N."}]
        )
        assert len(episode) == 2 * (problem.data["length"] + 2) - 1
        gaps = [sum(m["content"] == "walk" for m in c) for _, c in rows]
        assert all(2 <= g <= 4 for g in gaps[:-1]) and sum(gaps) == problem.data["length"]
        for (prompt, completion), (after, _) in zip(rows, rows[1:]):
            assert completion[-2] == {"role": "user", "content": "Note?"}
            assert after == summarised(prompt + completion[:-2], completion[-1]["content"])
        notes = [c[-1]["content"] for _, c in rows[:-1]]
        assert notes == sorted(notes)  # "Key in box" ones first: once dropped, never recovered
        if all(n.startswith("Key in box") for n in notes):
            kept += 1
            assert rows[-1][1][-1]["content"] == f"open {problem.data['key']}"
        else:
            lost += 1
        env = task.make_env(problem)
        env.reset()
        actions = [
            m["content"] for _, c in rows for m in c if m["role"] == "assistant" and m["content"][0].islower()
        ]
        for action in actions:
            result = env.step(action)
        assert result.done and actions[0] == "look"
    assert kept and lost


def test_a_demonstrated_rows_prompt_is_never_trained(tokenizer):
    """The sft stage's example of a later row trains its completion only: the carried-over note in
    its prompt is context, as in the loop (a note trained there would teach 'task -> note')."""
    from temper.data.chat import tokenize_example
    from temper.labels import IGNORE
    from temper.stages.sft import demonstrations

    task = make_task("memory_corridor", context_tokens=160)
    examples = demonstrations(SimpleNamespace(tasks={"c": task}), ["c"], "train", 3, 0)
    rows = [r for p in task.sample("train", 3, 0) for r in task.demonstration_rows(p)]
    assert len(examples) == len(rows) > 3 and [e.line for e in examples] == sorted(e.line for e in examples)
    for example, (prompt, completion) in zip(examples, rows):
        assert (example.prompt, example.completion, example.messages) == (prompt, completion, None)
        t = tokenize_example(tokenizer, example, 512)
        trained = tokenizer.decode([i for i, lab in zip(t.input_ids, t.labels) if lab != IGNORE])
        assert trained.startswith(completion[0]["content"])
        if len(prompt) > 1:  # a later row: its note is context, never trained
            assert prompt[1]["role"] == "assistant" and prompt[1]["content"] not in trained


def test_memory_corridor_train_problems_never_are_held_out_ones():
    """20 corridors in all (2 boxes x 10 signs), half of them held out: without the filter 200
    train draws would hold some; with every corridor held out, drawing says so instead of spinning."""
    small = {"boxes": 2, "min_length": 1, "max_length": 1, "ood_length": 1, "problems": 4}
    task = make_task("memory_corridor", **small)
    held = {task.problem_key(p) for s in ("test", "ood") for p in task.sample(s, 4, 0)}
    train = {task.problem_key(p) for p in task.sample("train", 200, 1)}
    assert len(held) >= 5 and len(train) >= 8 and not held & train
    with pytest.raises(ValueError, match="held out"):
        make_task("memory_corridor", **small | {"problems": 400}).sample("train", 1, 0)


def pruner(prune: bool, prune_needed: bool = False):
    """The lookup expert: reads chunks, prunes each `sign` (or, with prune_needed, the first chunk
    whatever it is), answers once both codes are in its context."""

    def reply(text, j):
        chunks = re.findall(r"\[(\d+)\] (\w+) (\d)", text)
        codes = [c for _, kind, c in chunks if kind == "code"]
        if len(codes) == 2:
            return f"answer {codes[0]} {codes[1]}"
        last = re.match(r"\[(\d+)\] (\w+)", text.rsplit("<|user|>", 1)[-1])
        if prune and last and (last.group(2) == "sign" or (prune_needed and last.group(1) == "1")):
            return f"prune {last.group(1)}"
        return "next"

    return reply


def lookups(tokenizer, reply, n=12, **options):
    task = make_task("prune_lookup", **options)
    problems = task.sample("test", n, 0)
    limits = EpisodeLimits(max_turns=task.max_turns, max_new_tokens=16, max_tokens=task.max_episode_tokens)
    groups = run_episodes(
        Script(tokenizer, reply), tokenizer, [[task.make_env(p)] for p in problems], list(range(n)), limits
    )
    return task, problems, [t for [t] in groups]


def test_a_prune_rewrites_the_history_into_a_new_row_and_keeps_the_row_within_the_budget(tokenizer):
    _, _, episodes = lookups(tokenizer, pruner(True), context_tokens=180)
    assert all(t.stop_reason == "done" and t.score.correct for t in episodes)
    for t in episodes:
        pruned = sum(s.get("pruned", 0) for s in t.signals)
        assert (
            pruned > 0
            and len(t.rows) == pruned + 1
            and sum(s.get("pruned_needed", 0) for s in t.signals) == 0
        )
        for row in t.rows:
            assert len(row.prompt_ids) + len(row.completion_ids) <= 180
            *_, last = row.segments
            assert last.trainable  # a row ends with a policy turn (a prune, or the answer)
        for before, after in zip(t.rows, t.rows[1:]):
            said = tokenizer.decode(before.segments[-1].token_ids, skip_special_tokens=True)
            gone = f"[{said.split()[1]}] "
            assert said.startswith("prune ") and gone in tokenizer.decode(
                before.prompt_ids + before.completion_ids
            )
            assert gone not in tokenizer.decode(after.prompt_ids)  # the pruned chunk left the context
            assert after.segments[0].starts_row


def test_without_pruning_the_hard_budget_ends_what_does_not_fit(tokenizer):
    _, problems, episodes = lookups(tokenizer, pruner(False), context_tokens=180, prune=False)
    ended = [t for t in episodes if t.stop_reason == "max_tokens"]
    assert ended and all(t.score is None and t.signals[-1]["context_overflow"] == 1 for t in ended)
    assert all(len(t.rows) == 1 and len(t.prompt_ids) + len(t.completion_ids) <= 180 for t in episodes)
    fits = [
        t for t, p in zip(episodes, problems) if p.data["asked"][1] < 5
    ]  # the second asked chunk comes early
    assert fits and all(t.score.correct for t in fits)
    # the same policy's prune is an invalid action there, and with no budget every lookup is answered
    _, _, free = lookups(tokenizer, pruner(True), prune=False)
    assert all(t.score.correct for t in free) and all(t.signals[0].get("invalid") == 0 for t in free)


def test_pruning_a_needed_chunk_is_counted_and_loses_its_code(tokenizer):
    _, problems, episodes = lookups(tokenizer, pruner(True, prune_needed=True), context_tokens=180)
    first_asked = [t for t, p in zip(episodes, problems) if p.data["asked"][0] == 0]
    assert first_asked and all(sum(s["pruned_needed"] for s in t.signals) == 1 for t in first_asked)
    assert all(not (t.score and t.score.correct) for t in first_asked)


def test_prune_lookup_demonstrations_are_the_loops_rows():
    """Each demonstrated row but the last ends with a prune, the next row's prompt is the env's
    history after it (the pruned chunk gone), and the expert never prunes a needed chunk."""
    task = make_task("prune_lookup", context_tokens=180)
    pruned = kept = 0
    for problem in task.sample("train", 30, 0):
        rows = task.demonstration_rows(problem)
        env = task.make_env(problem)
        env.reset()
        for (_, completion), (after, _) in zip(rows, rows[1:]):
            for m in (m for m in completion if m["role"] == "assistant"):
                result = env.step(m["content"])
            assert m["content"].startswith("prune ") and result.history == after
            assert f"[{m['content'].split()[1]}] " not in str(after)
        a, b = problem.data["asked"]
        names = problem.data["names"]
        for _, completion in rows:
            for m in completion:
                if m["role"] == "assistant" and m["content"].startswith("prune"):
                    assert names[int(m["content"].split()[1]) - 1] not in (names[a], names[b])
        pruned += len(rows) - 1
        kept += b + 1 - 2 - (len(rows) - 1)
        assert rows[-1][1][-1]["content"] == f"answer {problem.data['codes'][a]} {problem.data['codes'][b]}"
    assert pruned and kept  # demo_prune 0.5: some distractors pruned, some kept
    assert all(
        len(make_task("prune_lookup", prune=False).demonstration_rows(p)) == 1
        for p in task.sample("train", 5, 0)
    )


def test_a_whole_plan_is_graded_by_playing_it():
    corridor = make_task("memory_corridor", context_tokens=160)
    problem = corridor.sample("test", 1, 0)[0]
    assert corridor.score(problem, corridor.demonstration(problem)).correct
    assert corridor.score(problem, "look\nwalk").details["reason"] == "no_more_moves"
    lookup = make_task("prune_lookup")
    problem = lookup.sample("test", 1, 0)[0]
    assert lookup.score(problem, lookup.demonstration(problem)).correct
    assert not lookup.score(problem, "next\nanswer 1 2").correct
