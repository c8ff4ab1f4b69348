"""The label of a token (or a step) that is not trained on, shared by the data that writes labels
(`data.chat`'s loss masks, `tasks.steps`' step labels) and the pure losses that skip it
(`algorithms.losses`, `algorithms.process_reward`): torch's `cross_entropy` default `ignore_index`.
A bottom module, so the losses stay free of any import from the layers above them."""

IGNORE = -100
