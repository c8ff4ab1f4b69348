"""Verified path rewards (RLVP): the outcome plus named, verifiable facts about how the episode went.

An environment counts verifiable events per step in `StepResult.signals` (a test file edited, the
tests run before submitting, the failing test reproduced); its task declares each signal's kind in
`path_signals: dict[str, str]`:

    violation   a rule verifiably broken (counted per step)
    compliance  a rule verifiably kept (counted per step, or once at the end)
    progress    a verified milestone reached

A recipe's rl `train:` block composes them:

    path:
      beta: 0.5
      rules:
        - {violation: test_edited, penalty: 1.0, compliance: tests_untouched, reward: 0.5}
      milestones: {failure_reproduced: 0.2}

and the reward of episode i of a group of N is

    Phi_i = sum_rules (reward * compliance_i - penalty * violation_i) + sum_m weight_m * milestone_i
    R_i   = sum_c w_c r_c,i  +  beta * (Phi_i - mean_N Phi) / (std_N Phi + eps)

with the signals summed over the episode's steps. The four principles of RLVP, each enforced
when the recipe is validated (`path_errors`, `signal_errors`) and again when RL starts:
1. penalize only verifiable actions, never lack of progress: a rule's `violation` must be a signal
   the stage's tasks declare as a "violation" (a "progress" signal is not a penalty);
2. always keep the outcome term: `rewards` must weigh `outcome` above 0;
3. pair every penalty with a compliance reward: each rule names a declared "compliance" signal and
   a `reward` > 0;
4. normalize path signals separately from the outcome: by construction, Phi enters the reward
   only through its own within-group z-score above; `rewards` can name only reward components
   (functions of the outcome grade, length and process reward), and a path signal named there is
   refused with this principle's message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict

from temper.tasks.base import path_signals_of

KINDS = ("violation", "compliance", "progress")
"""The kinds a task may declare for a path signal."""

PRINCIPLES = {
    1: "RLVP principle 1: penalize only verifiable actions, never lack of progress",
    2: "RLVP principle 2: always keep the outcome term",
    3: "RLVP principle 3: pair every penalty with a compliance reward",
    4: "RLVP principle 4: normalize path signals separately from the outcome",
}

_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)


@dataclass
class PathRule:
    """One rule: a penalty per verified violation paired with a reward per verified compliance."""

    violation: str
    """A signal the tasks declare with kind "violation" (counted per step)."""
    penalty: float = 1.0
    """lambda: subtracted from Phi per violation (> 0)."""
    compliance: str | None = None
    """The paired signal the tasks declare with kind "compliance" (RLVP principle 3: required)."""
    reward: float = 0.0
    """mu: added to Phi per compliance event (> 0, RLVP principle 3)."""


@dataclass
class PathSpec:
    """Path rewards of an RL stage (RLVP): Phi from paired rules and milestones, z-scored within
    each group apart from the outcome, added to the reward with weight beta."""

    beta: float = 0.5
    """Weight of the normalized path term in the reward (> 0)."""
    rules: list[PathRule] = field(default_factory=list)
    """Paired penalty/compliance rules: [{violation, penalty, compliance, reward}]."""
    milestones: dict[str, float] = field(default_factory=dict)
    """Declared "progress" signals and their weight per event (MiRA-style milestone rewards)."""
    eps: float = 1e-6
    """Added to the group std of Phi (as grpo_eps)."""


PathRule.__pydantic_config__ = _STRICT  # unknown keys in a recipe's rule are errors
PathSpec.__pydantic_config__ = _STRICT

Loc = tuple[str | int, ...]


def episode_totals(signals: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Every numeric signal (bools count as 0/1) summed over an episode's steps; strings are left out."""
    totals: dict[str, float] = {}
    for step in signals:
        for k, v in step.items():
            if isinstance(v, bool | int | float):
                totals[k] = totals.get(k, 0.0) + float(v)
    return totals


