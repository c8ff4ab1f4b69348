"""prune_lookup: retrieval under a hard context budget, with pruning as an action (Chroma Context-1).

    user        Find the two codes. Say next, prune N or answer X Y.
    assistant   next
    user        [1] code 4                                  (a chunk the answer needs: keep it)
    assistant   next
    user        [2] sign 7                                  (a distractor)
    assistant   prune 2                                     (the env drops chunk 2 from the context)
    assistant   next                                        (the next row: task, [1], then on)
    user        [3] code 1
    assistant   answer 4 1                                  (both codes, in order: 1, else 0)

Each problem is `chunks` chunks, read one at a time with `next`: two `code` chunks (one in the
first half, one in the second) and `sign` distractors, each with a digit. What to keep is plain
to see (the tiny default could not match two-letter names against the question reliably: in a
first design it pruned a needed chunk 0.6 times per episode); what RL has to learn is to prune
enough, and early enough, to stay within the budget. The env runs under a hard
context budget (`context_tokens`, a `ContextPolicy` with `on_overflow: end`): a row that could
not hold the next action ends the episode, unfinished (graded 0). All the chunks do not fit, so
the policy must `prune N` what it does not need: the env answers with the whole conversation from
now on (`StepResult.history`: the task and the kept chunks, each with the `next` that fetched it),
which the agent loop starts a new training row with; the prune action itself is trained in the row
that sampled it. Success within the budget is the reward (the outcome); signals: `pruned`,
`pruned_needed` (a chunk the answer needed: its code is gone), `chunks_read`.

With `prune: false` the action does not exist (it reads as invalid): the comparison at equal
budget. SFT demonstrations (`demonstration_rows`) are the expert's episode split where its prunes
rewrite the history, one (prompt, completion) per row as the loop splits it; the expert prunes a
distractor with probability `demo_prune` (else keeps it), so SFT starts the policy pruning some of
the time and RL has the rest to learn. train/test: `chunks` chunks from disjoint seed ranges; ood:
`ood_chunks` (more to read, so more to prune).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

from temper.envs.base import StepResult, play_plan
from temper.rollout.context import ContextPolicy
from temper.tasks.base import Problem, Score, check_split


@dataclass(frozen=True)
class PruneLookupConfig:
    chunks: int = 8
    ood_chunks: int = 12
    context_tokens: int = 0
    """The hard context budget of a row in tokens (0: none)."""
    prune: bool = True
    """Whether `prune N` is an action (False: the no-pruning arm)."""
    demo_prune: float = 0.5
    """Chance the demonstrating expert prunes a distractor."""
    train_seed: int = 0
    test_seed: int = 1_000_000
    ood_seed: int = 2_000_000
    problems: int = 1000

    def __post_init__(self) -> None:
        if self.chunks < 2 or self.ood_chunks < 2 or not 0.0 <= self.demo_prune <= 1.0:
            raise ValueError("need chunks, ood_chunks >= 2 and demo_prune in [0, 1]")
        self.policy()

    def policy(self) -> ContextPolicy:
        return ContextPolicy(self.context_tokens, "end")

    @property
    def actions(self) -> str:
        return "next, prune N or answer X Y" if self.prune else "next or answer X Y"

    def prompt(self) -> str:
        return f"Find the two codes. Say {self.actions}."


@dataclass(frozen=True)
class PruneLookupTask:
    """Lookups played as multi-turn episodes under a hard context budget (module docstring)."""

    config: PruneLookupConfig = field(default_factory=PruneLookupConfig)
    name: ClassVar[str] = "prune_lookup"
    config_type: ClassVar[type] = PruneLookupConfig

    @property
    def max_turns(self) -> int:
        """The longest episode: every chunk read and pruned, and the answer."""
        return 2 * max(self.config.chunks, self.config.ood_chunks) + 2

    @property
    def max_episode_tokens(self) -> int:
        """Eval's budget for a whole episode after its row prompts (a chunk and an action ~24 tokens)."""
        return 32 * self.max_turns

    def problem(self, split: str, seed: int) -> Problem:
        check_split(split)
        c = self.config
        n = c.ood_chunks if split == "ood" else c.chunks
        rng = random.Random(f"prune_lookup:{split}:{seed}")
        a, b = rng.randrange(n // 2), rng.randrange(n // 2, n)
        names = ["code" if i in (a, b) else "sign" for i in range(n)]
        codes = [rng.randrange(10) for _ in names]
        data = {"names": names, "codes": codes, "asked": [a, b], "max_steps": self.max_turns}
        return Problem(self.name, split, f"lookup{seed}", c.prompt(), data)

    def problem_key(self, problem: Problem) -> str:
        """The chunks themselves (the prompt is the same for every problem): the contamination
        check compares keys. Train and held-out problems come from different seed strings; two
        coincide with chance ~1e-8 (positions x digits)."""
        d = problem.data
        return f"{d['asked'][0]},{d['asked'][1]}/{''.join(map(str, d['codes']))}"

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """train: n fresh seeds; test/ood: n of the split's `problems` seeds, without repeats."""
        check_split(split)
        c = self.config
        rng = random.Random(f"prune_lookup:{split}:draw:{seed}")
        if split == "train":
            seeds = [c.train_seed + rng.randrange(1 << 30) for _ in range(n)]
        else:
            start = c.test_seed if split == "test" else c.ood_seed
            seeds = [start + s for s in rng.sample(range(c.problems), min(n, c.problems))]
        return [self.problem(split, s) for s in seeds]

    def make_env(self, problem: Problem) -> PruneLookupEnv:
        return PruneLookupEnv(self.config, problem)

    def demonstration_rows(self, problem: Problem) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
        """The expert's episode: next until both asked chunks are read, pruning a distractor with
        probability `demo_prune` (never a needed one), then the answer; split into (prompt,
        completion) rows where a prune rewrote the history."""
        d = problem.data
        rng = random.Random(f"prune_lookup:demo:{problem.id}")
        env = self.make_env(problem)
        prompt = env.reset()
        messages = list(prompt)
        rows = []
        a, b = d["asked"]
        for i in range(b + 1):
            messages.append({"role": "assistant", "content": "next"})
            messages += env.step("next").messages
            if i not in (a, b) and self.config.prune and rng.random() < self.config.demo_prune:
                messages.append({"role": "assistant", "content": f"prune {i + 1}"})
                history = env.step(f"prune {i + 1}").history
                rows.append((prompt, messages[len(prompt) :]))
                prompt, messages = list(history), list(history)  # type: ignore[arg-type]
        messages.append({"role": "assistant", "content": f"answer {d['codes'][a]} {d['codes'][b]}"})
        return [*rows, (prompt, messages[len(prompt) :])]

    def score(self, problem: Problem, completion: str) -> Score:
        """A whole plan at once, one action per line (no budget applies)."""
        env = self.make_env(problem)
        return play_plan(env, completion) or env.grade("no_answer")

    def demonstration(self, problem: Problem) -> str:
        a, b = problem.data["asked"]
        codes = problem.data["codes"]
        return "\n".join(["next"] * (b + 1) + [f"answer {codes[a]} {codes[b]}"])

    def corpus_text(self, problem: Problem) -> str:
        return f"{problem.prompt}\n{self.demonstration(problem)}"


class PruneLookupEnv:
    """One lookup (`problem.data`: names, codes, asked, max_steps); keeps its own conversation so
    a prune can hand the loop the history without the pruned chunk."""

    stop = ()

    def __init__(self, config: PruneLookupConfig, problem: Problem):
        self.config, self.data, self.prompt = config, problem.data, problem.prompt
        self.context_budget: ContextPolicy | None = config.policy()
        self.read = 0
        self.kept: list[int] = []  # the read, unpruned chunks, in order
        self.steps = self.invalid = 0

    def reset(self) -> list[dict[str, Any]]:
        self.read, self.kept, self.steps, self.invalid = 0, [], 0, 0
        return [{"role": "user", "content": self.prompt}]

    def _chunk(self, i: int) -> str:
        return f"[{i + 1}] {self.data['names'][i]} {self.data['codes'][i]}"

    def history(self) -> list[dict[str, Any]]:
        """The task and each kept chunk with the `next` that fetched it."""
        out = [{"role": "user", "content": self.prompt}]
        for i in self.kept:
            out += [{"role": "assistant", "content": "next"}, {"role": "user", "content": self._chunk(i)}]
        return out

    def step(self, action: str) -> StepResult:
        self.steps += 1
        words = action.strip().lower().split()
        signals = {"invalid": 0, "pruned": 0, "pruned_needed": 0, "chunks_read": 0}
        n = len(self.data["names"])
        if words == ["next"] and self.read < n:
            self.kept.append(self.read)
            self.read += 1
            signals["chunks_read"] = 1
            result = StepResult(
                messages=[{"role": "user", "content": self._chunk(self.read - 1)}], signals=signals
            )
        elif (
            self.config.prune
            and len(words) == 2
            and words[0] == "prune"
            and words[1].isdigit()
            and int(words[1]) - 1 in self.kept
        ):
            i = int(words[1]) - 1
            self.kept.remove(i)
            signals["pruned"] = 1
            signals["pruned_needed"] = int(i in self.data["asked"])
            result = StepResult(history=self.history(), signals=signals)
        elif len(words) == 3 and words[0] == "answer":
            a, b = self.data["asked"]
            right = words[1:] == [str(self.data["codes"][a]), str(self.data["codes"][b])]
            return StepResult(done=True, signals=signals, score=self.grade("right" if right else "wrong"))
        else:
            self.invalid += 1
            signals["invalid"] = 1
            said = "No more chunks." if words == ["next"] else f"Say {self.config.actions}."
            result = StepResult(messages=[{"role": "user", "content": said}], signals=signals)
        if self.steps >= self.data["max_steps"]:
            return StepResult(done=True, signals=signals, score=self.grade("step_limit"))
        return result

    def grade(self, reason: str) -> Score:
        won = reason == "right"
        details = {"reason": reason, "steps": self.steps, "invalid_moves": self.invalid}
        return Score(float(won), won, self.invalid == 0, details)
