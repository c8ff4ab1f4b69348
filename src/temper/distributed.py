"""Processes of a multi-process run: who they are, and the few ways they agree.

Launch N CPU processes with torch's launcher (it sets RANK, WORLD_SIZE and LOCAL_RANK):

    torchrun --standalone --nproc_per_node 2 -m temper.cli run recipe.yaml

Two traps found with accelerate 1.15 / torch 2.13, which this module exists to avoid:
1. `accelerate launch --cpu --num_processes 2` starts ONE process: `--cpu` always takes the
   simple launcher, which only fans out through `mpirun` (with `--mpirun_hostfile`). On GPUs,
   `accelerate launch --multi_gpu --num_processes N` (torchrun underneath) works as well.
2. Under a launcher that does start N processes, `PartialState()` without `cpu=True` on a machine
   without CUDA finds no GPU backend and falls back to `DistributedType.NO`: every process then
   believes it is rank 0 of 1, trains alone and writes every file. `PartialState` is a
   process-wide singleton decided by its FIRST construction, so every part of temper gets it
   (and its `Accelerator`) from here, never by calling `PartialState()` itself.

Rules every stage follows: all processes train (DDP averages the gradients); only the main
process writes metrics, rollouts, probe/gate results, checkpoints' shared files, models, stage
markers and the report; work that only the main process does (evaluation, the RL format gate and
reachability probe) goes through `on_main`, which makes the others wait and hands them the result
or the exception, so no process is left waiting at a barrier for one that failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from temper.atomic import atomic_dir

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from accelerate import Accelerator, PartialState

T = TypeVar("T")


def _cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def state() -> PartialState:
    """The process-wide state: rank, world size, device (gloo on CPU, NCCL on CUDA)."""
    from accelerate import PartialState

    return PartialState(cpu=_cpu())


def shutdown() -> None:
    """Leave the process group before the interpreter exits: a live gloo group's threads abort
    the main process at exit about one run in four ("terminate called without an active
    exception", SIGABRT, seen with torch 2.13), failing a run that had finished."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def make_accelerator(**kwargs: Any) -> Accelerator:
    """An Accelerator over the same processes; one per trainer call (it owns what it prepared)."""
    from accelerate import Accelerator

    return Accelerator(cpu=_cpu(), **kwargs)


def is_main() -> bool:
    return state().is_main_process


def world_size() -> int:
    return state().num_processes


def rank() -> int:
    return state().process_index


def wait() -> None:
    """Barrier: every process reaches this line before any goes on."""
    state().wait_for_everyone()


def share(n: int, rank_: int, world: int) -> slice:
    """This process's contiguous share of n items (the first n % world processes take one more):
    concatenating the shares in rank order gives back the original order."""
    base, extra = divmod(n, world)
    start = rank_ * base + min(rank_, extra)
    return slice(start, start + base + (rank_ < extra))


def gather(items: list[T]) -> list[T]:
    """Every process's list, concatenated in rank order, on every process (pickled objects)."""
    from accelerate.utils import gather_object

    if world_size() == 1:
        return list(items)
    return gather_object(list(items))


def on_main(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run `fn` on the main process only; the others wait and get its return value, or raise
    its exception (so a failed gate stops every process, not only the main one)."""
    from accelerate.utils import broadcast_object_list

    if world_size() == 1:
        return fn(*args, **kwargs)
    box: list[Any] = [None]
    if is_main():
        try:
            box = [(True, fn(*args, **kwargs))]
        except Exception as err:  # handed to every process and raised there
            box = [(False, err)]
    broadcast_object_list(box, from_process=0)
    ok, value = box[0]
    if not ok:
        raise value
    return value


@contextmanager
def shared_atomic_dir(target: str | Path) -> Iterator[Path]:
    """`atomic_dir` that every process writes into (e.g. its own RNG state beside the main
    process's weights): the main process makes the scratch directory and tells the others its
    name; after all have written, the main process renames it to `target`."""
    from accelerate.utils import broadcast_object_list

    if world_size() == 1:
        with atomic_dir(target) as tmp:
            yield tmp
        return
    with ExitStack() as stack:
        box: list[Any] = [stack.enter_context(atomic_dir(target)) if is_main() else None]
        broadcast_object_list(box, from_process=0)
        yield Path(box[0])
        wait()  # everyone has written before the main process renames
    wait()  # and nobody reads `target` before it exists