def phi(totals: Mapping[str, float], spec: PathSpec) -> float:
    """The raw path score of one episode from its signal totals (a missing signal counts 0):

    Phi = sum_rules (mu * compliance - lambda * violation) + sum_m w_m * milestone_m
    """
    score = sum(
        (r.reward * totals.get(r.compliance, 0.0) if r.compliance else 0.0)
        - r.penalty * totals.get(r.violation, 0.0)
        for r in spec.rules
    )
    return score + sum(w * totals.get(name, 0.0) for name, w in spec.milestones.items())


def normalize_in_group(phi_N: Sequence[float], eps: float = 1e-6) -> list[float]:
    """The z-score of each episode's Phi within its group of N, apart from the outcome:

        z_i = (Phi_i - mean_N Phi) / (std_N Phi + eps)

    std is the unbiased sample std (divides by N - 1), as `temper.algorithms.advantages.grpo`.
    A group whose Phi are all equal (or of one episode) gets zeros: no path signal, no term."""
    n = len(phi_N)
    if n < 2 or max(phi_N) - min(phi_N) <= 1e-12:
        return [0.0] * n
    mean = sum(phi_N) / n
    std = math.sqrt(sum((p - mean) ** 2 for p in phi_N) / (n - 1))
    return [(p - mean) / (std + eps) for p in phi_N]


def declared_signals(tasks: Mapping[str, Any] | Iterable[Any]) -> tuple[dict[str, str], list[str]]:
    """(signal -> kind) declared by the tasks' `path_signals`, and a message per bad declaration
    (a kind not in KINDS, one name declared with two kinds by two tasks). `tasks`: name -> Task,
    or Tasks."""
    named = tasks.items() if isinstance(tasks, Mapping) else ((getattr(t, "name", "?"), t) for t in tasks)
    kinds: dict[str, str] = {}
    by: dict[str, str] = {}
    conflicts: list[str] = []
    for name, task in named:
        for signal, kind in path_signals_of(task).items():
            if kind not in KINDS:
                conflicts.append(
                    f"task {name!r} declares path signal {signal!r} of kind {kind!r}; kinds: {', '.join(KINDS)}"
                )
                continue
            if signal in kinds and kinds[signal] != kind:
                conflicts.append(
                    f"path signal {signal!r} is declared {kinds[signal]!r} by task {by[signal]!r} "
                    f"and {kind!r} by task {name!r}"
                )
                continue
            kinds.setdefault(signal, kind)
            by.setdefault(signal, name)
    return kinds, conflicts


def path_errors(spec: PathSpec | None, rewards: Mapping[str, float]) -> list[tuple[Loc, str]]:
    """The rules a `train:` block's path spec breaks that need no task, located below `train`:
    beta > 0, principle 2 (outcome weight > 0), principle 3 (every rule paired with a compliance
    signal and a reward > 0), penalties and milestone weights > 0 (principle 1: a negative
    weight would reward a violation or penalize progress)."""
    if spec is None:
        return []
    out: list[tuple[Loc, str]] = []
    if spec.beta <= 0:
        out.append((("path", "beta"), f"must be > 0 (got {spec.beta:g}); remove `path` for outcome-only RL"))
    if spec.eps < 0:
        out.append((("path", "eps"), f"must be >= 0 (got {spec.eps:g})"))
    if rewards.get("outcome", 0.0) <= 0:
        out.append(
            (
                ("rewards",),
                f"{PRINCIPLES[2]}: with `path` set, `rewards` must weigh `outcome` above 0 "
                f"(got {dict(rewards)}); path signals say how, not whether, the task was done",
            )
        )
    if not spec.rules and not spec.milestones:
        out.append(
            (("path",), "names no rule and no milestone: give `rules` or `milestones`, or remove `path`")
        )
    for i, rule in enumerate(spec.rules):
        if rule.penalty <= 0:
            out.append(
                (
                    ("path", "rules", i, "penalty"),
                    f"{PRINCIPLES[1]}: the penalty per {rule.violation!r} must be > 0 (got {rule.penalty:g})",
                )
            )
        if rule.compliance is None:
            out.append(
                (
                    ("path", "rules", i),
                    f"{PRINCIPLES[3]}: the penalty for {rule.violation!r} has no `compliance` signal "
                    "rewarding the rule kept; add `compliance: <signal>` and `reward: <mu > 0>`",
                )
            )
        elif rule.reward <= 0:
            out.append(
                (
                    ("path", "rules", i, "reward"),
                    f"{PRINCIPLES[3]}: the compliance reward for {rule.compliance!r} must be > 0 "
                    f"(got {rule.reward:g})",
                )
            )
    for name, weight in spec.milestones.items():
        if weight <= 0:
            out.append(
                (
                    ("path", "milestones", name),
                    f"{PRINCIPLES[1]}: a milestone rewards verified progress: its weight must be > 0 "
                    f"(got {weight:g}); a weight below 0 would penalize progress",
                )
            )
    return out


