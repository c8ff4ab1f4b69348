"""Learning-rate schedules as pure functions of the step (so a resume needs no scheduler state)."""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "cosine", "wsd"]


def lr_at(
    step: int,
    *,
    lr: float,
    max_steps: int,
    warmup_steps: int,
    schedule: Schedule,
    min_lr_ratio: float = 0.1,
    decay_fraction: float = 0.2,
) -> float:
    """Learning rate for optimizer step `step` (0-based).

    warmup: lr * (step + 1) / warmup_steps for step < warmup_steps, then
    cosine:   min + (lr - min) * (1 + cos(pi * p)) / 2, p = progress after warmup in [0, 1];
    wsd:      warmup-stable-decay (Hu et al. 2024, MiniCPM): constant, then linear decay to min
              over the last `decay_fraction` of the steps;
    constant: lr.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    floor = lr * min_lr_ratio
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        p = (step - warmup_steps) / max(1, max_steps - warmup_steps - 1)
        return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))
    if schedule == "wsd":
        decay_steps = max(1, int(max_steps * decay_fraction))
        decay_start = max_steps - decay_steps
        if step < decay_start:
            return lr
        p = (step - decay_start + 1) / decay_steps
        return lr + (floor - lr) * min(1.0, p)
    raise ValueError(f"unknown schedule {schedule!r}; valid: cosine, wsd, constant")
