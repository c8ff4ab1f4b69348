"""simulated_search: a ZeroSearch-style environment whose search results are written by a second LM.

    user        capital of Tavor?                              (the problem's prompt)
    assistant   search: Tavor
    user        doc: The capital of Tavor is Mikel.            (written by the SIMULATOR, never trained)
    assistant   answer: Mikel                                  -> outcome 1

ZeroSearch (Sun et al. 2025, "ZeroSearch: Incentivize the Search Capability of LLMs without
Searching") replaces the search engine of search-agent RL by an LLM prompted to write either
useful or noisy documents for the agent's query, and raises the share of noisy documents over
training. Here the world is synthetic (made-up countries and capitals, a pure function of the
problem's seed), so the policy cannot know the answer and must search and read:
- the useful prompt gives the simulator the true fact, the noisy prompt a distractor (another
  made-up country's capital), and the simulator writes the document from it (`simulator_prompt`);
  a query that does not name the problem's country gets the distractor too (nothing relevant);
- each search is noisy with probability p, drawn per episode and per search, so the members of a
  group see different documents; a policy that reads an off-topic document can search again
  (up to `max_searches`), one that answers from it is wrong.

The simulator is any causal LM temper loads (`simulator`: a model folder or hub id, or a preset
name for an untrained from-scratch model, which only tests plumbing). It is loaded once per
process and shared by every env (`load_simulator`), frozen (`requires_grad_(False)`, eval mode)
and sampled under `torch.inference_mode` by an `HFSampler` of its own: one batched call per round
(`SimulatedSearchEnv.step_batch`, with `batch_across_groups`: the agent loop then steps every
env of the round in one call, in the main thread).
What it writes reaches the policy only as a `user` message, so the agent loop appends it as
environment tokens (`Segment(trainable=False, logprobs=None)`): never trained on, never scored
by the policy's logprobs. To write documents at all the tiny default needs the short fine-tuning
ZeroSearch gives its simulator: `search_documents` is that task (the simulator prompt -> the
document), trained by an ordinary SFT stage (`recipes/agent_simulated_search.yaml`).

Reproducibility: an episode's random draws (noisy or useful, and the simulator's sampling seed
when `simulator_temperature` > 0) are a pure function of (the problem's `nonce`, the episode's
ordinal among the envs made for that problem object, the search index). The nonce is the draw's
seed (RL: derived from the run seed and the step), and the ordinal counts `make_env` calls per
problem object, which the RL loop and `evaluate` make in a fixed order; so a rerun or a resume
replays the same documents for the same actions. With the default greedy simulator the document
is a function of the prompt alone.

The noise curriculum (`NoiseCurriculum`): p(step) from `noise_start` to `noise_end` over
`noise_steps` RL steps, `linear` or ZeroSearch's `exponential` schedule (their Eq. for p_i with
base b). How the env learns the step: the RL loop draws training problems through
`sample_at_step(split, n, seed, step)` when a task has it (`temper.train.rl.problems_for_step`),
and the problem records p(step) in `data["noise"]`; the env reads it from its problem. So the
level is part of the drawn problem, a pure function of the step like the problems themselves
(resume, several processes and the rollout log all agree), and no state is shared between the
trainer and the env. Problems drawn without a step (SFT demonstrations, evaluation, the RL
gate) use the fixed `noise` option.
"""

from __future__ import annotations

import random
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from temper.envs.base import StepResult
from temper.rollout.sampler import derive_seed
from temper.tasks.base import Problem, Score, TaskOptionError, check_split, draw

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch

# --- the synthetic world ---------------------------------------------------------------------

_ONSETS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_CODAS = "lmnrst"


def made_up_name(rng: random.Random, syllables: int) -> str:
    """A pronounceable made-up name: consonant-vowel syllables and a final consonant ("Tavor")."""
    name = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)
    return name.capitalize()


