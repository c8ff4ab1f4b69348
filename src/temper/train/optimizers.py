"""The supervised loop's optimizer, `train.optimizer: adamw | muon`.

adamw: AdamW over the trainable parameters, weight decay on matrices only (norms and biases none).

muon: Muon (Jordan et al. 2024, torch.optim.Muon) on the 2-D hidden weights (attention and MLP
projections) and AdamW on the rest, as Muon's authors prescribe: the token embedding and the
output head (their rows are per-token, not a linear map to orthogonalize), and every vector
(norm gains, biases). Per matrix W with gradient G and momentum buffer M (beta = momentum):

    M <- beta M + (1 - beta) G;   U = (1 - beta) G + beta M   (Nesterov)
    O = NS5(U)                    (5 quintic Newton-Schulz steps: ~ the orthogonal factor of U)
    W <- W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O

The 0.2 sqrt(max(rows, cols)) factor (torch's `adjust_lr_fn="match_rms_adamw"`, Liu et al. 2025,
"Muon is scalable for LLM training") gives the update the RMS of AdamW's, so one `lr` and one
`weight_decay` serve both groups and the lr schedule moves them together.

Hand-written: the two-optimizer wrapper only. torch has Muon and AdamW but nothing that steps two
optimizers as one, and Accelerate (prepare, save_state) needs a `torch.optim.Optimizer`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from temper.train.supervised import TrainConfig

__all__ = ["MuonWithAdamW", "build_optimizer", "muon_split"]


def muon_split(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(Muon's parameters: the trainable 2-D hidden weights; AdamW's: the embeddings, the output
    head and every trainable parameter of fewer than 2 dimensions)."""
    outside = {
        id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
    }
    params = [p for p in model.parameters() if p.requires_grad]
    muon = [p for p in params if p.ndim == 2 and id(p) not in outside]
    return muon, [p for p in params if p.ndim != 2 or id(p) in outside]


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon over `muon` and AdamW over `adamw_groups`, stepped, zeroed and saved as one optimizer.
    `param_groups` are the two optimizers' own group dicts, so setting a group's lr reaches it."""

    def __init__(
        self,
        muon: list[torch.nn.Parameter],
        adamw_groups: list[dict[str, Any]],
        *,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
        momentum: float = 0.95,
    ):
        every = muon + [p for g in adamw_groups for p in g["params"]]
        super().__init__(every, {"lr": lr})  # the base class's hooks; its groups are replaced below
        self.muon = torch.optim.Muon(
            muon, lr=lr, weight_decay=weight_decay, momentum=momentum, adjust_lr_fn="match_rms_adamw"
        )
        self.adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=betas)
        self.param_groups = self.muon.param_groups + self.adamw.param_groups
        self.state = self.muon.state  # `state` of the base class: read by nothing here

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = self.muon.param_groups + self.adamw.param_groups


def build_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """`config.optimizer` over `model`'s trainable parameters (see the module docstring)."""
    if config.optimizer == "muon":
        muon, rest = muon_split(model)
        if not muon:
            raise ValueError("optimizer muon: the model has no trainable 2-D hidden weight for Muon")
        groups = [
            {"params": [p for p in rest if p.ndim >= 2], "weight_decay": config.weight_decay},
            {"params": [p for p in rest if p.ndim < 2], "weight_decay": 0.0},
        ]
        return MuonWithAdamW(
            muon,
            [g for g in groups if g["params"]],
            lr=config.lr,
            weight_decay=config.weight_decay,
            betas=config.betas,
            momentum=config.muon_momentum,
        )
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=config.betas,
    )
