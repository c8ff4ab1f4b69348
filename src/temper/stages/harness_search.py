"""The harness_search stage: search for the harness a frozen model plays a task best with.

    - kind: harness_search
      task: treasure_hunt
      harness: harnesses/treasure_hunt.py     # the default harness (relative to the recipe)
      proposer: {kind: knobs}                 # or {kind: openai, url, model, api_key_env}
      train_problems: 32
      held_out: {split: test, select_problems: 32, final_problems: 32}

The model (the latest model stage's, or `source`) is never trained: each candidate harness is
played greedily on the train problems, the best few on the held-out selection problems, and the
default and the kept harness on the final held-out problems (`temper.harness.search`). Writes
`candidates/NN-<label>/` (harness.py, train.json, traces.jsonl...), `best/harness.py` and
`harness_search.json`, which the report's section reads.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field
from rich.console import Console

from temper import guard
from temper.envs.base import EnvTask, TurnLimited
from temper.harness.file import load_harness
from temper.harness.proposers import EndpointProposer, KnobSearch, Proposer
from temper.harness.search import search
from temper.models.chat import eos_ids
from temper.rewards.judge import JudgeSpec, JudgeUnreachable, endpoint_judge
from temper.stages.base import Loc, StageKind, StageRun, Strict
from temper.stages.loading import load_chat_model
from temper.stages.sampling import stage_sampler

console = Console(stderr=True)


class KnobProposer(Strict):
    """The built-in proposer: coordinate ascent over the harness's declared KNOBS."""

    kind: Literal["knobs"] = "knobs"
    max_candidates: int = Field(20, gt=0)
    """Candidates proposed in all (the default harness not counted)."""
    rounds: int = Field(4, gt=0)
    """Rounds of one-knob changes from the best so far; the search also stops at a round that improves nothing."""


class OpenAIProposer(Strict):
    """A model behind an OpenAI-compatible endpoint writes new harness files."""

    kind: Literal["openai"]
    url: str
    """The endpoint's base URL (`POST <url>/chat/completions`), e.g. https://api.openai.com/v1."""
    model: str
    api_key_env: str | None = None
    """The environment variable holding the API key (never the key itself)."""
    rounds: int = Field(2, gt=0)
    per_round: int = Field(2, gt=0)
    """Harness files asked for per round (one request each)."""
    temperature: float = Field(0.7, ge=0)
    max_new_tokens: int = Field(4096, gt=0)
    timeout: float = Field(120.0, gt=0)
    """Seconds per request; retried with backoff on timeouts, 429 and 5xx."""
    retries: int = Field(3, ge=0)


class PythonProposer(Strict):
    """The user's own proposer: `function` (module:function or path/file.py:function, relative to
    the recipe's folder) is called once with `options` as keywords and returns an object with
    `propose(base, tried) -> list[str]` (temper.harness.proposers.Proposer); every call of it is
    user code, under the time limit, a failure one line naming the function."""

    kind: Literal["python"]
    function: str
    options: dict[str, Any] = {}


class _Guarded:
    """A user's proposer whose `propose` runs as user code (`guard.call`)."""

    def __init__(self, inner: Any, what: str):
        self.inner, self.what = inner, what

    def propose(self, base: Any, tried: list[Any]) -> list[str]:
        out = guard.call(self.inner.propose, base, tried, what=f"{self.what}.propose")
        if not isinstance(out, list) or not all(isinstance(x, str) for x in out):
            raise guard.returned(
                f"{self.what}.propose", f"{type(out).__name__}, not a list of harness sources"
            )
        return out


class HeldOut(Strict):
    """Where the shortlisted candidates are compared and the kept one reported: one draw of the
    split's problems, its first `select_problems` for the choice, the next `final_problems` for the figure."""

    split: Literal["train", "test", "ood"] = "test"
    """The held-out split (the train split only for a task whose train problems are not the search's)."""
    select_problems: int = Field(32, gt=0)
    """Problems the shortlisted harnesses are compared on to keep the best."""
    final_problems: int = Field(32, gt=0)
    """Other problems of the split, where the default and the kept harness are reported."""


class HarnessSearchStage(Strict):
    kind: Literal["harness_search"]
    name: str = "harness_search"
    source: str | None = None
    """Stage whose model plays (frozen); default: the latest stage that produced a model."""
    task: str
    """The recipe's environment task the harness plays."""
    harness: str
    """The default harness file (relative to the recipe's folder); see temper.harness.file."""
    proposer: Annotated[KnobProposer | OpenAIProposer | PythonProposer, Field(discriminator="kind")] = (
        KnobProposer()
    )
    """knobs (built in: the harness's KNOBS searched), openai (a model behind an endpoint writes
    harness files) or python (the user's own, `function: file.py:make`)."""
    train_problems: int = Field(32, gt=0)
    """Train problems every candidate is scored on."""
    held_out: HeldOut = HeldOut()
    select_top: int = Field(3, gt=0)
    """Candidates, best on train first, compared on the held-out selection problems (the default always is)."""
    max_new_tokens: int = Field(8, gt=0)
    """Tokens per turn."""
    max_episode_tokens: int = Field(256, ge=0)
    """Policy and environment tokens per episode after the prompt (0: turns x max_new_tokens)."""
    timeout: float = Field(60.0, gt=0)
    """Seconds one call of the harness's code may take (and the env's reset, which the harness wraps)."""
    seed: int = 0
    """Which problems are drawn (train, selection and final)."""


