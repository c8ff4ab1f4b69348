from temper.train.supervised import TrainConfig, TrainResult, batch_indices, train_supervised

__all__ = ["TrainConfig", "TrainResult", "batch_indices", "train_supervised"]
