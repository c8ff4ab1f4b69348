"""A self-evolving curriculum (WebRL, Qi et al. 2024, §3.2): the train tasks the policy fails become
new, admitted variants in the pool that later RL steps draw from. What is shared by every task that
grows its pool this way (code_repair, web_shop); each task says how a variant is made and admitted.

    code_repair: {curriculum: {every: 1, variants_per_failure: 2, max_share: 0.5}}

After every `every` RL steps, each train problem whose whole group failed in those steps (no
rollout correct; a void outcome counts as a failure) spawns `variants_per_failure` candidate
variants (`make_variant`, seeded by the task's seed, the parent, the step and the draw). Every
candidate enters only through the task's gate (`gate`), rejections counted by reason; `duplicate`
is checked against every split (a variant is never a test or ood task) and every earlier
variant, and `no_variant` counts a draw for a parent with no other variant. A failed variant
spawns variants of its own, so the pool keeps moving toward what the policy still fails.

Sampling (`draw`): the originals and the variants born before the step; a seeded coin per draw
picks a variant. `weighting: pool` (the default): heads with probability min(max_share,
variants / pool), so a large pool dilutes a few variants to a few percent of the draws;
`weighting: fixed`: heads with probability `max_share` as soon as any variant exists (WebRL trains
each phase on its newly generated tasks). Either way the original tasks keep the rest of the mix.

Determinism and resume: the pool after step s is the originals plus the variants of the
failures of steps <= s, a pure function of the run. Each step's row (its failures and the
variants admitted) is appended, flushed and fsynced, to `curriculum_<task>.jsonl` in the run's
folder before the step's checkpoint is written; a resumed run keeps the rows up to its
checkpoint's step and replays them. Under N processes train_rl gathers every process's graded
problems, the main process runs the gate (timings must not make processes disagree) and every
process gets the same row.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper import distributed
from temper.tasks.base import Problem, draw


@dataclass(frozen=True)
class CurriculumConfig:
    every: int = 1
    """Grow the pool after every `every` RL steps (from the failures of those steps)."""
    variants_per_failure: int = 2
    max_share: float = 0.5
    """The most of a step's train draws that may be generated variants (the rest: originals)."""
    weighting: str = "pool"
    """`pool`: variants drawn at their share of the pool, capped by `max_share`; `fixed`: at
    `max_share` of the draws once any exist."""

    def __post_init__(self) -> None:
        if self.every < 1 or self.variants_per_failure < 1:
            raise ValueError("curriculum: every and variants_per_failure must be >= 1")
        if not 0.0 < self.max_share < 1.0:
            raise ValueError(f"curriculum: max_share must be in (0, 1), got {self.max_share}")
        if self.weighting not in ("pool", "fixed"):
            raise ValueError(f"curriculum: weighting must be pool or fixed, got {self.weighting!r}")

    @staticmethod
    def of(value: Any) -> CurriculumConfig | None:
        """A task config's `curriculum:` option (a mapping from YAML, a config, or None)."""
        if not isinstance(value, dict):
            return value
        fields = set(CurriculumConfig.__dataclass_fields__)
        if bad := set(value) - fields:
            raise ValueError(f"unknown curriculum options {sorted(bad)}; valid: {', '.join(sorted(fields))}")
        return CurriculumConfig(**value)