def make_proposer(spec: HarnessSearchStage, base_dir: Path | None = None) -> Proposer:
    """The proposer a stage names: the knob search, an endpoint model (its errors named as the
    proposer's) or the user's (`base_dir`: the recipe's folder, where its file is)."""
    p = spec.proposer
    if isinstance(p, KnobProposer):
        return KnobSearch(max_candidates=p.max_candidates, rounds=p.rounds)
    if isinstance(p, PythonProposer):
        from temper.tasks.reward_functions import load_reward_function

        what = f"proposer {p.function}"
        factory = load_reward_function(p.function, base_dir, what="proposer").fn
        return _Guarded(guard.call(factory, what=what, **p.options), what)
    judge = endpoint_judge(
        JudgeSpec(
            url=p.url, model=p.model, api_key_env=p.api_key_env, temperature=p.temperature,
            max_new_tokens=p.max_new_tokens, timeout=p.timeout, retries=p.retries,
        )
    )  # fmt: skip
    return EndpointProposer(_named(judge.complete), rounds=p.rounds, per_round=p.per_round)


def _named(complete: Any) -> Any:
    """The endpoint client's failures, said as the proposer's (it is the judge's client)."""

    def call(chats: list[list[dict[str, str]]]) -> list[str]:
        try:
            return complete(chats)
        except JudgeUnreachable as err:
            raise JudgeUnreachable(str(err).replace("judge endpoint", "proposer endpoint")) from None

    return call


def run_harness_search(spec: HarnessSearchStage, job: StageRun) -> dict[str, Any]:
    from temper.harness.play import play_episodes
    from temper.rollout.loop import EpisodeLimits

    ctx, out = job.ctx, job.out
    base = load_harness(ctx.resolve(spec.harness))
    task = ctx.tasks[spec.task]
    turns = task.max_turns if isinstance(task, TurnLimited) else 8
    limits = EpisodeLimits(
        max_turns=turns, max_tokens=spec.max_episode_tokens, max_new_tokens=spec.max_new_tokens
    )
    info = {"task": spec.task, "options": dict(ctx.task_options.get(spec.task, {})), "max_turns": turns}
    held = spec.held_out
    train = task.sample("train", spec.train_problems, spec.seed)
    pool = task.sample(held.split, held.select_problems + held.final_problems, spec.seed + 1)
    select, final = pool[: held.select_problems], pool[held.select_problems :]
    if not final:
        raise ValueError(
            f"{spec.task} {held.split}: {len(pool)} problems, none left for the final comparison"
        )
    with ExitStack() as owned, guard.time_limit(spec.timeout):
        tokenizer, model = load_chat_model(job.source, ctx)
        sampler = stage_sampler("hf", job.source, model, tokenizer, eos_ids(model, tokenizer), owned)

        def on(problems: list[Any]) -> Any:
            return lambda harness: play_episodes(sampler, tokenizer, task, problems, harness, info, limits)

        summary = search(
            base, make_proposer(spec, ctx.base_dir), on(train), on(select), on(final), out,
            select_top=spec.select_top, say=lambda line: console.print(f"harness_search: {line}"),
            about={"task": spec.task, "held_out_split": held.split, "problems": [len(train), len(select), len(final)]},
        )  # fmt: skip
    return summary


def summary_table(out: Path) -> str:
    """The candidates and their scores, then the default vs the kept harness on the final problems."""
    s = json.loads((out / "harness_search.json").read_text())
    lines = ["candidate | train acc | held-out acc", "---|---|---"]
    for c in s["candidates"]:
        train = f"{c['train']['accuracy']['value']:.3f}" if c["train"] else "refused"
        held = f"{c['held_out']['accuracy']['value']:.3f}" if c["held_out"] else ""
        lines.append(f"{c['folder']} | {train} | {held}")
    d, b = s["final"]["default"]["accuracy"], s["final"]["best"]["accuracy"]
    lines.append(
        f"final ({s['held_out_split']}, {s['problems'][2]} problems): default {d['value']:.3f} "
        f"[{d['lo']:.3f}, {d['hi']:.3f}], kept {s['best']} {b['value']:.3f} [{b['lo']:.3f}, {b['hi']:.3f}]"
    )
    return "\n".join(lines)


def task_rules(spec: HarnessSearchStage, tasks: dict[str, Any]) -> list[tuple[Loc, str]]:
    task = tasks.get(spec.task)
    if task is not None and not isinstance(task, EnvTask):
        return [(("task",), f"{spec.task!r} is a single-turn task; a harness plays an environment task")]
    return []


def describe(spec: HarnessSearchStage, recipe: Any) -> str:
    p = spec.proposer
    if isinstance(p, KnobProposer):
        who = f"knob search (<= {p.max_candidates} candidates)"
    else:
        who = f"{p.model} at {p.url}" if isinstance(p, OpenAIProposer) else p.function
    h = spec.held_out
    return (
        f"harness search for {spec.task} from {spec.harness} by {who}: {spec.train_problems} train problems, "
        f"best of {spec.select_top} kept on {h.select_problems} {h.split} problems, reported on {h.final_problems} more"
    )


KIND = StageKind(
    name="harness_search",
    spec=HarnessSearchStage,
    run=run_harness_search,
    describe=describe,
    reads="model",
    produces_model=False,
    help="search the harness (prompt, memory, bootstrap) a frozen model plays an agent task best with",
    outputs=("harness_search.json",),
    tasks=lambda spec: [spec.task],
    task_rules=task_rules,
    files=lambda spec: [(("harness",), spec.harness)],
    splits=lambda spec, tasks: [(spec.task, "train"), (spec.task, spec.held_out.split)],
    renders_chats=lambda spec, base_dir: True,
    main_only=True,
    summary=summary_table,
    order=88,  # after select (a model is chosen first), before eval
)
