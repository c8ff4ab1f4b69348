"""The judge a stage's `judge:` block names, built: an endpoint, the policy itself, or another model."""

from __future__ import annotations

from typing import Any

from temper.models import load_model
from temper.rewards.judge import ChoiceJudge, Judge, JudgeSpec, LocalJudge, endpoint_judge
from temper.rollout import HFSampler
from temper.rollout.sampler import model_of
from temper.stages.base import StageError
from temper.stages.context import StageContext
from temper.stages.loading import load_chat_tokenizer


def load_judge(spec: JudgeSpec, ctx: StageContext, sampler: Any, tokenizer: Any, seed: int = 0) -> Judge:
    """`spec`'s judge. With `url`, the endpoint. Else `model: policy` samples the stage's own model
    through its `sampler` (in RL the judge then changes with the policy: a self-rewarding loop);
    an earlier stage's name or a model folder is loaded frozen, in eval mode, with its own sampler.
    The stage hash covers the judge block, not a named model's weights."""
    if spec.url:
        return endpoint_judge(spec)
    if spec.model == "policy":
        if spec.verdict == "choice" and model_of(sampler) is None:
            raise StageError("judge.verdict: choice reads the policy's token probabilities: use sampler: hf")
        choose = ChoiceJudge(sampler.model, tokenizer) if spec.verdict == "choice" else None
        return Judge(
            LocalJudge(sampler, tokenizer, spec.max_new_tokens, spec.temperature, seed), spec, choose
        )
    source = ctx.models.get(spec.model) or ctx.resolve(spec.model)
    if not (isinstance(source, str) or source.exists()):
        known = ", ".join(["policy", *ctx.models]) or "policy"
        raise StageError(
            f"judge.model {spec.model!r} is no earlier model stage ({known}) and no folder ({source})"
        )
    model = load_model(source).eval().requires_grad_(False)
    judge_tokenizer = load_chat_tokenizer(source, ctx, model)
    backend = LocalJudge(
        HFSampler(model, judge_tokenizer), judge_tokenizer, spec.max_new_tokens, spec.temperature, seed
    )
    return Judge(backend, spec, ChoiceJudge(model, judge_tokenizer) if spec.verdict == "choice" else None)
