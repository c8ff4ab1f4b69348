"""The reward-model stage: a scalar head on the policy, fitted to preference pairs (Bradley-Terry).

The head goes on the source stage's model: its backbone's weights are loaded into the
architecture's `AutoModelForSequenceClassification` with one label (a fresh linear `score` head,
as TRL's RewardTrainer and InstructGPT's RM start from the SFT model), and the pair's rewards
are trained with `algorithms.preference.bradley_terry_loss` in the supervised loop
(`temper.train.preference.BradleyTerry` is one more preference method beside DPO and KTO). With `lora`
the backbone gets an adapter and the head trains in full (PEFT's SEQ_CLS `modules_to_save`);
the adapter is merged before saving, so `<out>/reward_model` is always a whole model any
`AutoModelForSequenceClassification.from_pretrained` (and `temper.rewards.RewardModel.load`) reads.
With `freeze_backbone: true` only the head trains (a linear probe of the policy's features).

The stage does not produce a policy: later stages keep starting from the model before it, and
refer to the reward model by this stage's name (`reward_model: <name>`).

Data is the preference stages' block (`temper.stages.preference`): TRL pair files, with an
optional per-pair `margin` column, and/or pairs generated from tasks with the verifier. Only pairs
are usable; an unpaired (prompt/completion/label) row is refused at its file and line.
Held-out pairs give the accuracy (r_c > r_r), the mean margin and the calibration the report plots.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed
from temper.atomic import atomic_write_json, atomic_write_text
from temper.data.formats import DataError
from temper.data.preferences import Labelled, Pair, TokenizedPair, tokenize_pairs
from temper.models import save_model, with_lora
from temper.rewards.reward_model import REWARD_MODEL_DIR, reward_model_from_policy
from temper.stages.base import Loc, StageKind, epoch_steps, length, raise_located
from temper.stages.preference import PreferenceDataStage, tasks_of
from temper.train.preference import BradleyTerry, Preference, reward_forward
from temper.train.supervised import TrainConfig, train_supervised

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch

console = Console(stderr=True)

HELD_OUT = "heldout_rewards.jsonl"  # r_chosen, r_rejected of every held-out pair (the calibration plot)
CALIBRATION_BINS = 5  # over confidence [0.5, 1]: bins of 0.1


class RewardModelStage(PreferenceDataStage):
    kind: Literal["reward_model"]
    name: str = "reward_model"
    train: TrainConfig = TrainConfig(max_steps=100, batch_size=16, lr=1e-4, warmup_steps=10)
    center_rewards_coefficient: float = Field(0.0, ge=0)
    """c in + c (r_c + r_r)^2 (Eisenstein et al. 2023, TRL's name): keeps rewards centred on 0,
    which the pairwise loss alone leaves free; 0: off."""
    # out of the settings when false: stages written before the field keep their hash
    freeze_backbone: bool = Field(False, exclude_if=lambda v: not v)
    """Train the scalar head only (a linear probe of the policy's last hidden state at the last
    token): with a few hundred pairs the whole model memorizes them (held-out accuracy at chance,
    recipes/reward_model_arithmetic.yaml), while a frozen backbone can only reuse what the policy
    already computes. The held-out metrics say which generalizes better."""

    @model_validator(mode="after")
    def _check(self) -> RewardModelStage:
        errors: list[tuple[Loc, str]] = []
        if self.lora and self.lora.save != "merged":
            errors.append(
                (
                    ("lora", "save"),
                    "must be merged for a reward model: <out>/reward_model is a whole model that "
                    "AutoModelForSequenceClassification loads",
                )
            )
        if self.lora and self.freeze_backbone:
            errors.append(
                (
                    ("freeze_backbone",),
                    "a frozen backbone has nothing for a LoRA adapter to train: drop one of them",
                )
            )
        raise_located(errors)
        return self


def freeze_backbone(model: torch.nn.Module) -> None:
    """Stop gradients to everything but the head: the backbone is `model.base_model_prefix`
    (`model` for Llama), the one-label `score` head stays trainable; the optimizer
    (`train.supervised.adamw`) takes only parameters that require grad."""
    for p in getattr(model, model.base_model_prefix).parameters():
        p.requires_grad_(False)


def build(tokenizer, rows: list[Pair | Labelled], max_len: int):
    """Tokenized pairs; an unpaired row is refused where it is (a reward model learns from pairs)."""
    unpaired = [r for r in rows if not isinstance(r, Pair)]
    if unpaired:
        r = unpaired[0]
        raise DataError(
            r.source,
            r.line,
            "label",
            "an unpaired (prompt/completion/label) row: a reward model trains on chosen/rejected pairs",
        )
    return tokenize_pairs(tokenizer, rows, max_len)


def held_out_rewards(
    model, items: list[TokenizedPair], pad_id: int, batch_size: int
) -> list[dict[str, float]]:
    """r_chosen, r_rejected (and the pair's margin) of each held-out pair, without gradient."""
    import torch

    was_training = model.training
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(items), batch_size):
            chunk = items[i : i + batch_size]
            rewards, _ = reward_forward(
                model, [p.chosen for p in chunk] + [p.rejected for p in chunk], pad_id
            )
            chosen, rejected = rewards.chunk(2)
            for p, c, r in zip(chunk, chosen.tolist(), rejected.tolist(), strict=True):
                out.append({"chosen": c, "rejected": r, "margin": p.margin})
    model.train(was_training)
    return out


def calibration(rows: list[dict[str, float]], bins: int = CALIBRATION_BINS) -> dict[str, Any]:
    """Reliability of the Bradley-Terry probability on held-out pairs. Each pair's predicted
    P(chosen > rejected) = sigma(r_c - r_r); its confidence is max(p, 1 - p), the probability of
    the side it ranks first, and it is right when that side is the chosen one (r_c > r_r). Pairs
    are binned by confidence over [0.5, 1]; a calibrated model's accuracy in each bin equals its
    mean confidence. ECE: the pair-weighted mean |accuracy - confidence| over the bins."""
    edges = [0.5 + 0.5 * i / bins for i in range(bins + 1)]
    table = [
        {"lo": edges[i], "hi": edges[i + 1], "n": 0, "confidence": 0.0, "accuracy": 0.0} for i in range(bins)
    ]
    for row in rows:
        d = row["chosen"] - row["rejected"]
        p = 1 / (1 + math.exp(-d)) if d >= 0 else math.exp(d) / (1 + math.exp(d))
        conf = max(p, 1 - p)
        b = table[min(int((conf - 0.5) * 2 * bins), bins - 1)]
        b["n"] += 1
        b["confidence"] += conf
        b["accuracy"] += float(d > 0)
    for b in table:
        if b["n"]:
            b["confidence"] /= b["n"]
            b["accuracy"] /= b["n"]
    n = sum(b["n"] for b in table)
    ece = sum(b["n"] * abs(b["accuracy"] - b["confidence"]) for b in table) / n if n else None
    return {"bins": table, "ece": ece, "pairs": n}


def run(stage: RewardModelStage, job) -> Path:
    from temper.stages.preference import preference_items

    ctx, source, out = job.ctx, job.source, job.out
    tokenizer, policy, items, eval_items, stats, summary = preference_items(
        stage, "reward_model", ctx, source, out, build, unit="pairs"
    )
    config = epoch_steps(stage.train, len(items), "reward_model")
    model = reward_model_from_policy(policy, tokenizer.pad_token_id, seed=config.seed)
    del policy
    lora = stage.lora and stage.lora.adapter_args() | {"task_type": "SEQ_CLS"}
    model = with_lora(model, lora)
    if stage.freeze_backbone:
        freeze_backbone(model)
    batch = config.micro_batch_size or 16
    # the untrained head's held-out accuracy: the point the curve starts from (chance, or a bias
    # the fresh head happens to have, e.g. for the longer answer)
    before = held_out_rewards(model, eval_items, tokenizer.pad_token_id, batch)
    objective = Preference(BradleyTerry(center_coef=stage.center_rewards_coefficient), tokenizer.pad_token_id)
    result = train_supervised(model, items, config, out, objective=objective, eval_set=eval_items)
    if stage.lora:
        model = model.merge_and_unload()
    heldout = held_out_rewards(model, eval_items, tokenizer.pad_token_id, batch)
    rm_dir = save_model(model, tokenizer, out / REWARD_MODEL_DIR)
    if distributed.is_main():
        final = result.history[-1] if result.history else {}
        atomic_write_text(out / HELD_OUT, "".join(json.dumps(r) + "\n" for r in heldout))
        margins = [r["chosen"] - r["rejected"] for r in heldout]
        initial = [r["chosen"] - r["rejected"] for r in before]
        atomic_write_json(
            out / "reward_model.json",
            summary
            | {
                "data": vars(stats),
                "held_out_pairs": len(heldout),
                "held_out_accuracy": sum(m > 0 for m in margins) / len(margins) if margins else None,
                "held_out_mean_margin": sum(margins) / len(margins) if margins else None,
                "held_out_accuracy_initial": sum(m > 0 for m in initial) / len(initial) if initial else None,
                "calibration": calibration(heldout) if heldout else None,
                "steps": result.steps,
                "final_loss": result.final_loss,
                "eval_loss": result.eval_loss,
                "seconds": result.seconds,
                "tokens": result.tokens,
                "precision": result.precision,
                "final": final,
                "reward_model": str(rm_dir),
            },
        )
        acc = (
            f"{100 * sum(m > 0 for m in margins) / len(margins):.1f}%"
            if margins
            else "n/a (no held-out pairs)"
        )
        console.print(f"reward_model: held-out accuracy {acc}; saved to {rm_dir}")
    return rm_dir


def describe(stage: RewardModelStage, recipe: Any) -> str:
    data = [f"pairs from {stage.data.generate.tasks}"] if stage.data.generate else []
    lora = f", LoRA r={stage.lora.r}" if stage.lora else ""
    lora += ", head only (backbone frozen)" if stage.freeze_backbone else ""
    center = f", centering {stage.center_rewards_coefficient}" if stage.center_rewards_coefficient else ""
    return f"reward model (Bradley-Terry{center}) on {data + stage.data.files}, {length(stage.train)}{lora}"


def summary(out: Path) -> str:
    path = out / "reward_model.json"
    if not path.is_file():
        return ""
    s = json.loads(path.read_text())
    acc = s.get("held_out_accuracy")
    if acc is None:
        return f"reward model: {s.get('reward_model')} (no held-out pairs)"
    return (
        f"reward model: {s.get('reward_model')}; held-out accuracy {100 * acc:.1f}% on {s['held_out_pairs']} pairs, "
        f"mean margin {s['held_out_mean_margin']:.3f}"
    )


KIND = StageKind(
    name="reward_model",
    spec=RewardModelStage,
    run=run,
    describe=describe,
    reads="model",
    produces_model=False,
    help="Bradley-Terry reward model (a scalar head on the policy) on preference pairs",
    outputs=("reward_model.json", HELD_OUT),  # not pairs.jsonl: an unfinished dpo stage has one too
    tasks=tasks_of,
    summary=summary,
    order=24,
    exports=REWARD_MODEL_DIR,  # what `reward_model: <this stage>` reads (`ranking.reward_model_use`)
)