def world(seed: int, syllables: int) -> dict[str, str]:
    """The problem's facts: a country and its capital, and a distractor country and capital
    (four distinct names), a pure function of `seed`."""
    rng = random.Random(f"simulated_search:world:{seed}")
    names: list[str] = []
    while len(names) < 4:
        name = made_up_name(rng, syllables)
        if name not in names:
            names.append(name)
    return dict(zip(("country", "capital", "other_country", "other_capital"), names, strict=True))


def document(country: str, capital: str) -> str:
    """The document a perfect simulator writes from a fact (the SFT target of `search_documents`)."""
    return f"The capital of {country} is {capital}."


def simulator_prompt(query: str, country: str, capital: str, noisy: bool) -> str:
    """ZeroSearch's two prompts, cut to what a 1M-parameter byte model reads: the query, the kind
    of document wanted, and the fact to write it from (the true one or a distractor)."""
    kind = "noisy" if noisy else "useful"
    return f"Write a {kind} doc for the query.\nquery: {query[:40]}\nfact: {document(country, capital)}"


def doc_holds(doc: str, country: str, capital: str) -> bool:
    """The document states `capital` as `country`'s capital (both names present, case-insensitive)."""
    low = doc.lower()
    return country.lower() in low and capital.lower() in low


# --- the noise curriculum --------------------------------------------------------------------


@dataclass(frozen=True)
class NoiseCurriculum:
    """p(step), the probability that a search is answered from the noisy prompt.

    constant:    p = start
    linear:      p = start + (end - start) * min(step / steps, 1)
    exponential: p = start + (end - start) * (base ** min(step / steps, 1) - 1) / (base - 1)
                 (ZeroSearch's curriculum, Sun et al. 2025 §3.4, base b = 4 there: slow at first,
                 then faster; base -> 1 tends to linear)
    `step` counts RL steps from 0 (the first step's batch is drawn at step 0)."""

    start: float = 0.0
    end: float = 0.0
    steps: int = 0
    schedule: Literal["constant", "linear", "exponential"] = "constant"
    base: float = 4.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.start <= 1.0 and 0.0 <= self.end <= 1.0):
            raise ValueError(f"noise levels are probabilities, got start {self.start}, end {self.end}")
        if self.schedule not in ("constant", "linear", "exponential"):
            raise ValueError(f"unknown noise schedule {self.schedule!r} (constant, linear, exponential)")
        if self.schedule != "constant" and self.steps < 1:
            raise ValueError(f"a {self.schedule} noise schedule needs noise_steps >= 1")
        if self.schedule == "exponential" and (self.base <= 0 or self.base == 1):
            raise ValueError(f"the exponential schedule needs a base > 0 other than 1, got {self.base}")

    def at(self, step: int) -> float:
        if self.schedule == "constant":
            return self.start
        frac = min(max(step, 0) / self.steps, 1.0)
        if self.schedule == "exponential":
            frac = (self.base**frac - 1) / (self.base - 1)
        return self.start + (self.end - self.start) * frac


# --- the simulator ---------------------------------------------------------------------------


