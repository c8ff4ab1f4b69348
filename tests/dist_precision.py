"""Run by tests/test_precision.py in two gloo processes (torch.multiprocessing.spawn): a module
that imports only torch and temper.precision, so the spawned processes start fast."""

import json

import torch

from temper import precision as prec
from temper.precision import resolve_precision


def rank_resolves(rank: int, world: int, port: int, cache_dir: str, out: str) -> None:
    """One of two gloo processes: only rank 0 may measure; both must end with its verdict."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        flags = ["amx_bf16", "avx512f"]  # a CPU on which auto measures, whatever this one is
        prec.machine = lambda: {"cpu": "test", "flags": flags, "torch": torch.__version__}
        if rank == 0:
            prec.measure = lambda model, mode: {"matmul": [], "model": {"speedup": 1.5}}
        else:
            prec.measure = lambda model, mode: (_ for _ in ()).throw(AssertionError("rank 1 measured"))
        choice = resolve_precision("auto", torch.nn.Linear(4, 4), cache_dir=cache_dir, verbose=False)
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(choice.as_dict(), f)
    finally:
        torch.distributed.destroy_process_group()
