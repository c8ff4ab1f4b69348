"""Environments and reward functions in a worker pool, `workers: {kind, actors, address}`
(the pool is `temper.rollout.env_workers`).

Without the block every env's `reset` / `step` and a task's reward functions run in the trainer's
process, in threads. With it, each sampling round's envs are sent to `actors` workers, a group per
worker, and played there (the agent loop, its time limits and its failure lines unchanged):
`kind: local` forks processes on this machine (Python-heavy envs and graders stop competing with
the trainer for the GIL), `kind: ray` runs Ray actors (`pip install temper[ray]`) on the Ray at
`address`, or on a local one the run starts and stops. Results equal the in-process run's for a
seeded run, so the block is left out of the stage hash.

Refused: `kind: ray` without Ray installed, an `address` for local workers, and a process worker
of `async_rollouts` (a forked sampler would share the pool's pipes with the trainer).
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from temper.train.features.base import Error, Hooks, RLFeature, RunStart


@dataclass
class Workers:
    """Where environments and reward functions run: worker processes or Ray actors."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: Literal["local", "ray"] = "local"
    """local: processes forked on this machine; ray: Ray actors (`pip install temper[ray]`)."""
    actors: Annotated[int, Field(ge=1)] = 2
    """How many workers (processes or actors); each plays whole groups."""
    address: str | None = None
    """ray: the address of a running Ray cluster (`ray://host:10001`, `auto`); null starts a local
    Ray for the run (and shuts it down after)."""


def rules(config: Any, stage: Any) -> list[Error]:
    block: Workers | None = config.workers
    if block is None:
        return []
    out: list[Error] = []
    if block.kind == "ray" and importlib.util.find_spec("ray") is None:
        out.append(
            (
                ("train", "workers", "kind"),
                "ray workers need Ray, which is not installed: pip install temper[ray]",
            )
        )
    if block.kind == "local" and block.address is not None:
        out.append(
            (("train", "workers", "address"), "an address is for ray workers: use kind: ray, or drop address")
        )
    pipeline = config.async_rollouts
    if pipeline.max_staleness and pipeline.worker == "process":
        out.append(
            (
                ("train", "workers"),
                "workers with async_rollouts' process worker: the forked sampler would share the worker pool's "
                "pipes with the trainer; use async_rollouts.worker: thread, or drop workers",
            )
        )
    return out


class Pooled(Hooks):
    """The run's pool, opened when the run starts (its tasks built, so the user's modules are
    imported and forked workers unpickle their classes; before the progress bar's thread, so the
    fork copies no thread mid-lock) and closed at the end of the run (a run that fails before
    its loop leaves them to the process's exit: the workers are daemons, and Ray shuts down at exit)."""

    def __init__(self, block: Workers):
        from temper.rollout.env_workers import open_pool

        self.pool = open_pool(block.kind, block.actors, block.address)

    def envs(self, envs_G_N: list[list[Any]]) -> list[list[Any]]:
        if self.pool is None:
            raise RuntimeError("the worker pool is closed")
        return self.pool.place(envs_G_N)

    def close(self) -> None:
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.close()


def describe(config: Any) -> str:
    block: Workers | None = config.workers
    if block is None:
        return ""
    where = f" at {block.address}" if block.address else ""
    return f", envs in {block.actors} {block.kind} worker(s){where}"


def start(config: Any, run: RunStart) -> Hooks | None:
    return None if config.workers is None else Pooled(config.workers)


FEATURE = RLFeature(
    name="workers",
    block=Workers | None,
    doc="Environments and reward functions played in worker processes (kind: local) or Ray actors "
    "(kind: ray), a group per worker; results equal the in-process run's.",
    order=95,
    rules=rules,
    describe=describe,
    summary=lambda config, folder: {"workers": asdict(config.workers)} if config.workers else {},
    hashed=lambda config: {},
    start=start,
)
