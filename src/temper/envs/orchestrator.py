"""orchestrator: an episode in which the policy delegates independent sub-tasks to scripted
sub-agents that run in parallel, then combines their results (Kimi K2.5's PARL set-up, issue 28
item 3).

    user        lookup 1 2 3                                three sub-tasks: look each one up
    assistant   spawn 1 2 3                                 one batch of three sub-agents, in parallel
    user        1=7 (2) 2=4 (1) 3=8 (3) | path 4/7          (the environment's, never trained on)
    assistant   answer 7 4 8                                the results combined, in the sub-tasks' order

A problem is `n` sub-tasks (`min_subtasks`..`max_subtasks`), named 1..n, each with a hidden value
(1..9) and the steps its worker needs (1..`max_worker_steps`), both drawn per problem, so neither
can be memorized: only a sub-agent finds a value, and how long it takes shows only when it
returns. The workers are scripted: a worker given a sub-task of the problem returns its value
after its steps; given anything else it returns `?` after one step. (Why so plain: the tiny
default reads bytes and learns from a few thousand demonstrations; random key names and 2-digit
values it could not copy reliably, and the experiment is about when to spawn, not about copying.)

Time. Every orchestrator turn costs one step; a spawn turn's batch runs its workers in parallel,
so it adds max(worker steps) to the critical path and sum(worker steps) to the total:

    critical path = orchestrator turns + sum over spawn turns of max_i s_i
    total steps   = orchestrator turns + sum over spawn turns of sum_i s_i

(PARL's "critical steps", Kimi Team 2026, §4.2). Signals per step: `steps` and `critical_steps`
(their sums over an episode are the two figures above), `subagents` (workers spawned), `spawns`
(1 on a spawn turn), `invalid`, and on the last step `answered` (the episode ended with an
answer), `unused` (spawned results the answer does not use: a sub-task that is not the problem's,
one spawned again, a value the answer does not give at its position; an episode that ends without
an answer, at the budget or a loop limit, counts only the first two) and `budget_exceeded`.

Budget: the critical path may not pass `budget` (default 7). A spawn after which no step is left
to answer ends the episode as a failure (reason `budget`). With the defaults one batch of all
keys always fits (1 + 3 + 1 = 5), one key at a time never does for four keys (4 + 4 + 1 > 7):
parallel decomposition pays in success.

Outcome: 1 when the answer gives every key's value in order within the budget, else 0. The
parallel reward (r_parallel, its annealing and the completion constraint) is the RL feature
`parallel` (`temper.train.features.parallel`), which reads the signals above.

Demonstrations (the scripted expert, which sees the worker steps): with probability
`serial_share` (a hash of the problem) a "lazy" plan spawns one key per turn while the rest can
still be done in one batch within the budget, then the rest at once; otherwise one batch of all
keys. Both succeed; the orchestrator cannot tell from the prompt when lazy is safe, so the SFT
policy mixes the two and sometimes runs out of budget: what RL can improve on.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

from temper.envs.base import StepResult
from temper.tasks.base import Problem, Score, check_split, split_of


@dataclass(frozen=True)
class OrchestratorConfig:
    min_subtasks: int = 2
    max_subtasks: int = 4
    """Keys per problem: drawn uniformly in [min_subtasks, max_subtasks]."""
    max_worker_steps: int = 3
    """A worker needs 1..max_worker_steps steps (drawn per key)."""
    budget: int = 7
    """The longest critical path an episode may take, its answer turn included."""
    serial_share: float = 0.5
    """Share of demonstrations that spawn lazily (one key per turn while it still fits)."""
    test_fraction: float = 0.25
    """Share of problems held out as test (a stable hash split of their values and worker steps)."""
    ood_subtasks: int = 5
    """Keys per ood problem (more sub-tasks than training ever shows)."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_subtasks <= self.max_subtasks or self.max_worker_steps < 1:
            raise ValueError("need 1 <= min_subtasks <= max_subtasks and max_worker_steps >= 1")
        if self.budget < self.max_worker_steps + 2:
            raise ValueError(f"budget {self.budget} < max_worker_steps + 2: one batch may not fit")
        if not 0 <= self.serial_share <= 1 or not 0 < self.test_fraction < 1 or self.ood_subtasks < 1:
            raise ValueError("need 0 <= serial_share <= 1, 0 < test_fraction < 1 and ood_subtasks >= 1")


