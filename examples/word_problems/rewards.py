"""Reward functions for problems.jsonl, written exactly as for TRL's GRPOTrainer(reward_funcs=...).

Each gets the batch's completions (strings, or [{"role": "assistant", "content": ...}] lists when
the prompt is a list of messages) and every other column of the rows as keyword lists, and returns
one float per completion. temper calls them the same way (`rewards: [rewards:correct, ...]`).
"""

import re

ANSWER = re.compile(r"Answer:\s*(-?\d+)\s*$")


def _text(completion):
    return completion[0]["content"] if isinstance(completion, list) else completion


def correct(completions, answer, **kwargs):
    """1.0 when the final `Answer: N` line equals the row's answer, else 0.0."""
    found = [ANSWER.search(_text(c).strip()) for c in completions]
    return [1.0 if m and m.group(1) == str(a) else 0.0 for m, a in zip(found, answer)]


def formatted(completions, **kwargs):
    """1.0 when the completion ends with an `Answer: N` line (right or wrong), else 0.0."""
    return [1.0 if ANSWER.search(_text(c).strip()) else 0.0 for c in completions]