class Simulator:
    """A frozen causal LM that writes documents: `write(prompts, seeds) -> texts`, one batched call."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, name: str = ""):
        from temper.rollout.hf_sampler import HFSampler

        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.sampler = HFSampler(self.model, tokenizer)
        self.calls = 0  # sampler calls, for tests and logs
        self._lock = threading.Lock()  # one model: envs stepped by hand from threads take turns

    def write(
        self, prompts: Sequence[str], seeds: Sequence[int], *, max_new_tokens: int, temperature: float
    ) -> list[str]:
        import torch

        from temper.data.chat import prompt_ids

        if not prompts:
            return []
        ids = [prompt_ids(self.tokenizer, [{"role": "user", "content": p}]) for p in prompts]
        with self._lock, torch.inference_mode():
            samples = self.sampler.sample(
                ids, 1, max_new_tokens=max_new_tokens, temperature=temperature, seed=list(seeds)
            )
            self.calls += 1
        return [" ".join(s[0].text.split()) for s in samples]


_SIMULATORS: dict[tuple[str, int], Simulator] = {}
_LOAD_LOCK = threading.Lock()


def register_simulator(spec: str, simulator: Any) -> None:
    """Make `simulator` (a `Simulator` over a model already in memory, or any object with the same
    `write`) the one `load_simulator(spec)` returns: a test double, a model built in code."""
    with _LOAD_LOCK:
        _SIMULATORS[(spec, 0)] = simulator


def load_simulator(spec: str, seed: int = 0) -> Simulator:
    """The simulator named by `spec`, loaded once per process: a preset name (an untrained
    from-scratch model with the byte tokenizer, seeded), else a model folder (relative to the
    working directory, like a recipe's runs/ folder) or hub id, loaded as every stage loads one."""
    from temper.models.presets import PRESETS

    key = (spec, seed if spec in PRESETS else 0)
    with _LOAD_LOCK:
        if key not in _SIMULATORS:
            if spec in PRESETS:
                from temper.models import build_preset, build_tokenizer
                from temper.models.loading import default_device

                tokenizer = build_tokenizer()
                model = build_preset(spec, tokenizer, seed=seed).to(default_device())
            else:
                from temper.models.loading import load_model, load_tokenizer

                tokenizer, model = load_tokenizer(spec), load_model(spec)
            _SIMULATORS[key] = Simulator(model, tokenizer, spec)
        return _SIMULATORS[key]


# --- the tasks -------------------------------------------------------------------------------

INSTRUCTIONS = "Reply 'search: QUERY' to search, then 'answer: CITY'."


@dataclass(frozen=True)
class SimulatedSearchConfig:
    simulator: str = "tiny"
    """The simulator: a model folder (relative to the working directory) or hub id, or a preset
    name (an untrained model, for tests of the plumbing only)."""
    simulator_seed: int = 0
    """Initialization seed of a preset simulator."""
    simulator_temperature: float = 0.0
    """0: greedy documents (a function of the simulator prompt); > 0: sampled, seeded per search."""
    doc_tokens: int = 48
    """Most tokens the simulator writes per document."""
    noise: float = 0.0
    """p(noisy document) for problems drawn without a step: evaluation, the RL gate, SFT."""
    noise_start: float = 0.0
    noise_end: float = 0.0
    noise_steps: int = 0
    """RL steps over which the training noise goes from noise_start to noise_end (then stays)."""
    noise_schedule: str = "constant"
    """constant (noise_start throughout), linear or exponential (ZeroSearch's, base noise_base)."""
    noise_base: float = 4.0
    max_searches: int = 2
    """Searches per episode; an episode ends unanswered after max_searches + 1 turns."""
    demo_noise: float = 0.3
    """Share of SFT demonstrations whose first document is off-topic and that search again."""
    instructions: bool = False
    """Add INSTRUCTIONS to the prompt (the tiny default learns the protocol from demonstrations)."""
    syllables: int = 2
    """Name length of train and test worlds; ood worlds have one syllable more (unseen names)."""
    train_seed: int = 0
    train_worlds: int = 100_000
    test_seed: int = 1_000_000
    test_worlds: int = 1000
    ood_seed: int = 2_000_000
    ood_worlds: int = 1000

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise <= 1.0 or not 0.0 <= self.demo_noise <= 1.0:
            raise ValueError("noise and demo_noise are probabilities in [0, 1]")
        if self.max_searches < 1 or self.doc_tokens < 1 or self.syllables < 1:
            raise ValueError("max_searches, doc_tokens and syllables must be at least 1")
        if self.simulator_temperature < 0:
            raise ValueError("simulator_temperature must be >= 0")
        self.curriculum()  # its errors are the config's

    def curriculum(self) -> NoiseCurriculum:
        return NoiseCurriculum(
            self.noise_start, self.noise_end, self.noise_steps, self.noise_schedule, self.noise_base
        )  # type: ignore[arg-type]

    def seeds(self, split: str) -> range:
        start, count = {
            "train": (self.train_seed, self.train_worlds),
            "test": (self.test_seed, self.test_worlds),
            "ood": (self.ood_seed, self.ood_worlds),
        }[split]
        return range(start, start + count)

    def split_syllables(self, split: str) -> int:
        return self.syllables + (split == "ood")


def _check(config: SimulatedSearchConfig, name: str) -> None:
    ranges = {s: config.seeds(s) for s in ("train", "test", "ood")}
    for a, ra in ranges.items():
        for b, rb in ranges.items():
            if a < b and ra.start < rb.stop and rb.start < ra.stop:
                raise TaskOptionError((f"{a}_seed",), f"task {name!r}: the {a} and {b} world seeds overlap")


def _draw_seeds(config: SimulatedSearchConfig, split: str, n: int, seed: int) -> list[int]:
    """`n` world seeds of `split` (with repeats for train), seeded by `seed`, without listing a
    range of 100k seeds: train seeds are drawn uniformly, held-out ones without repeats."""
    check_split(split)
    pool = config.seeds(split)
    rng = random.Random(f"simulated_search:{split}:{seed}")
    if split == "train":
        return [rng.randrange(pool.start, pool.stop) for _ in range(n)]
    return draw(list(pool), f"simulated_search:{split}:{seed}", n, repeat=False)


@dataclass(frozen=True)
class SimulatedSearchTask:
    """Questions about a synthetic world answered by searching a simulated engine (module docstring)."""

    config: SimulatedSearchConfig = field(default_factory=SimulatedSearchConfig)
    name: ClassVar[str] = "simulated_search"
    config_type: ClassVar[type] = SimulatedSearchConfig
    _ordinals: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _ordinal_lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    @classmethod
    def build(
        cls, config: SimulatedSearchConfig, name: str, base_dir: Path | None = None
    ) -> SimulatedSearchTask:
        _check(config, name)
        return cls(config)

    @property
    def max_turns(self) -> int:
        return self.config.max_searches + 1

    @property
    def simulator(self) -> Simulator:
        return load_simulator(self.config.simulator, self.config.simulator_seed)

    def problem(self, split: str, seed: int, noise: float, nonce: int) -> Problem:
        facts = world(seed, self.config.split_syllables(split))
        head = f"{INSTRUCTIONS}\n" if self.config.instructions else ""
        prompt = f"{head}capital of {facts['country']}?"
        data = {"seed": seed, "noise": noise, "nonce": nonce, **facts}
        return Problem(self.name, split, f"world{seed}", prompt, data)

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` worlds of `split` at the fixed `noise` level."""
        return self._sample(split, n, seed, self.config.noise)

    def sample_at_step(self, split: str, n: int, seed: int, step: int) -> list[Problem]:
        """Training problems of RL step `step`: at the curriculum's noise level p(step)."""
        return self._sample(split, n, seed, self.config.curriculum().at(step))

    def _sample(self, split: str, n: int, seed: int, noise: float) -> list[Problem]:
        seeds = _draw_seeds(self.config, split, n, seed)
        return [self.problem(split, s, noise, nonce=derive_seed(seed, i)) for i, s in enumerate(seeds)]

    def make_env(self, problem: Problem) -> SimulatedSearchEnv:
        return SimulatedSearchEnv(self, problem, self._ordinal(problem))

    def _ordinal(self, problem: Problem) -> int:
        """How many envs were made for this problem object before: the episode's index in its
        group (the RL loop and `evaluate` make a group's envs in order)."""
        with self._ordinal_lock:
            key = id(problem)
            ref, count = self._ordinals.get(key, (None, 0))
            if ref is None or ref() is not problem:
                count = 0
                if len(self._ordinals) > 4096:  # forget problems that are gone
                    for k in [k for k, (r, _) in self._ordinals.items() if r() is None]:
                        del self._ordinals[k]
            self._ordinals[key] = (weakref.ref(problem), count + 1)
            return count

    def demonstration_messages(self, problem: Problem) -> list[dict[str, Any]]:
        """A scripted episode with the documents a perfect simulator writes (no simulator needed):
        search the country, read, answer; in a `demo_noise` share of problems (seeded by the
        world) the first document is the distractor's and the demonstration searches again."""
        d = problem.data
        noisy_first = random.Random(f"simulated_search:demo:{d['seed']}").random() < self.config.demo_noise
        messages = problem.messages()
        searches = 2 if noisy_first and self.config.max_searches >= 2 else 1
        for i in range(searches):
            fact = (
                (d["other_country"], d["other_capital"]) if i < searches - 1 else (d["country"], d["capital"])
            )
            messages.append({"role": "assistant", "content": f"search: {d['country']}"})
            messages.append({"role": "user", "content": f"doc: {document(*fact)}"})
        messages.append({"role": "assistant", "content": f"answer: {d['capital']}"})
        return messages

    def demonstration(self, problem: Problem) -> str:
        return f"answer: {problem.data['capital']}"

    def score(self, problem: Problem, completion: str) -> Score:
        """A completion read as a final turn: the answer it gives (a search is no answer)."""
        return _grade(problem, parse_action(completion), searches=0, noisy=0)

    def corpus_text(self, problem: Problem) -> str:
        d = problem.data
        return f"{problem.prompt}\nsearch: {d['country']}\n{document(d['country'], d['capital'])}\nanswer: {d['capital']}"


def parse_action(text: str) -> tuple[str, str]:
    """("search", query) | ("answer", name) | ("invalid", text), from the turn's first line that
    starts with either keyword (case-insensitive)."""
    for line in text.strip().splitlines():
        head, sep, rest = line.strip().partition(":")
        if sep and head.strip().lower() in ("search", "answer"):
            return head.strip().lower(), rest.strip()
    return "invalid", text.strip()


def _grade(problem: Problem, action: tuple[str, str], searches: int, noisy: int) -> Score:
    kind, value = action
    if kind != "answer":
        reason = "no_answer"
        correct = False
    else:
        correct = value.strip().rstrip(".").lower() == problem.data["capital"].lower()
        reason = "correct" if correct else "wrong_answer"
    details = {"reason": reason, "searches": searches, "noisy_docs": noisy}
    return Score(float(correct), correct, kind == "answer", details)


class SimulatedSearchEnv:
    """One episode: search (the simulator answers) until the policy answers or runs out of turns."""

    stop = ()
    batch_across_groups = True  # the agent loop steps a whole round's envs in one step_batch call

    def __init__(self, task: SimulatedSearchTask, problem: Problem, ordinal: int = 0):
        self.task, self.problem, self.ordinal = task, problem, ordinal
        self.turns = self.searches = self.noisy_docs = 0

    def reset(self) -> list[dict[str, Any]]:
        return self.problem.messages()

    def step(self, action: str) -> StepResult:
        return self.step_batch([self], [action], [[]])[0]

    def draw(self, search: int) -> tuple[bool, int]:
        """(noisy?, the simulator's sampling seed) of this episode's search number `search`."""
        rng = random.Random(f"simulated_search:{self.problem.data['nonce']}:{self.ordinal}:{search}")
        return rng.random() < self.problem.data["noise"], rng.randrange(2**31)

    @staticmethod
    def step_batch(
        envs: Sequence[SimulatedSearchEnv], actions: Sequence[str], ids: Sequence[Sequence[int]]
    ) -> list[StepResult]:
        """Step envs of one task together: every search of the batch in ONE simulator call."""
        parsed = [parse_action(a) for a in actions]
        prompts, seeds, pending = [], [], []
        results: list[StepResult | None] = [None] * len(envs)
        for i, (env, (kind, value)) in enumerate(zip(envs, parsed, strict=True)):
            env.turns += 1
            out_of_turns = env.turns >= env.task.max_turns
            if kind == "search" and not out_of_turns:
                d = env.problem.data
                noisy, seed = env.draw(env.searches)
                on_topic = d["country"].lower() in value.lower()
                fact = (
                    (d["country"], d["capital"])
                    if on_topic and not noisy
                    else (d["other_country"], d["other_capital"])
                )
                prompts.append(simulator_prompt(value, *fact, noisy=noisy or not on_topic))
                seeds.append(seed)
                pending.append((i, noisy, on_topic))
                env.searches += 1
                env.noisy_docs += int(noisy)
            elif kind == "answer" or out_of_turns:
                signals = {"invalid": int(kind == "invalid"), "answered": int(kind == "answer")}
                score = _grade(env.problem, (kind, value), env.searches, env.noisy_docs)
                signals["correct"] = int(score.correct)
                results[i] = StepResult(done=True, signals=signals, score=score)
            else:
                note = "say 'search: QUERY' or 'answer: CITY'"
                results[i] = StepResult(messages=[{"role": "user", "content": note}], signals={"invalid": 1})
        if prompts:
            task = envs[0].task
            docs = task.simulator.write(
                prompts,
                seeds,
                max_new_tokens=task.config.doc_tokens,
                temperature=task.config.simulator_temperature,
            )
            for (i, noisy, on_topic), doc in zip(pending, docs, strict=True):
                d = envs[i].problem.data
                signals = {
                    "search": 1,
                    "noisy": int(noisy),
                    "off_topic": int(not on_topic),
                    "doc_has_answer": int(doc_holds(doc, d["country"], d["capital"])),
                }
                results[i] = StepResult(
                    messages=[{"role": "user", "content": f"doc: {doc}"}], signals=signals
                )
        return results  # type: ignore[return-value]


# --- the simulator's own task ----------------------------------------------------------------


@dataclass(frozen=True)
class SearchDocumentsConfig:
    noisy_share: float = 0.5
    """Share of problems written from the noisy prompt (the distractor fact)."""
    syllables: int = 2
    train_seed: int = 0
    train_worlds: int = 100_000
    test_seed: int = 1_000_000
    test_worlds: int = 1000
    ood_seed: int = 2_000_000
    ood_worlds: int = 1000

    def __post_init__(self) -> None:
        if not 0.0 <= self.noisy_share <= 1.0:
            raise ValueError("noisy_share is a probability in [0, 1]")

    seeds = SimulatedSearchConfig.seeds
    split_syllables = SimulatedSearchConfig.split_syllables


_QUERIES = ("{c}", "capital of {c}", "{c} capital", "what is the capital of {c}")


@dataclass(frozen=True)
class SearchDocumentsTask:
    """The simulator's fine-tuning task (ZeroSearch §3.3, here by demonstration): the prompt is a
    simulator prompt (useful or noisy, with the query an agent would write), the answer the
    document. Graded by whether the document states the fact it was given."""

    config: SearchDocumentsConfig = field(default_factory=SearchDocumentsConfig)
    name: ClassVar[str] = "search_documents"
    config_type: ClassVar[type] = SearchDocumentsConfig

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        out = []
        for s in _draw_seeds(self.config, split, n, seed):  # type: ignore[arg-type]
            facts = world(s, self.config.split_syllables(split))
            rng = random.Random(f"search_documents:{s}")
            noisy = rng.random() < self.config.noisy_share
            fact = (
                (facts["other_country"], facts["other_capital"])
                if noisy
                else (facts["country"], facts["capital"])
            )
            query = rng.choice(_QUERIES).format(c=facts["country"])
            data = {"seed": s, "noisy": noisy, "country": fact[0], "capital": fact[1]}
            out.append(
                Problem(self.name, split, f"doc{s}", simulator_prompt(query, *fact, noisy=noisy), data)
            )
        return out

    def demonstration(self, problem: Problem) -> str:
        return document(problem.data["country"], problem.data["capital"])

    def score(self, problem: Problem, completion: str) -> Score:
        d = problem.data
        exact = " ".join(completion.split()) == document(d["country"], d["capital"])
        holds = doc_holds(completion, d["country"], d["capital"])
        return Score(
            float(holds), holds, exact, {"reason": "exact" if exact else "holds" if holds else "wrong"}
        )

    def corpus_text(self, problem: Problem) -> str:
        return f"{problem.prompt}\n{self.demonstration(problem)}"