def _unit(text: str) -> float:
    """A stable number in [0, 1) of `text`."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


@dataclass(frozen=True)
class OrchestratorTask:
    """Problems of independent lookups, played by delegating to sub-agents (module docstring)."""

    config: OrchestratorConfig = field(default_factory=OrchestratorConfig)
    name: ClassVar[str] = "orchestrator"
    config_type: ClassVar[type] = OrchestratorConfig

    @property
    def max_turns(self) -> int:
        return self.config.budget

    def problem(self, split: str, seed: int) -> Problem:
        """The problem of `seed`: sub-tasks, their values and worker steps (a pure function of the seed)."""
        c = self.config
        rng = random.Random(f"orchestrator:{'ood' if split == 'ood' else 'in'}:{seed}")
        n = c.ood_subtasks if split == "ood" else rng.randint(c.min_subtasks, c.max_subtasks)
        keys = [str(i + 1) for i in range(n)]
        data = {
            "keys": keys,
            "values": [rng.randint(1, 9) for _ in keys],
            "worker_steps": [rng.randint(1, c.max_worker_steps) for _ in keys],
        }
        return Problem(self.name, split, f"s{seed}", "lookup " + " ".join(keys), data)

    def problem_key(self, problem: Problem) -> str:
        """The hidden values and worker steps: the prompt names only how many sub-tasks there are,
        which every problem of that size shares, so the contamination check compares keys."""
        d = problem.data
        return f"{d['values']}/{d['worker_steps']}"

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` from seed `seed` on. Train and test are a hash split of the
        problems themselves (`problem_key`: values and worker steps), so no test problem is a
        train problem drawn from another seed."""
        check_split(split)
        out, s = [], seed * 1_000_003
        while len(out) < n:
            p = self.problem(split, s)
            if (
                split == "ood"
                or split_of(f"orchestrator/{self.problem_key(p)}", self.config.test_fraction) == split
            ):
                out.append(p)
            s += 1
        return out

    def make_env(self, problem: Problem) -> OrchestratorEnv:
        return OrchestratorEnv(self.config, problem)

    def plan(self, problem: Problem) -> list[list[str]]:
        """The scripted expert's spawn batches (module docstring: lazy or one batch)."""
        keys, steps = problem.data["keys"], problem.data["worker_steps"]
        if _unit(f"serial:{problem.split}:{problem.id}") >= self.config.serial_share:
            return [list(keys)]
        batches, used = [], 0  # used: critical path so far
        for i, key in enumerate(keys):
            rest = steps[i + 1 :]
            # this key alone, then the rest in one batch (if any), then the answer
            after = used + 1 + steps[i] + (1 + max(rest) if rest else 0) + 1
            if after > self.config.budget:
                batches.append(list(keys[i:]))
                break
            batches.append([key])
            used += 1 + steps[i]
        return batches

    def demonstration_messages(self, problem: Problem) -> list[dict[str, Any]]:
        """The expert's plan played through the env: one assistant turn per spawn batch, the
        env's observation after each, then the answer. SFT trains the assistant turns only."""
        env = self.make_env(problem)
        messages = env.reset()
        for batch in self.plan(problem):
            action = "spawn " + " ".join(batch)
            messages.append({"role": "assistant", "content": action})
            messages += env.step(action).messages
        answer = self.demonstration(problem)
        messages.append({"role": "assistant", "content": answer})
        result = env.step(answer)
        if not (result.done and result.score is not None and result.score.correct):
            raise AssertionError(f"the expert's plan of {problem.id} failed: {result.score}")  # a bug
        return messages

    def demonstration(self, problem: Problem) -> str:
        return "answer " + " ".join(str(v) for v in problem.data["values"])

    def score(self, problem: Problem, completion: str) -> Score:
        """A whole episode written at once: each line an action, played from the start."""
        env = self.make_env(problem)
        env.reset()
        for line in [x for x in completion.splitlines() if x.strip()]:
            result = env.step(line)
            if result.done:
                assert result.score is not None
                return result.score
        return Score(0.0, False, False, {"reason": "no_answer"})

    def corpus_text(self, problem: Problem) -> str:
        return f"{problem.prompt} {self.demonstration(problem)}"


