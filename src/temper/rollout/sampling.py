"""The token choice: pure functions of the logits (and of uniform numbers drawn beforehand)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


def choose_tokens(
    logits_B_V: torch.Tensor,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    uniform_B: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row -> (token_B, logprob_B).

    uniform_B: the uniform number in [0, 1) each row's draw uses; None draws them from `generator`.

    logprob_B = log softmax(logits / T)[token], before truncation (T = 1 when greedy). Sampling
    draws from softmax(logits / T) restricted to the top_k largest logits (0 = all), then to the
    smallest set whose probability reaches top_p (the nucleus, Holtzman et al. 2020), renormalized;
    the order matches transformers and vLLM (temperature, top-k, top-p).
    """
    import torch

    logits_B_V = logits_B_V.float()
    if temperature == 0.0:
        logp_B_V = torch.log_softmax(logits_B_V, dim=-1)
        token_B = logp_B_V.argmax(dim=-1)
    else:
        logp_B_V = torch.log_softmax(logits_B_V / temperature, dim=-1)
        if top_k <= 0 and top_p >= 1.0:
            probs_B_V = logp_B_V.exp()
        else:
            probs_B_V = torch.softmax(_truncate(logp_B_V, top_p, top_k), dim=-1)
        if uniform_B is None:
            uniform_B = torch.rand(
                probs_B_V.shape[0], generator=generator, device=probs_B_V.device, dtype=probs_B_V.dtype
            )
        token_B = _draw(probs_B_V, uniform_B)
    return token_B, logp_B_V.gather(-1, token_B[:, None]).squeeze(-1)


def _draw(probs_B_V: torch.Tensor, uniform_B: torch.Tensor) -> torch.Tensor:
    """One draw per row by inverting the CDF at the row's uniform number: the distribution of
    `torch.multinomial(probs, 1)`, whose exponential noise over the whole vocabulary cost ~4% of a
    CPU decode step. A zero-probability token is never drawn (its CDF step is empty); if rounding
    puts u * total at the very top of the CDF, the row takes its most likely token."""
    import torch

    cdf_B_V = probs_B_V.cumsum(dim=-1)
    u_B_1 = uniform_B.to(cdf_B_V.dtype)[:, None]
    token_B_1 = torch.searchsorted(cdf_B_V, u_B_1 * cdf_B_V[:, -1:], right=True)
    overflow_B_1 = token_B_1 >= probs_B_V.shape[-1]
    token_B_1 = torch.where(overflow_B_1, probs_B_V.argmax(dim=-1, keepdim=True), token_B_1)
    return token_B_1.squeeze(-1)


def _truncate(logp_B_V: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Set the log-probs outside the top-k / top-p set to -inf (at least one token survives)."""
    import torch

    if 0 < top_k < logp_B_V.shape[-1]:
        kth_B_1 = logp_B_V.topk(top_k, dim=-1).values[:, -1:]
        logp_B_V = logp_B_V.masked_fill(logp_B_V < kth_B_1, float("-inf"))
    if top_p < 1.0:
        sorted_B_V, order_B_V = logp_B_V.sort(dim=-1, descending=True)
        probs_B_V = torch.softmax(sorted_B_V, dim=-1)
        mass_before_B_V = probs_B_V.cumsum(dim=-1) - probs_B_V  # mass of the better tokens
        drop_B_V = mass_before_B_V >= top_p
        drop_B_V[:, 0] = False
        logp_B_V = logp_B_V.masked_fill(drop_B_V.scatter(-1, order_B_V, drop_B_V), float("-inf"))
    return logp_B_V


def row_uniforms(row_seeds: list[int], steps: int, device: torch.device) -> torch.Tensor:
    """(rows, steps) uniform numbers in [0, 1), row r from a generator seeded with row_seeds[r]."""
    import torch

    gen = torch.Generator()
    out_R_T = torch.empty((len(row_seeds), steps), dtype=torch.float32)
    for r, s in enumerate(row_seeds):
        torch.rand(steps, generator=gen.manual_seed(s), out=out_R_T[r])
    return out_R_T.to(device)
