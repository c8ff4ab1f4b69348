"""Prompt distillation's objective for the supervised loop: the student, reading a prompt without
the instruction, matches the frozen teacher's next-token distributions (the teacher read the
prompt with it) at every token of the teacher's sampled completion (`algorithms.distill.forward_kl_loss`;
Snell et al. 2022, "Learning by Distilling Context"). The stage is `temper.stages.prompt_distill`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from temper.algorithms.distill import forward_kl_loss
from temper.train.objective import Stats

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


@dataclass(frozen=True)
class Pair:
    """One teacher sample: the completion's ids after the teacher's and after the student's prompt."""

    teacher_prompt: list[int]
    student_prompt: list[int]
    completion: list[int]


def completion_logits(
    model: torch.nn.Module, rows: list[list[int]], starts: list[int], lengths: list[int], pad_id: int
):
    """(logits_B_L_V, mask_B_L): the model's next-token logits at the positions that predict each
    row's completion tokens (row b's tokens starts[b] .. starts[b] + lengths[b] - 1)."""
    import torch

    device = next(model.parameters()).device
    width = max(len(r) for r in rows)
    ids_B_T = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for b, r in enumerate(rows):
        ids_B_T[b, : len(r)] = torch.tensor(r)
    logits_B_T_V = model(
        input_ids=ids_B_T.to(device), use_cache=False
    ).logits  # right pads: never attended to
    longest = max(lengths)
    pos_B_L = torch.zeros((len(rows), longest), dtype=torch.long)
    mask_B_L = torch.zeros((len(rows), longest), dtype=torch.bool)
    for b, (s, n) in enumerate(zip(starts, lengths, strict=True)):
        pos_B_L[b, :n] = torch.arange(s - 1, s - 1 + n)  # position t predicts token t + 1
        mask_B_L[b, :n] = True
    index = pos_B_L.to(device)[:, :, None].expand(-1, -1, logits_B_T_V.shape[-1])
    return logits_B_T_V.gather(1, index), mask_B_L.to(device)


def distill_loss(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    batch: list[Pair],
    pad_id: int,
    num_tokens: int | None = None,
) -> torch.Tensor:
    """The forward KL of the student without the instruction to the teacher with it, on `batch`,
    summed over its completion tokens and divided by `num_tokens` (default: their count)."""
    import torch

    lengths = [len(p.completion) for p in batch]
    with torch.no_grad():
        t_logits, mask = completion_logits(
            teacher,
            [p.teacher_prompt + p.completion for p in batch],
            [len(p.teacher_prompt) for p in batch],
            lengths,
            pad_id,
        )
    s_logits, _ = completion_logits(
        student,
        [p.student_prompt + p.completion for p in batch],
        [len(p.student_prompt) for p in batch],
        lengths,
        pad_id,
    )
    return forward_kl_loss(s_logits, t_logits, mask, num_tokens=num_tokens)


@dataclass(frozen=True)
class PromptDistill:
    """Teacher samples (`Pair`s) -> the forward KL per completion token, each micro-batch's sum
    divided by the completion tokens of the whole global batch; logged as `kl`."""

    teacher: torch.nn.Module
    pad_id: int
    loss_name = "kl"
    eval_name = "eval/kl"

    def start(self, model, train: list[Pair], eval_set: list[Pair], batch_size: int):
        self.teacher.to(next(model.parameters()).device)  # where the loop put the student
        return train, eval_set

    def context(self, model, batch: list[Pair]) -> int:
        return sum(len(p.completion) for p in batch)

    def loss(self, model, items: list[Pair], context: int, stats: Stats) -> tuple[torch.Tensor, int]:
        loss = distill_loss(model, self.teacher, items, self.pad_id, num_tokens=context)
        return loss, sum(len(p.student_prompt) + len(p.completion) for p in items)

    def evaluate(self, model, items: list[Pair], batch_size: int, accelerator) -> dict[str, float]:
        """The held-out KL per completion token (every process scores every item)."""
        import torch

        was_training = model.training
        model.eval()
        n = self.context(model, items)
        with torch.no_grad():
            kl = sum(
                distill_loss(model, self.teacher, items[i : i + batch_size], self.pad_id, num_tokens=n).item()
                for i in range(0, len(items), batch_size)
            )
        model.train(was_training)
        return {self.eval_name: kl}
