"""Preference losses (DPO, cDPO, IPO, KTO; the reward model's Bradley-Terry): pure functions over
summed sequence logprobs (the reward model's: over its scalar rewards).

Inputs are per-sequence log-probabilities of the completion (the sum over its tokens) under the
policy and under the frozen reference, shape (B,). Each loss returns the per-example loss (B,),
so the caller reduces it (sum over a micro-batch / size of the whole batch: the split never
changes a gradient), and the implicit rewards r = beta (log pi - log ref), detached, for metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


def implicit_rewards(logp_B: torch.Tensor, ref_logp_B: torch.Tensor, beta: float) -> torch.Tensor:
    """r(x, y) = beta (log pi(y|x) - log ref(y|x)), detached (Rafailov et al. 2023 §5)."""
    return beta * (logp_B - ref_logp_B).detach()


def dpo_loss(
    chosen_logp_B: torch.Tensor,
    rejected_logp_B: torch.Tensor,
    ref_chosen_logp_B: torch.Tensor,
    ref_rejected_logp_B: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Sigmoid DPO (Rafailov et al. 2023 eq. 7), with conservative label smoothing (cDPO,
    Mitchell 2023, "A note on DPO with noisy preferences"):

        h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))
        l = -(1 - eps) log sigma(beta h) - eps log sigma(-beta h)

    eps is the assumed probability that a preference label is flipped; eps = 0 is plain DPO (TRL
    `loss_type="sigmoid"`). With eps > 0 the loss is minimal at a finite margin, h = log((1-eps)/eps)
    / beta, instead of pushing h to infinity. -> (B,)
    """
    import torch.nn.functional as F

    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    h = (chosen_logp_B - ref_chosen_logp_B) - (rejected_logp_B - ref_rejected_logp_B)
    return -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)


def ipo_loss(
    chosen_logp_B: torch.Tensor,
    rejected_logp_B: torch.Tensor,
    ref_chosen_logp_B: torch.Tensor,
    ref_rejected_logp_B: torch.Tensor,
    chosen_tokens_B: torch.Tensor,
    rejected_tokens_B: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """IPO (Azar et al. 2023 eq. 17, beta = tau), on per-token averaged log-ratios as TRL computes it
    (the IPO authors' normalization, so tau does not depend on completion length):

        h = (log pi(y_w) - log ref(y_w)) / |y_w| - (log pi(y_l) - log ref(y_l)) / |y_l|
        l = (h - 1 / (2 beta))^2

    A squared loss: it regresses the margin to 1/(2 beta) instead of pushing it up forever. -> (B,)
    """
    h = (chosen_logp_B - ref_chosen_logp_B) / chosen_tokens_B.clamp_min(1) - (
        rejected_logp_B - ref_rejected_logp_B
    ) / rejected_tokens_B.clamp_min(1)
    return (h - 1 / (2 * beta)) ** 2


def kto_kl(kl_logp_B: torch.Tensor, ref_kl_logp_B: torch.Tensor) -> torch.Tensor:
    """The KTO reference point z0 (Ethayarajh et al. 2024 eq. 7), estimated as TRL does from
    mismatched pairs (prompt x_i with the completion y_j of another example of the batch):

        z0 = max(0, mean_i (log pi(y_j | x_i) - log ref(y_j | x_i)))

    Detached: no gradient flows through the reference point. A 0-dim tensor.
    """
    return (kl_logp_B - ref_kl_logp_B).mean().detach().clamp_min(0)


def kto_loss(
    logp_B: torch.Tensor,
    ref_logp_B: torch.Tensor,
    desirable_B: torch.Tensor,
    kl: torch.Tensor | float,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> torch.Tensor:
    """KTO (Ethayarajh et al. 2024 eq. 7) on unpaired completions labelled desirable or not:

        r = log pi(y|x) - log ref(y|x)
        l = w_D (1 - sigma(beta (r - z0)))     y desirable
        l = w_U (1 - sigma(beta (z0 - r)))     y undesirable

    z0 is `kto_kl` (a constant). The weights balance unequal numbers of desirable and undesirable
    examples (the paper recommends w_D n_D / (w_U n_U) in [1, 4/3]). -> (B,)
    """
    import torch

    r = logp_B - ref_logp_B
    desirable_B = desirable_B.bool()
    good = desirable_weight * (1 - torch.sigmoid(beta * (r - kl)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (kl - r)))
    return torch.where(desirable_B, good, bad)


def bradley_terry_loss(
    chosen_rewards_B: torch.Tensor,
    rejected_rewards_B: torch.Tensor,
    margin_B: torch.Tensor | float = 0.0,
    center_coef: float = 0.0,
) -> torch.Tensor:
    """The reward model's pairwise loss: the negative log-likelihood of the preference under the
    Bradley-Terry model P(y_c > y_r | x) = sigma(r(x, y_c) - r(x, y_r)) (Bradley & Terry 1952;
    Ouyang et al. 2022 eq. 1), with Llama 2's optional margin m (Touvron et al. 2023 eq. 2: a pair
    rated far apart must be separated by at least m) and the reward-centering term of Eisenstein
    et al. 2023 (keeps rewards near 0; the loss alone is shift-invariant):

        l = -log sigma(r_c - r_r - m) + c (r_c + r_r)^2

    as TRL's RewardTrainer computes it per pair (`margin` column, `center_rewards_coefficient`).
    The gradient raises r_c and lowers r_r, by sigma(-(r_c - r_r - m)) each. -> (B,)
    """
    import torch.nn.functional as F

    diff_B = chosen_rewards_B - rejected_rewards_B - margin_B
    loss_B = -F.logsigmoid(diff_B)
    if center_coef:
        loss_B = loss_B + center_coef * (chosen_rewards_B + rejected_rewards_B) ** 2
    return loss_B