class Curriculum:
    """The growing train pool of one task (module docstring). A subclass defines the variants:
    `reasons` (the gate's rejection reasons), `parent`, `make_variant`, `gate`, `candidate_key`,
    `candidate_data` and `known_keys`; `task` has `name`, `prompt`, `config.seed`, `problems` and
    `sample`."""

    reasons: tuple[str, ...] = ()

    def __init__(self, task: Any, config: CurriculumConfig):
        self.task, self.config = task, config
        self.path: Path | None = None
        self.write = False
        self.reset()

    # ---- what a task defines ---------------------------------------------------------------
    def parent(self, problem: Problem) -> Any:
        """What `make_variant` varies of a failed problem (default: the problem itself)."""
        return problem

    def make_variant(self, parent: Any, key: str) -> Any | None:
        """One seeded variant candidate of the failed `parent`; None when it has no other variant."""
        raise NotImplementedError

    def gate(self, candidates: list[Any], seen: set[str]) -> tuple[list[Any], dict[str, int]]:
        """The candidates admitted (in order) and the rejections by reason; `seen` holds the keys
        of every split's problems and every earlier variant (a candidate with one is a duplicate)."""
        raise NotImplementedError

    def candidate_key(self, candidate: Any) -> str:
        """What makes a candidate the same task as another (the duplicate check's key)."""
        raise NotImplementedError

    def candidate_data(self, candidate: Any) -> dict[str, Any]:
        """The Problem.data of an admitted candidate."""
        raise NotImplementedError

    def known_keys(self) -> set[str]:
        """The keys of every split's problems (a variant must not repeat any)."""
        raise NotImplementedError

    def generated_key(self, problem: Problem) -> str:
        """The key of a generated problem (as `candidate_key` of its candidate)."""
        raise NotImplementedError

    # ---- the pool --------------------------------------------------------------------------
    def reset(self) -> None:
        self.born: list[tuple[int, Problem]] = []  # (the step after which it entered, problem)
        self.pending: list[str] = []  # failed ids of the steps since the last growth

    def originals(self) -> list[Problem]:
        return self.task.problems("train")

    def generated(self, step: int | None = None) -> list[Problem]:
        """The variants admitted after steps <= `step` (None: all)."""
        return [p for s, p in self.born if step is None or s <= step]

    def draw(self, n: int, seed: int, step: int) -> list[Problem]:
        """`n` train problems for the (0-based) RL step `step`: the originals as `sample` draws
        them, a bounded share of the draws replaced by the variants born before this step."""
        generated, originals = self.generated(step), self.originals()
        if not generated:
            return self.task.sample("train", n, seed)
        name = self.task.name
        rng = random.Random(f"{name}:curriculum:{seed}")
        share = self.config.max_share
        if self.config.weighting == "pool":
            share = min(share, len(generated) / (len(generated) + len(originals)))
        heads = [rng.random() < share for _ in range(n)]
        orig = iter(draw(originals, f"{name}:train:{seed}", n - sum(heads), repeat=True))
        gen = iter(draw(generated, f"{name}:curriculum:{seed}", sum(heads), repeat=True))
        return [next(gen) if h else next(orig) for h in heads]

    # ---- growth ----------------------------------------------------------------------------
    def grow(self, step: int, failed: list[str]) -> dict[str, Any]:
        """The row of a growth step: variants of the `failed` problem ids through the gate (a pure
        function of the pool so far, the ids and the step), their ids `gen<step>_<k>`."""
        known = {p.id: p for p in self.originals() + self.generated()}
        seen = self.known_keys() | {self.generated_key(p) for p in self.generated()}
        counts: Counter = Counter({r: 0 for r in ("no_variant", *self.reasons)})
        candidates, parent_of = [], {}
        for pid in failed:
            for j in range(self.config.variants_per_failure):
                c = self.make_variant(self.parent(known[pid]), f"{self.task.config.seed}:{pid}:{step}:{j}")
                if c is None:
                    counts["no_variant"] += 1
                    continue
                candidates.append(c)
                parent_of.setdefault(self.candidate_key(c), pid)
        admitted, rejected = self.gate(candidates, seen)
        counts.update({r: rejected.get(r, 0) for r in self.reasons})
        rows = [
            {
                "id": f"gen{step}_{k}",
                "parent": parent_of[self.candidate_key(c)],
                "task": self.candidate_data(c),
            }
            for k, c in enumerate(admitted)
        ]
        return {"step": step, "failed": failed, "admitted": rows, "rejected": dict(counts)}

    def after_step(self, step: int, drawn: list[tuple[str, bool]]) -> dict[str, float]:
        """After the (1-based) step `step`: `drawn` is every train problem graded in it (all
        processes, all sampling rounds) with whether its whole group failed. Grows the pool on
        growth steps, records the row and returns the step's metrics."""
        failed = list(dict.fromkeys(pid for pid, all_failed in drawn if all_failed))
        if step % self.config.every == 0:
            parents = list(dict.fromkeys(self.pending + failed))
            row = distributed.on_main(self.grow, step, parents) | {"failed": failed}
        else:
            row = {"step": step, "failed": failed, "admitted": [], "rejected": {}}
        self.apply(row)
        pool = len(self.originals()) + len(self.born)
        metrics = {
            "curriculum/pool_size": pool,
            "curriculum/generated_share": len(self.born) / pool,
            "curriculum/admitted": len(row["admitted"]),
            "curriculum/failed_problems": len(failed),
            "curriculum/drawn_generated_share": sum(pid.startswith("gen") for pid, _ in drawn)
            / max(len(drawn), 1),
        }
        reasons = ("no_variant", *self.reasons)
        return metrics | {f"curriculum/rejected/{r}": row["rejected"].get(r, 0) for r in reasons}

    def apply(self, row: dict[str, Any]) -> None:
        """Add a row's variants to the pool (and append the row to the log on the main process)."""
        step = row["step"]
        for a in row["admitted"]:
            data = a["task"] | {"parent": a["parent"]}
            self.born.append((step, Problem(self.task.name, "train", a["id"], self.task.prompt, data)))
        self.pending = [] if step % self.config.every == 0 else self.pending + row["failed"]
        if self.write and self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())  # on disk before the step's checkpoint

    def resume(self, out_dir: Path, start: int, main: bool) -> None:
        """The pool after `start` steps of the run in `out_dir`: its log's rows up to `start`
        replayed (later rows, from steps past the checkpoint, are dropped on the main process)."""
        self.reset()
        self.path, self.write = Path(out_dir) / f"curriculum_{self.task.name}.jsonl", False
        rows = []
        if start and self.path.exists():
            rows = [json.loads(ln) for ln in self.path.read_text().splitlines() if ln.strip()]
            rows = [r for r in rows if r["step"] <= start]
        for row in rows:
            self.apply(row)
        if main:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.replace(tmp, self.path)
        self.write = main
