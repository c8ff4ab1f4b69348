"""Why GRPO groups carry no signal: the zero-variance breakdown behind the reachability probe.

A group whose samples all get the same reward has zero advantage under every group-relative
estimator, so it teaches nothing. The cause decides the fix: all correct (task too easy: harder
problems), all wrong (too hard or the base cannot reach it: SFT or a curriculum), parse failure
(format not learned: SFT is not done), truncated (max_new_tokens too small, or generation does not
stop at the template's end of turn: `temper.models.chat.stop_warning`), verifier error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from temper.tasks.base import Score

CAUSES = ("all_correct", "all_wrong", "parse_failure", "truncated", "verifier_error", "equal_other")
ADVICE = {  # cause -> what it means and what to do; the probe's console warning and the report say it
    "all_correct": "every sample already right: too easy to learn from; use harder problems",
    "all_wrong": "no sample right: too hard for this policy; more SFT, easier problems or a larger group",
    "parse_failure": "no answer could be parsed: the format is not learned; SFT first, or a format reward",
    "truncated": (
        "every sample hit max_new_tokens: raise max_new_tokens, unless the samples ran past the chat "
        "template's end of turn (the probe then names it: set model.eos_token)"
    ),
    "verifier_error": "the grader failed: check the task's verifier",
    "equal_other": "parsed but equal partial rewards: check the reward components",
}
NO_SIGNAL_SHARE = 0.9
"""Share of zero-variance groups from which on the probe warns: too few groups left to learn from."""
NO_SIGNAL_WARNING = "Almost no group carries a learning signal: RL is unlikely to move."


def advice(cause: str) -> str:
    return ADVICE.get(cause, "")


def zero_variance_cause(
    scores: Sequence[Score], rewards: Sequence[float], truncated: Sequence[bool]
) -> str | None:
    """None if the group's rewards differ; otherwise the reason they are all equal."""
    if max(rewards) - min(rewards) > 1e-9:
        return None
    if any(s.details.get("reason") == "verifier_error" for s in scores):
        return "verifier_error"
    if all(truncated):
        return "truncated"
    if all(s.correct for s in scores):
        return "all_correct"
    if not any(s.parsed for s in scores):
        return "parse_failure"
    if not any(s.correct for s in scores):
        return "all_wrong"
    return "equal_other"


def breakdown(causes: Sequence[str | None]) -> dict[str, float]:
    """Share of groups with zero variance, total and by cause (shares of all groups)."""
    n = max(len(causes), 1)
    counts = Counter(c for c in causes if c is not None)
    out = {"zero_variance": sum(counts.values()) / n}
    out.update({f"zero_variance/{cause}": counts.get(cause, 0) / n for cause in CAUSES})
    return out
