from temper.train.objective import NextToken, Objective
from temper.train.supervised import TrainConfig, TrainResult, batch_indices, train_supervised

__all__ = ["NextToken", "Objective", "TrainConfig", "TrainResult", "batch_indices", "train_supervised"]
