"""How a trainer spreads one model over the processes of a run: `strategy: ddp | fsdp`.

ddp: every process holds the whole model and its optimizer state; Accelerate's `prepare` wraps the
module in DistributedDataParallel, which averages the gradients. The module the trainer steps IS
the model the rest of temper reads (the hf sampler, evaluation, `save_pretrained`): same tensors.

fsdp: torch's FSDP2 (`torch.distributed.fsdp.fully_shard`) over a copy of the model, sharded per
decoder layer (the classes the transformers model names in `_no_split_modules`), then the root.
Each process keeps 1/N of the trained parameters, their gradients and the optimizer state; a
forward all-gathers a layer's parameters and frees them after, a backward reduce-scatters its
gradients (averaged over processes, as DDP's, so the trainers' `loss x world` holds). Why
`fully_shard` and not Accelerate's FSDP plugin: with accelerate 1.15 and 1.16 (`fsdp_version=2`
too) on CPU the plugin is silently ignored (`prepare` wraps DDP instead), so a CPU test of it
would compare DDP with DDP; fully_shard shards on CPU (gloo) and is the same call on GPU (NCCL):
one code path (tested here on CPU only).

Why a copy: a sharded module's forward is a collective, so anything only the main process runs
(the greedy evaluation, the RL gate, `save_pretrained`) or that runs a different number of
forwards per process (the sampler, a held-out share) would hang on it. The model temper was given
stays a plain module with full weights, and `Trained.publish` copies the trained weights into it
after every optimizer step (one parameter at a time, each gathered with `full_tensor`): what
samples, evaluates and saves reads it as under ddp. The cost is one full copy per process beside
the shards (parameters + gradients + AdamW's two moments sharded: 1 + 4/N copies instead of 4),
and a gather of the trainable parameters per step. Checkpoints keep the sharded state
(`torch.distributed.checkpoint`, each process its shard, `SHARDED_DIR`), which resumes exactly
under the same number of processes.

One process: nothing to shard over, so fsdp trains as ddp does (the model itself, unwrapped).
Muon is refused under fsdp: it orthogonalizes whole 2-D matrices, and a shard holds a slice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # imported where used: importing this module stays cheap (the CLI reads configs)
    import torch
    from accelerate import Accelerator

Strategy = Literal["ddp", "fsdp"]
"""ddp: the whole model in every process (DistributedDataParallel); fsdp: parameters, gradients
and optimizer state sharded over the processes (torch FSDP2); the same losses either way."""

SHARDED_DIR = "sharded"
"""In a checkpoint of an fsdp run: the trained module's and optimizer's sharded state (DCP)."""

MUON_UNDER_FSDP = (
    "optimizer muon cannot run under strategy fsdp: Muon orthogonalizes each whole 2-D weight and a "
    "shard holds a slice of its rows; use strategy ddp or optimizer adamw"
)


@dataclass
class Trained:
    """What a trainer steps, and how it reaches the plain model the rest of the run reads.

    module: what the loss calls and differentiates (DDP-wrapped, FSDP-sharded, or the model).
    inner: the same unwrapped, whose forward precision patches: the model itself under ddp, the
        sharded copy under fsdp.
    optimizer: over `inner`'s trainable parameters (Accelerate-prepared under ddp).
    model: the plain module temper was given (full weights).
    sharded: whether `inner` is a sharded copy (fsdp over more than one process).
    """

    module: torch.nn.Module
    inner: torch.nn.Module
    optimizer: torch.optim.Optimizer
    model: torch.nn.Module
    sharded: bool = False

    def forward_modules(self) -> tuple[torch.nn.Module, ...]:
        """The distinct modules whose forward runs in a step (precision patches each once)."""
        return (self.model,) if self.inner is self.model else (self.model, self.inner)

    def publish(self) -> None:
        """Copy the trained weights into `model` (every process calls this: each parameter is
        gathered from its shards); nothing to do unsharded, where they are the same tensors."""
        if not self.sharded:
            return
        import torch
        from torch.distributed.tensor import DTensor

        target = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, p in self.inner.named_parameters():
                if p.requires_grad:  # frozen ones (a LoRA base) never change
                    target[name].copy_(p.full_tensor() if isinstance(p, DTensor) else p)

    def save(self, folder: Path) -> None:
        """Write the sharded module and optimizer state into `folder/SHARDED_DIR` (every process
        writes its shard, the main one the metadata); nothing unsharded (Accelerate saves it)."""
        if not self.sharded:
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.inner, self.optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder / SHARDED_DIR))

    def load(self, folder: Path) -> None:
        """Restore what `save` wrote into the sharded module and optimizer, then publish."""
        if not self.sharded:
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if not (folder / SHARDED_DIR).is_dir():
            raise FileNotFoundError(f"no {SHARDED_DIR}/ (saved under strategy ddp?)")
        model_state, optim_state = get_state_dict(self.inner, self.optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(folder / SHARDED_DIR))
        set_state_dict(
            self.inner, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        self.publish()


def wrap(
    model: torch.nn.Module,
    make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
    accelerator: Accelerator,
    strategy: Strategy = "ddp",
) -> Trained:
    """`model` ready to train under `strategy`, with the optimizer `make_optimizer` builds over
    the module the trainer steps (under fsdp the sharded copy, whose parameters are new tensors)."""
    if strategy == "ddp" or accelerator.num_processes == 1:
        optimizer = make_optimizer(model)
        module, optimizer = accelerator.prepare(model, optimizer)
        return Trained(module, model, optimizer, model)
    model.to(accelerator.device)  # where `prepare` would have put it: the sampler reads it there
    sharded = shard(model, accelerator.num_processes)
    optimizer = make_optimizer(sharded)
    return Trained(sharded, sharded, optimizer, model, sharded=True)


def shard(model: torch.nn.Module, world: int) -> torch.nn.Module:
    """A copy of `model` under FSDP2 over `world` processes: each decoder layer its own unit (its
    parameters gathered for its forward only), then the root (embeddings, head, value head)."""
    import copy
    import warnings

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (world,))
    # as DDP does when it wraps: every process starts from the main process's weights (fully_shard
    # keeps each process's own slice, so processes that built different weights, e.g. a LoRA
    # adapter drawn from unequal RNG states, would train a mix of them)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(tensor.data, src=0)
    copied = copy.deepcopy(model)
    layers = decoder_layer_classes(copied)
    for module in copied.modules():
        if type(module).__name__ in layers:
            fully_shard(module, mesh=mesh)
    fully_shard(copied, mesh=mesh)
    # torch 2.13 warns of every view a sharded module returns (an in-place op on it would skip the
    # backward's all-gather); the RL policy's per-token outputs are views (`squeeze`) that the
    # update only reads out of place (`rl_update.forward_rows` scatters them into new tensors)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")
    assert all(isinstance(p, torch.distributed.tensor.DTensor) for p in copied.parameters())
    return copied


def decoder_layer_classes(model: torch.nn.Module) -> set[str]:
    """The class names of the decoder layers: what every transformers model inside `model` (a
    PEFT wrapper, the RL's policy with its value head) lists in `_no_split_modules`."""
    names: set[str] = set()
    for module in model.modules():
        names |= set(getattr(module, "_no_split_modules", None) or ())
    return names
