"""A trained reward model as a scorer: token ids of (prompt, completion) pairs -> one float each.

The reward model is what the `reward_model` stage saves to `<stage out>/reward_model`: an
`AutoModelForSequenceClassification` with one label whose config names a pad token, saved with its
tokenizer by `save_pretrained`, so it loads the Hugging Face way here, in TRL, or anywhere else.

The score of a sequence is the head's output at its last non-pad token: that is where
`LlamaForSequenceClassification` (and the other HF `...ForSequenceClassification` heads built on
`GenericForSequenceClassification`) reads it, the rightmost token that is not `pad_token_id`. So
batches are right-padded with that id and a sequence scores the same alone or in any batch. The
`reward_model` stage trains through the same forward, so training and scoring read one position.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING

from temper.lazy import no_grad
from temper.models.loading import (
    ModelNotFoundError,
    default_device,
    default_dtype,
    load_tokenizer,
    saved_dtype,
)

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch
    from transformers import PreTrainedModel

# The folder a `reward_model` stage writes inside its output folder.
REWARD_MODEL_DIR = "reward_model"


class RewardModelError(ModelNotFoundError):
    """A path that holds no usable reward model (missing, not a one-label sequence classifier)."""


def _check_config(folder: Path) -> dict:
    """The folder's config.json, refused (with the reason) unless it is a one-label sequence
    classifier: a causal LM folder would otherwise load with a freshly initialized, random head."""
    if not folder.is_dir():
        hint = ""
        if (folder.parent / REWARD_MODEL_DIR).is_dir() and folder.name != REWARD_MODEL_DIR:
            hint = f"; did you mean {str(folder.parent / REWARD_MODEL_DIR)!r}?"
        what = "is a file, not a directory" if folder.exists() else "does not exist"
        raise RewardModelError(f"reward model {str(folder)!r} {what}{hint}")
    config_path = folder / "config.json"
    if not config_path.is_file():
        inner = folder / REWARD_MODEL_DIR
        hint = f"; did you mean {str(inner)!r}?" if (inner / "config.json").is_file() else ""
        raise RewardModelError(f"reward model directory {str(folder)!r} has no config.json{hint}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RewardModelError(f"{config_path} is not valid JSON ({err})") from None
    architectures = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise RewardModelError(
            f"{str(folder)!r} is not a reward model: its config.json names architectures {architectures}, "
            "not a ...ForSequenceClassification (train one with a `reward_model` stage; "
            "a recipe refers to it by that stage's name)"
        )
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
    if labels != 1:
        raise RewardModelError(
            f"{str(folder)!r} is a sequence classifier with {labels} labels; a reward model has one (num_labels=1)"
        )
    return config


def find_reward_model(ref: str | Path, run_dir: Path, base_dir: Path) -> Path:
    """The folder a recipe's `reward_model: <ref>` means: the `<ref>` stage's `<out>/reward_model`
    in this run (`NN-<ref>/reward_model`) when one exists, else `<ref>` as a path (relative to the
    recipe's folder), which may be a stage folder holding `reward_model/`. Not checked further:
    `RewardModel.load` says what is wrong with it."""
    stages = sorted(p for p in Path(run_dir).glob(f"[0-9][0-9]-{ref}") if p.is_dir())
    if stages and isinstance(ref, str) and "/" not in ref:
        return stages[-1] / REWARD_MODEL_DIR
    path = Path(ref).expanduser()
    path = path if path.is_absolute() else (Path(base_dir) / path).resolve()
    return path / REWARD_MODEL_DIR if (path / REWARD_MODEL_DIR / "config.json").is_file() else path


def reward_model_from_policy(policy: PreTrainedModel, pad_token_id: int, seed: int = 0) -> PreTrainedModel:
    """A one-label sequence classifier of `policy`'s architecture holding `policy`'s backbone
    weights and a freshly initialized scalar head (seeded), on its device and in its dtype: where
    a reward model starts (InstructGPT's RM and TRL's RewardTrainer start from the SFT policy).
    The config names `pad_token_id`, so the head reads each sequence's last non-pad token."""
    import torch
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    config.pad_token_id = int(pad_token_id)
    config.architectures = None  # save_pretrained writes the classifier's own
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForSequenceClassification.from_config(config, dtype=policy.dtype)
    except ValueError as err:  # transformers has no ...ForSequenceClassification for this config
        raise RewardModelError(
            f"the policy's architecture ({config.model_type}) has no sequence-classification head in "
            f"transformers, so no reward model can be built on it: {str(err).splitlines()[0]}"
        ) from None
    backbone = getattr(policy, policy.base_model_prefix)
    getattr(model, model.base_model_prefix).load_state_dict(backbone.state_dict())  # strict: every weight
    return model.to(policy.device)


class RewardModel:
    """A one-label sequence classifier and its pad id, scoring without gradients."""

    def __init__(self, model: PreTrainedModel, pad_token_id: int) -> None:
        self.model = model
        self.pad_token_id = int(pad_token_id)

    @classmethod
    def load(
        cls, path: str | Path, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> RewardModel:
        """Load `path` (a `reward_model` stage's `<out>/reward_model`, or any HF one-label sequence
        classifier saved with its tokenizer); a `RewardModelError` says why when it cannot be."""
        from transformers import AutoModelForSequenceClassification

        folder = Path(path).expanduser()
        config = _check_config(folder)
        device = device or default_device()
        tokenizer = load_tokenizer(folder)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                str(folder.resolve()), dtype=dtype or default_dtype(device, saved_dtype(folder))
            )
        except Exception as err:  # a local folder that fails to load is a bad folder (see load_model)
            raise RewardModelError(f"cannot load reward model {str(folder)!r}: {err}") from err
        pad = config.get("pad_token_id")
        if pad is None:  # the head would then read the last position, padding included
            pad = tokenizer.pad_token_id
            model.config.pad_token_id = pad
        return cls(model.to(device).eval(), pad)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @no_grad
    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], batch_size: int = 32
    ) -> list[float]:
        """The reward of each prompt + completion (ids concatenated as given), in input order.

        Sequences are batched by length (fewer pad tokens) and right-padded with the pad id, so
        a score does not depend on the batch it was computed in."""
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        sequences = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        for i, seq in enumerate(sequences):
            if not seq:
                raise ValueError(f"sequence {i} is empty (no prompt nor completion ids)")
            if all(t == self.pad_token_id for t in seq):
                raise ValueError(f"sequence {i} holds only the pad token; it has no position to score")
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        scores = [0.0] * len(sequences)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                input_ids_B_T, attention_B_T = right_pad([sequences[i] for i in chunk], self.pad_token_id)
                rewards_B = sequence_rewards(
                    self.model, input_ids_B_T.to(self.device), attention_B_T.to(self.device)
                )
                for i, r in zip(chunk, rewards_B.float().tolist(), strict=True):
                    scores[i] = r
        finally:
            self.model.train(was_training)
        return scores


def right_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids right-padded with `pad_token_id` and the attention mask (1 on real tokens), each (B, T)."""
    import torch

    width = max(len(s) for s in sequences)
    ids_B_T = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask_B_T = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids_B_T[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask_B_T[row, : len(seq)] = 1
    return ids_B_T, mask_B_T


def sequence_rewards(
    model: torch.nn.Module, input_ids_B_T: torch.Tensor, attention_B_T: torch.Tensor
) -> torch.Tensor:
    """The one-label head's output for each right-padded row, (B,), in at least fp32 (fp64 for a
    fp64 model): the head reads the last non-pad token. The stage trains through this function and
    `RewardModel.score` scores through it."""
    import torch

    rewards_B = model(input_ids=input_ids_B_T, attention_mask=attention_B_T).logits[:, 0]
    return rewards_B.to(torch.promote_types(rewards_B.dtype, torch.float32))