def signal_errors(
    spec: PathSpec | None, rewards: Mapping[str, float], tasks: Mapping[str, Any] | Iterable[Any]
) -> list[tuple[Loc, str]]:
    """The rules that need the stage's tasks' declared `path_signals`, located below `train`:
    each rule's violation is a declared "violation" (principle 1), its compliance a declared
    "compliance" (principle 3), each milestone a declared "progress"; no declared path signal is
    a plain reward component (principle 4)."""
    kinds, conflicts = declared_signals(tasks)
    out: list[tuple[Loc, str]] = [(("path",), c) for c in conflicts]
    declared = ", ".join(f"{s} ({k})" for s, k in sorted(kinds.items())) or "none"
    for name in rewards:
        if name in kinds:
            out.append(
                (
                    ("rewards", name),
                    f"{PRINCIPLES[4]}: {name!r} is a path signal ({kinds[name]}); put it in `path` "
                    "(rules or milestones), where it is normalized within the group apart from the outcome",
                )
            )
    if spec is None:
        return out

    def check(loc: Loc, signal: str, want: str, principle: int, role: str) -> None:
        kind = kinds.get(signal)
        if kind is None:
            out.append((loc, f"unknown path signal {signal!r}: the stage's tasks declare {declared}"))
        elif kind != want:
            why = {
                "progress": "penalizing it would penalize lack of progress",
                "violation": "it counts a rule broken, not kept",
                "compliance": "it counts a rule kept, not broken",
            }[kind]
            out.append(
                (loc, f"{PRINCIPLES[principle]}: {role} {signal!r} is a {kind!r} signal, not {want!r}: {why}")
            )

    for i, rule in enumerate(spec.rules):
        check(("path", "rules", i, "violation"), rule.violation, "violation", 1, "the penalized signal")
        if rule.compliance is not None:
            check(
                ("path", "rules", i, "compliance"), rule.compliance, "compliance", 3, "the paired compliance"
            )
    for name in spec.milestones:
        if name not in kinds:
            out.append(
                (
                    ("path", "milestones", name),
                    f"unknown path signal {name!r}: the stage's tasks declare {declared}",
                )
            )
        elif kinds[name] != "progress":
            out.append(
                (
                    ("path", "milestones", name),
                    f"a milestone must be a 'progress' signal; {name!r} is {kinds[name]!r} "
                    "(penalties and compliance go in `rules`)",
                )
            )
    return out


def path_metrics(
    totals: Sequence[Mapping[str, float]],
    kinds: Mapping[str, str],
    phis: Sequence[float] | None = None,
) -> dict[str, float]:
    """Per-step path metrics over N episodes' signal totals, for the declared signal kinds:
    path/violations (violation events per episode, all kinds summed) and per signal
    path/violations/<name>; path/compliance_rate = compliance / (compliance + violation) events
    (absent when there was none of either); path/phi, the mean raw Phi, when a spec is in use."""
    n = max(len(totals), 1)
    violations = [s for s, k in sorted(kinds.items()) if k == "violation"]
    compliance = [s for s, k in kinds.items() if k == "compliance"]
    per = {s: sum(t.get(s, 0.0) for t in totals) for s in violations}
    row = {"path/violations": sum(per.values()) / n}
    row |= {f"path/violations/{s}": v / n for s, v in per.items()}
    kept = sum(t.get(s, 0.0) for t in totals for s in compliance)
    if kept + sum(per.values()) > 0:
        row["path/compliance_rate"] = kept / (kept + sum(per.values()))
    if phis is not None:
        row["path/phi"] = sum(phis) / max(len(phis), 1)
    return row
