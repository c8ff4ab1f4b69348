"""Turn-level credit for multi-turn episodes: process rewards per action, returns per turn, and the
maps between turns and the tokens that make them.

Shapes: R rows (episodes) x T completion tokens; K turn slots, K = the most actions of a row in the
batch. `turn_R_T` is the action index k of each completion token (`Trajectory.token_turns`), -1 where
the token is no action (environment tokens, padding). `step_rewards_R_K[r, k]` is the environment's
process reward after action k of row r, 0 past the row's `turns_R[r]` actions. Rows are prompt-major
(G prompts x N samples), as everywhere in `temper.algorithms`.

The per-turn estimators follow the step-level advantage of GiGPO (Feng et al. 2025, "Group-in-Group
Policy Optimization for LLM Agent Training", arXiv:2505.10978): a discounted return from each
step, normalized within a group of steps; GiGPO groups steps by an identical environment state
(anchor state), here they are grouped by turn index within a prompt's samples, which needs no state
hashing and suits environments whose turn k of every sample faces a comparable situation.
Turn-level credit with process and outcome rewards on GRPO is also MT-GRPO (Zeng et al. 2025,
arXiv:2505.11821).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temper.algorithms.advantages import grpo

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


def turn_valid(turns_R: torch.Tensor, k_count: int) -> torch.Tensor:
    """(R, K) True where row r has an action k, i.e. k < turns_R[r]."""
    import torch

    return torch.arange(k_count, device=turns_R.device)[None, :] < turns_R[:, None]


def turn_returns(
    step_rewards_R_K: torch.Tensor, outcome_R: torch.Tensor, turns_R: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """The discounted return from each turn of each row, the outcome arriving with the last action:

        G_{r,k} = sum_{j=k}^{K_r-1} gamma^{j-k} s_{r,j}  +  gamma^{K_r-1-k} o_r     for k < K_r
        G_{r,k} = 0                                                                  for k >= K_r

    s = step_rewards_R_K (process rewards), o = outcome_R, K_r = turns_R[r]. Computed backward as
    G_k = s_k + [k = K_r - 1] o + gamma G_{k+1}, so with one turn and s = 0 it is o exactly.
    A row with no action (K_r = 0) has no return. -> (R, K)
    """
    import torch

    if turns_R.numel() and int(turns_R.max()) > step_rewards_R_K.shape[1]:
        raise ValueError(
            f"a row has {int(turns_R.max())} turns but step_rewards has {step_rewards_R_K.shape[1]}"
        )
    dtype = outcome_R.dtype if outcome_R.is_floating_point() else torch.get_default_dtype()
    step_R_K, outcome_R = step_rewards_R_K.to(dtype), outcome_R.to(dtype)
    k_count = step_R_K.shape[1]
    valid_R_K = turn_valid(turns_R, k_count)
    last_R_K = torch.arange(k_count, device=turns_R.device)[None, :] == (turns_R - 1)[:, None]
    returns_R_K = torch.zeros_like(step_R_K)
    running_R = torch.zeros_like(outcome_R)
    for k in reversed(range(k_count)):
        reward_R = step_R_K[:, k] + torch.where(last_R_K[:, k], outcome_R, 0.0)
        running_R = torch.where(valid_R_K[:, k], reward_R + gamma * running_R, 0.0)
        returns_R_K[:, k] = running_R
    return returns_R_K


def per_turn_group_center(returns_G_N_K: torch.Tensor, valid_G_N_K: torch.Tensor) -> torch.Tensor:
    """The return minus the mean return of the group's rows that have turn k:

        A_{g,n,k} = G_{g,n,k} - mean_{n' : valid_{g,n',k}} G_{g,n',k}

    Exactly 0 where invalid and where the valid returns at (g, k) are all equal, in particular where
    only one row of the group has turn k (nothing to compare it with). -> (G, N, K)
    """
    import torch

    valid = valid_G_N_K.bool()
    count_G_1_K = valid.sum(dim=1, keepdim=True)
    mean_G_1_K = torch.where(valid, returns_G_N_K, 0.0).sum(dim=1, keepdim=True) / count_G_1_K.clamp_min(1)
    return torch.where(valid & ~_constant(returns_G_N_K, valid), returns_G_N_K - mean_G_1_K, 0.0)


def per_turn_group_normalize(
    returns_G_N_K: torch.Tensor, valid_G_N_K: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO's group normalization (Shao et al. 2024 §4.1.2) taken per turn index k:

        A_{g,n,k} = (G_{g,n,k} - mean_k) / (std_k + eps),   mean and std over {n' : valid_{g,n',k}}

    std is the unbiased sample std (divides by n_k - 1), as `advantages.grpo` (and TRL and verl), so
    that a single-turn batch gets GRPO's advantages; it is undefined for one row, and such a (g, k)
    gets 0, as do invalid slots and (g, k) whose valid returns are all equal. Where every row of the
    group has turn k this is `advantages.grpo` itself (bit for bit: the masked sums below round
    differently from torch.mean / torch.std); elsewhere the same formula over the rows having turn k.
    Needs N >= 2, as grpo. -> (G, N, K)
    """
    import torch

    g, n, k = returns_G_N_K.shape
    valid = valid_G_N_K.bool()
    centered = per_turn_group_center(returns_G_N_K, valid)
    count_G_1_K = valid.sum(dim=1, keepdim=True)
    std_G_1_K = (centered.pow(2).sum(dim=1, keepdim=True) / (count_G_1_K - 1).clamp_min(1)).sqrt()
    masked = torch.where(centered != 0, centered / (std_G_1_K + eps), 0.0)
    full_G_N_K = grpo(returns_G_N_K.transpose(1, 2).reshape(g * k, n), eps).reshape(g, k, n).transpose(1, 2)
    return torch.where(valid.all(dim=1, keepdim=True), full_G_N_K, masked)


def _constant(x_G_N_K: torch.Tensor, valid_G_N_K: torch.Tensor) -> torch.Tensor:
    """(G, 1, K) True where the valid values of (g, k) are all equal (or there are none)."""
    import torch

    hi = torch.where(valid_G_N_K, x_G_N_K, -torch.inf).amax(dim=1, keepdim=True)
    lo = torch.where(valid_G_N_K, x_G_N_K, torch.inf).amin(dim=1, keepdim=True)
    return ~(hi > lo)


def broadcast_turns(values_R_K: torch.Tensor, turn_R_T: torch.Tensor) -> torch.Tensor:
    """Each token gets its turn's value: out_{r,t} = v_{r, turn_{r,t}}, 0 where turn_{r,t} = -1. -> (R, T)"""
    import torch

    is_action = turn_R_T >= 0
    gathered = values_R_K.gather(1, torch.where(is_action, turn_R_T, 0).long())
    return torch.where(is_action, gathered, 0.0)


def turn_sums(x_R_T: torch.Tensor, turn_R_T: torch.Tensor, k_count: int) -> torch.Tensor:
    """The sum of x over each turn's tokens: out_{r,k} = sum_{t : turn_{r,t} = k} x_{r,t}. -> (R, K)"""
    import torch

    slot_R_T = torch.where(turn_R_T >= 0, turn_R_T, k_count).long()  # -1 -> a spare slot, dropped
    out = torch.zeros(x_R_T.shape[0], k_count + 1, dtype=x_R_T.dtype, device=x_R_T.device)
    return out.scatter_add(1, slot_R_T, x_R_T)[:, :k_count]


def turn_end_rewards(step_rewards_R_K: torch.Tensor, turn_R_T: torch.Tensor) -> torch.Tensor:
    """Token rewards that put process reward k on the last token of action k:

        r_{r,t} = s_{r,k}  at t = max {t' : turn_{r,t'} = k},   0 elsewhere

    That token is when the environment's answer to action k is known, so a per-token estimator (GAE)
    credits it to action k and, through the discount, to the tokens and turns before it. A reward
    whose turn has no token in the row is dropped (nothing to credit). -> (R, T)
    """
    import torch

    r, t = turn_R_T.shape
    position_R_T = torch.arange(t, device=turn_R_T.device).expand(r, t)
    is_action = turn_R_T >= 0
    last_R_K = torch.full(step_rewards_R_K.shape, -1, dtype=torch.long, device=turn_R_T.device)
    last_R_K = last_R_K.scatter_reduce(
        1, torch.where(is_action, turn_R_T, 0).long(), torch.where(is_action, position_R_T, -1), "amax"
    )
    out = torch.zeros(r, t + 1, dtype=step_rewards_R_K.dtype, device=step_rewards_R_K.device)
    return out.scatter_add(1, torch.where(last_R_K >= 0, last_R_K, t), step_rewards_R_K)[:, :t]
