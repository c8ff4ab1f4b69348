import math

import pytest
import torch

from temper.algorithms.losses import IGNORE, sft_loss
from temper.algorithms.policy import entropy_from_logits
from temper.algorithms.process_reward import step_bce_loss


def test_sft_loss_equals_hand_computed_cross_entropy():
    # one sequence of 3 tokens over a vocabulary of 2; the labels of positions 1 and 2 are
    # predicted from positions 0 and 1; position 2's logits predict nothing.
    logits = torch.tensor([[[0.0, 0.0], [1.0, 3.0], [5.0, 5.0]]])
    labels = torch.tensor([[IGNORE, 1, 0]])
    expected = (-math.log(0.5) - math.log(math.exp(1) / (math.exp(1) + math.exp(3)))) / 2
    assert math.isclose(sft_loss(logits, labels).item(), expected, rel_tol=1e-6)


def test_ignored_labels_do_not_count_and_num_tokens_normalizes():
    logits = torch.tensor([[[0.0, 0.0], [1.0, 3.0], [5.0, 5.0]]])
    labels = torch.tensor([[IGNORE, IGNORE, 0]])
    nll = -math.log(math.exp(1) / (math.exp(1) + math.exp(3)))
    assert math.isclose(sft_loss(logits, labels).item(), nll, rel_tol=1e-6)
    assert math.isclose(sft_loss(logits, labels, num_tokens=4).item(), nll / 4, rel_tol=1e-6)


def test_all_ignored_gives_zero_not_nan():
    logits = torch.zeros(1, 3, 4)
    assert sft_loss(logits, torch.full((1, 3), IGNORE)).item() == 0.0


@pytest.mark.parametrize(
    "loss",
    [
        lambda z: sft_loss(z, torch.tensor([[IGNORE, 1, 0]])),
        lambda z: entropy_from_logits(z),
        lambda z: step_bce_loss(z[..., 0], torch.tensor([[IGNORE, 1, 0]])),
    ],
    ids=["sft_loss", "entropy_from_logits", "step_bce_loss"],
)
def test_a_loss_is_at_least_fp32_and_keeps_float64(loss):
    """bf16 logits are upcast; a float64 model's are not cast down (its losses and gradients keep
    the rounding that makes the pinned recipes agree across CPUs)."""
    logits = torch.tensor([[[0.0, 0.0], [1.0, 3.0], [5.0, 5.0]]])
    assert loss(logits.bfloat16()).dtype == torch.float32
    assert loss(logits.double()).dtype == torch.float64
    exact, rounded = loss(logits.double()), loss(logits).double()
    assert torch.allclose(exact, rounded, rtol=1e-6) and not torch.equal(exact, rounded)
