from typing import TYPE_CHECKING

from temper.lazy import exports

if TYPE_CHECKING:  # the names, for type checkers; imported on first use (temper.lazy)
    from temper.train.objective import NextToken, Objective
    from temper.train.supervised import TrainConfig, TrainResult, batch_indices, train_supervised

__getattr__, __dir__ = exports(
    globals(),
    {
        "NextToken": "objective",
        "Objective": "objective",
        "TrainConfig": "supervised",
        "TrainResult": "supervised",
        "batch_indices": "supervised",
        "train_supervised": "supervised",
    },
)

__all__ = ["NextToken", "Objective", "TrainConfig", "TrainResult", "batch_indices", "train_supervised"]
