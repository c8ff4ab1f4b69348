"""The parallel-decomposition reward of an orchestrator episode (Kimi K2.5's PARL, Kimi Team 2026,
§4.2: r = r_perf + lambda_1 r_parallel + lambda_2 r_finish, the auxiliary weights annealed to 0).

Per episode, from its step signals summed (`steps`, `critical_steps`, `subagents`, `answered`,
`unused`, as `temper.envs.orchestrator` emits them):

    m       = 1 - critical_path / total_steps                  the share of the work done off the
                                                               critical path (0: all serial)
    w(t)    = w0 * max(0, 1 - (t - 1) / N)                     schedule linear, t the 1-based step
            = w0                                               schedule constant (or N = 0)
    term    = w(t) * m * [answered and unused = 0]  -  c * unused / max(subagents, 1)

added to the outcome (success). The completion constraint is the indicator and the penalty: the
bonus is paid only to an episode that answered using every sub-agent result, and an unused
result costs c times its share, so spawning junk workers to inflate m does not pay. The penalty
is not annealed: it keeps the final objective honest after w(t) has reached 0. (An episode that
never answers is charged only for the results no answer could use, not for the others: charging
every spawn of a failed episode teaches the policy to stop spawning, the serial collapse PARL's
r_parallel is there to prevent.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict

Loc = tuple[str | int, ...]


@dataclass
class ParallelSpec:
    """The parallel reward of an rl stage (r_parallel, its anneal schedule, the completion constraint)."""

    weight: float = 0.5
    """w0: the weight of the parallel measure m at step 1."""
    anneal_steps: int = 10
    """N: steps over which a linear schedule takes the weight from w0 to 0 (0: never annealed)."""
    schedule: Literal["linear", "constant"] = "linear"
    """linear: w0 -> 0 over anneal_steps; constant: w0 at every step."""
    unused_penalty: float = 0.5
    """c: the penalty per share of sub-agent results the answer does not use (not annealed)."""


ParallelSpec.__pydantic_config__ = ConfigDict(
    extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
)


def weight_at(spec: ParallelSpec, step: int) -> float:
    """w(t) of the module docstring at the 1-based step `step`."""
    if spec.schedule == "constant" or spec.anneal_steps == 0:
        return spec.weight
    return spec.weight * max(0.0, 1.0 - (step - 1) / spec.anneal_steps)


def parallel_measure(total_steps: float, critical_path: float) -> float:
    """m = 1 - critical_path / total_steps (0 for an episode of no steps)."""
    return 1.0 - critical_path / total_steps if total_steps > 0 else 0.0


def parallel_term(
    totals: Mapping[str, float], spec: ParallelSpec, step: int
) -> tuple[dict[str, float], float]:
    """An episode's summed signals -> (parts to log, the term added to its reward)."""
    m = parallel_measure(totals.get("steps", 0.0), totals.get("critical_steps", 0.0))
    unused, spawned = totals.get("unused", 0.0), totals.get("subagents", 0.0)
    w = weight_at(spec, step)
    paid = totals.get("answered", 0.0) > 0 and unused == 0
    term = (w * m if paid else 0.0) - spec.unused_penalty * unused / max(spawned, 1.0)
    return {"parallel": m, "parallel_weight": w, "unused_share": unused / max(spawned, 1.0)}, term


def parallel_errors(spec: ParallelSpec | None, rewards: Mapping[str, float]) -> list[tuple[Loc, str]]:
    """The rules a `train.parallel` block breaks, located below `train`."""
    if spec is None:
        return []
    out: list[tuple[Loc, str]] = []
    for name in ("weight", "unused_penalty"):
        if getattr(spec, name) < 0:
            out.append((("parallel", name), f"must be >= 0 (got {getattr(spec, name):g})"))
    if spec.anneal_steps < 0:
        out.append((("parallel", "anneal_steps"), f"must be >= 0 (got {spec.anneal_steps})"))
    if rewards.get("outcome", 0.0) <= 0:
        out.append((("rewards",), "the parallel reward is auxiliary: give `outcome` a weight > 0"))
    return out
