"""AdaptThink (Zhang et al. 2025, "AdaptThink: Reasoning Models Can Learn When to Think",
arXiv:2505.13417): the advantage that teaches a two-mode model when to skip its scratchpad.

The paper's constrained objective: maximize the share of no-thinking (direct) answers subject to
the accuracy not falling below the reference model's,

    max E[1(y_1 = direct)]   s.t.   E[R(x, y)] >= E[R_ref(x)],

is relaxed with a penalty 1/delta on the constraint and multiplied by delta, which leaves one
per-sample advantage (their §4.1):

    A(x, y) = delta * 1(y_1 = direct) + R(x, y) - Rbar_ref(x)

Rbar_ref(x) is the reference model's mean accuracy on prompt x, pre-sampled before training (the
paper: K = 16 thinking samples of the original model; its code, THU-KEG/AdaptThink
`adapt_think_reward_manager.py`, puts `acc - ref_mean_acc_thinking (+ nothinking_bonus)` in the
reward and uses it as the advantage as is: no group mean, no std). A direct answer wins only when
it is correct often enough that delta covers the accuracy it gives up; delta is the price of
accuracy in length.

Importance sampling at the first token (the paper's pi_IS, §4.2): the rollout forces the first
token to the direct marker in a share `s` of each group's samples and to the thinking marker in
the rest, and samples the remaining tokens from pi_old, so

    pi_IS(y_1 = direct) = s,  pi_IS(y_1 = think) = 1 - s,  pi_IS(y_t) = pi_old(y_t)  (t > 1)

and the clipped ratio pi_theta / pi_IS keeps both modes in every group even after the policy has
all but stopped choosing one of them (the cold-start problem the paper names). The paper uses
s = 0.5. `first_token_logprobs` is the log pi_IS the rollout records for the forced token.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


def adaptthink_advantages(
    rewards_G_N: torch.Tensor, direct_G_N: torch.Tensor, ref_accuracy_G: torch.Tensor, delta: float
) -> torch.Tensor:
    """Per-sample AdaptThink advantage (Zhang et al. 2025 §4.1), G prompts x N samples:

        A_gn = delta * 1(direct_gn) + r_gn - Rbar_ref_g

    rewards_G_N: the verifier's reward (accuracy in the paper); direct_G_N: bool, the sample
    answered in the direct mode; ref_accuracy_G: the reference model's mean accuracy on prompt g.
    There is no group normalization: Rbar_ref is the baseline, so a group whose samples are all
    right (or all wrong) still learns which mode to prefer.
    """
    if rewards_G_N.dim() != 2 or direct_G_N.shape != rewards_G_N.shape:
        raise ValueError(
            f"rewards and direct flags must both be (G, N), got {tuple(rewards_G_N.shape)} and "
            f"{tuple(direct_G_N.shape)}"
        )
    if ref_accuracy_G.shape != rewards_G_N.shape[:1]:
        raise ValueError(
            f"ref_accuracy must be (G,) = ({rewards_G_N.shape[0]},), got {tuple(ref_accuracy_G.shape)}"
        )
    rewards_G_N = rewards_G_N if rewards_G_N.is_floating_point() else rewards_G_N.float()
    bonus_G_N = delta * direct_G_N.to(rewards_G_N.dtype)
    return bonus_G_N + rewards_G_N - ref_accuracy_G.to(rewards_G_N.dtype)[:, None]


def first_token_logprobs(direct_R: torch.Tensor, direct_share: float) -> torch.Tensor:
    """log pi_IS of each row's forced first token (Zhang et al. 2025 §4.2):

        log s      where the row was forced to the direct marker
        log(1 - s) where it was forced to the thinking marker

    with s = direct_share in (0, 1) (the paper: 0.5)."""
    import torch

    if not 0.0 < direct_share < 1.0:
        raise ValueError(f"direct_share must be in (0, 1), got {direct_share}")
    return torch.where(direct_R.bool(), math.log(direct_share), math.log1p(-direct_share))