class OrchestratorEnv:
    """One problem: spawn turns run scripted workers in parallel, then the answer (module docstring)."""

    stop = ()

    def __init__(self, config: OrchestratorConfig, problem: Problem):
        self.config, self.problem = config, problem
        d = problem.data
        self.values = dict(zip(d["keys"], d["values"], strict=True))
        self.worker_steps = dict(zip(d["keys"], d["worker_steps"], strict=True))
        self.path = 0  # the critical path so far
        self.results: list[tuple[str, str]] = []  # (key, result) of every sub-agent, in spawn order

    def reset(self) -> list[dict[str, Any]]:
        return self.problem.messages()

    def work(self, key: str) -> tuple[str, int]:
        """A scripted worker: (its result, the steps it took)."""
        if key in self.values:
            return str(self.values[key]), self.worker_steps[key]
        return "?", 1

    def step(self, action: str) -> StepResult:
        words = action.split()
        if words[:1] == ["spawn"] and len(words) > 1:
            done = [self.work(k) for k in words[1:]]
            self.results += [(k, r) for k, (r, _) in zip(words[1:], done, strict=True)]
            longest = max(s for _, s in done)
            self.path += 1 + longest
            signals = {"steps": 1 + sum(s for _, s in done), "critical_steps": 1 + longest,
                       "subagents": len(done), "spawns": 1, "invalid": 0}  # fmt: skip
            if self.path + 1 > self.config.budget:  # no step left to answer
                return self.finish(signals, Score(0.0, False, True, {"reason": "budget"}), None)
            parts = " ".join(f"{k}={r} ({s})" for k, (r, s) in zip(words[1:], done, strict=True))
            text = f"{parts} | path {self.path}/{self.config.budget}"
            return StepResult(messages=[{"role": "user", "content": text}], signals=signals)
        self.path += 1
        signals = {"steps": 1, "critical_steps": 1, "subagents": 0, "spawns": 0, "invalid": 0}
        if words[:1] == ["answer"]:
            given = words[1:]
            correct = given == [str(v) for v in self.problem.data["values"]]
            return self.finish(signals, Score(float(correct), correct, True, {"reason": "answer"}), given)
        signals["invalid"] = 1
        if self.path + 1 > self.config.budget:
            return self.finish(signals, Score(0.0, False, False, {"reason": "budget"}), None)
        text = f"say spawn KEYS or answer VALUES | path {self.path}/{self.config.budget}"
        return StepResult(messages=[{"role": "user", "content": text}], signals=signals)

    def unused(self, answer: list[str] | None) -> int:
        """Sub-agent results the answer does not use; without an answer (None) the results no
        answer could use: a sub-task that is not the problem's, one spawned again."""
        position = {k: i for i, k in enumerate(self.problem.data["keys"])}
        seen: set[str] = set()
        count = 0
        for key, result in self.results:
            i = position.get(key)
            unneeded = i is None or key in seen
            if unneeded or (answer is not None and (i >= len(answer) or answer[i] != result)):
                count += 1
            seen.add(key)
        return count

    def finish(self, signals: dict[str, Any], score: Score, answer: list[str] | None) -> StepResult:
        signals |= {"answered": int(answer is not None), "unused": self.unused(answer),
                    "budget_exceeded": int(score.details["reason"] == "budget")}  # fmt: skip
        details = {**score.details, "critical_path": self.path}
        return StepResult(
            done=True, signals=signals, score=Score(score.reward, score.correct, score.parsed, details)
        )

    def cut(self, reason: str) -> dict[str, Any]:
        """The loop ended the episode (a turn or token limit) before an answer."""
        return {"answered": 0, "unused": self.unused(None), "budget_exceeded": 0}
