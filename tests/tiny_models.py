"""Tiny models several test files build the same way (the `nano` preset itself is the `nano`
fixture of conftest.py); imported by name like fakes.py."""

import torch

from temper.models import build_preset


def perturbed_nano(tokenizer, seed=3):
    """A nano model a little away from its init, so the policy differs from the reference."""
    model = build_preset("nano", tokenizer, seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) * 0.05)
    return model
