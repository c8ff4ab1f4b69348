"""Generative judges: a model grades a response against a rubric, and its verdict becomes a reward.

LLM-as-a-judge (Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena") and
AI feedback (Bai et al. 2022, "Constitutional AI"; Lee et al. 2023, "RLAIF"): where no verifier
exists, a model reads the prompt, the response and a rubric and writes a verdict. The judge is
either a causal LM temper loads, sampled greedily through the `Sampler` (`LocalJudge`, one batched
call for many responses), or any OpenAI-compatible chat endpoint (`EndpointJudge`: vLLM, TGI,
llama.cpp, a hosted API).

A judge's text is free-form, so its verdict is parsed (`parse_verdict`, a pure function over the
common forms: `Score: 7/10`, `[[8]]`, `Verdict: PASS`, `{"score": 0.8}`) into [0, 1]. A verdict
that cannot be parsed is never read as 0: it is counted (`judge/unparseable`) and either left out
of the judge's signal or given the configured `fallback` (`judge_parts`).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict

from temper import guard
from temper.guard import UserCodeError
from temper.stats import wilson_interval

RUBRIC = (
    "You are grading an answer to a question. Decide whether the answer is correct and complete. "
    "Think briefly, then end with a line of the form 'Score: N/10' (10: fully correct, 0: wrong)."
)
"""The default rubric: a 0-10 score with the scale written out, the form `parse_verdict` reads first."""


@dataclass
class JudgeSpec:
    """A generative judge (`train: judge:` of an rl stage, `judge:` of a constitutional stage)."""

    model: str = "policy"
    """Without `url`: `policy` (the model being trained or sampled, judging itself), an earlier
    stage's name, or a model folder. With `url`: the model name the endpoint serves."""
    url: str | None = None
    """An OpenAI-compatible endpoint's base URL (e.g. http://localhost:8000/v1); the judge posts to
    `<url>/chat/completions`."""
    api_key_env: str | None = None
    """The environment variable holding the endpoint's API key (sent as a Bearer token); the key
    itself never goes in a recipe."""
    rubric: str = RUBRIC
    """What the judge is told to check and how to write its verdict."""
    scale: tuple[float, float] = (0.0, 10.0)
    """The range of a bare score (`Score: 7`, `[[7]]`, `{"score": 7}`), mapped linearly onto [0, 1];
    a score with its own maximum (`7/10`, `7 out of 10`, `70%`) is read against that maximum."""
    fallback: float | None = None
    """The judge value of an unparseable verdict; null: left out (in RL, the group's mean of the
    parsed verdicts, so it moves no advantage). Either way it is counted as judge/unparseable."""
    max_new_tokens: int = 64
    """Tokens the judge may write (local) or max_tokens (endpoint)."""
    temperature: float = 0.0
    """0: greedy (a deterministic verdict)."""
    timeout: float = 30.0
    """Seconds per endpoint request."""
    retries: int = 3
    """Retries of a failed endpoint request (connection error, timeout, 429, 5xx), with backoff."""
    backoff: float = 1.0
    """Seconds before the first retry, doubled after each."""
    concurrency: int = 8
    """Endpoint requests in flight at once."""
    verdict: Literal["text", "choice"] = "text"
    """text: the judge writes a verdict, `parse_verdict` reads it. choice (a local judge only): the
    verdict is P(PASS) / (P(PASS) + P(FAIL)) of the two continuations after the chat and "Verdict: ",
    teacher-forced, so every verdict is a number: for a small model that never learned to write a
    verdict (the likelihood-weighted scoring of G-Eval, Liu et al. 2023, with two choices)."""


JudgeSpec.__pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

Loc = tuple[str | int, ...]


def spec_errors(spec: JudgeSpec) -> list[tuple[Loc, str]]:
    """The rules of a judge block that need nothing else, located below it."""
    out: list[tuple[Loc, str]] = []
    lo, hi = spec.scale
    if not hi > lo:
        out.append((("scale",), f"needs lowest < highest, got [{lo:g}, {hi:g}]"))
    if spec.fallback is not None and not 0.0 <= spec.fallback <= 1.0:
        out.append(
            (("fallback",), f"is a judge value in [0, 1] (or null to leave it out), got {spec.fallback:g}")
        )
    if spec.api_key_env and not spec.url:
        out.append((("api_key_env",), "applies to an endpoint judge only: give `url` too"))
    if spec.url and spec.verdict == "choice":
        out.append((("verdict",), "choice needs the judge's token probabilities: a local judge (no url)"))
    if spec.url and not spec.url.startswith(("http://", "https://")):
        out.append((("url",), f"must start with http:// or https://, got {spec.url!r}"))
    for name in ("max_new_tokens", "timeout", "concurrency"):
        if getattr(spec, name) <= 0:
            out.append(((name,), f"must be > 0, got {getattr(spec, name)}"))
    for name in ("temperature", "retries", "backoff"):
        if getattr(spec, name) < 0:
            out.append(((name,), f"must be >= 0, got {getattr(spec, name)}"))
    return out


# ---------------------------------------------------------------------------------------------
# verdict parsing

_NUM = r"[-+]?\d+(?:\.\d+)?"
_BRACKETS = re.compile(rf"\[\[\s*({_NUM})\s*(?:/\s*({_NUM})\s*)?\]\]")
_LABELLED = re.compile(
    rf"\b(?:score|rating|grade|mark)\b[\s*:=]*(?:is|of)?[\s*:=]*({_NUM})\s*"
    rf"(?:(%)|(?:/|out\s+of)\s*({_NUM}))?",
    re.IGNORECASE,
)
_FRACTION = re.compile(rf"(?<![\w.])({_NUM})\s*(?:/|out\s+of)\s*({_NUM})(?![\w.])", re.IGNORECASE)
_SCALES = (5.0, 10.0, 100.0)  # a lone fraction is a verdict only over a usual scale: "1/4 of 8" is a question
_PASS_WORDS = {"pass": 1.0, "passed": 1.0, "correct": 1.0, "yes": 1.0, "good": 1.0, "acceptable": 1.0}
_FAIL_WORDS = {"fail": 0.0, "failed": 0.0, "incorrect": 0.0, "wrong": 0.0, "no": 0.0, "bad": 0.0}
_WORDS = _PASS_WORDS | _FAIL_WORDS
_VERDICT = re.compile(
    r"\b(?:verdict|judgement|judgment|decision|grade|result|answer)\b\s*(?:is|:|=)?\s*\**\s*\[*\s*([a-z]+)",
    re.IGNORECASE,
)
_BARE = re.compile(r"\b(PASS|FAIL|PASSED|FAILED)\b")


def _fraction(value: float, top: float) -> float | None:
    return value / top if top > 0 and 0 <= value <= top else None


def _ranged(value: float, scale: tuple[float, float]) -> float | None:
    lo, hi = scale
    return (value - lo) / (hi - lo) if lo <= value <= hi else None


def _from_json(text: str, scale: tuple[float, float]) -> float | None | bool:
    """The score of the last JSON object in `text` with a score-like key; False: no such object."""
    found: float | None | bool = False
    for match in re.finditer(r"\{[^{}]*\}", text):
        try:
            obj = json.loads(match.group(0))
        except ValueError:
            continue
        key = next((k for k in obj if k.lower() in ("score", "rating", "grade", "verdict")), None)
        if key is None:
            continue
        value = obj[key]
        if isinstance(value, bool):
            found = float(value)
        elif isinstance(value, int | float):
            found = _ranged(float(value), scale)
        elif isinstance(value, str):
            found = parse_verdict(value, scale)
        else:
            found = None
    return found


def parse_verdict(text: str, scale: tuple[float, float] = (0.0, 10.0)) -> float | None:
    """A judge's verdict -> a value in [0, 1], or None when no verdict can be read.

    Read in this order, the last occurrence of the first form found winning (judges reason first
    and give the verdict last):
      1. `[[8]]` or `[[8/10]]` (MT-Bench's format);
      2. a JSON object with a `score` / `rating` / `grade` / `verdict` key;
      3. a labelled score: `Score: 7/10`, `Rating: 4 out of 5`, `score = 85%`, `Score: 7`;
      4. a lone fraction over 5, 10 or 100: `7/10`, `4 out of 5` (not `1/4 of 8`, part of a question);
      5. a labelled word: `Verdict: PASS` / `FAIL` (also correct / incorrect, yes / no);
      6. a bare PASS or FAIL in capitals, when only one of the two appears.
    A fraction is read against its own maximum (x / y), a percentage against 100, a bare number
    against `scale` = (lowest, highest). A value outside its range (`11/10`, `-1`) is unparseable,
    not clipped: a judge writing it has not followed the rubric."""
    if not isinstance(text, str) or not text.strip():
        return None
    if found := _BRACKETS.findall(text):
        value, top = found[-1]
        return _fraction(float(value), float(top)) if top else _ranged(float(value), scale)
    from_json = _from_json(text, scale)
    if from_json is not False:
        return from_json  # type: ignore[return-value]
    if found := _LABELLED.findall(text):
        value, percent, top = found[-1]
        if percent:
            return _fraction(float(value), 100.0)
        return _fraction(float(value), float(top)) if top else _ranged(float(value), scale)
    if found := [f for f in _FRACTION.findall(text) if float(f[1]) in _SCALES]:
        value, top = found[-1]
        return _fraction(float(value), float(top))
    words = [w.lower() for w in _VERDICT.findall(text) if w.lower() in _WORDS]
    if words:
        return _WORDS[words[-1]]
    bare = {w.upper().rstrip("ED") for w in _BARE.findall(text)}
    if len(bare) == 1:
        return 1.0 if bare == {"PASS"} else 0.0
    return None


# ---------------------------------------------------------------------------------------------
# judges


def judge_messages(rubric: str, prompt: str, response: str) -> list[dict[str, str]]:
    """The chat a judge reads: the rubric, the question and the response, clearly delimited."""
    return [
        {
            "role": "user",
            "content": f"{rubric}\n\n[Question]\n{prompt}\n\n[Answer]\n{response}\n\n[Your grade]",
        }
    ]


Complete = Callable[[list[list[dict[str, str]]]], list[str]]
"""A judge backend: chats -> the judge's reply to each, in order."""


class LocalJudge:
    """A causal LM temper loads, sampled through a `Sampler` (greedy by default): all the chats of
    a call go to the sampler as one batch."""

    def __init__(
        self, sampler: Any, tokenizer: Any, max_new_tokens: int = 64, temperature: float = 0.0, seed: int = 0
    ):
        self.sampler, self.tokenizer = sampler, tokenizer
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed

    def __call__(self, chats: list[list[dict[str, str]]]) -> list[str]:
        from temper.data.chat import prompt_ids  # data layer: the one prompt renderer

        if not chats:
            return []
        groups = self.sampler.sample(
            [prompt_ids(self.tokenizer, c) for c in chats],
            1,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=self.seed,
        )
        return [g[0].text for g in groups]


class ChoiceJudge:
    """Verdicts as the likelihood of "PASS" against "FAIL" after the judge's chat and a verdict
    prefix: value = exp(l_pass) / (exp(l_pass) + exp(l_fail)), l_w the summed logprob of w's tokens
    (teacher-forced, no sampling, batched in right-padded chunks)."""

    def __init__(self, model: Any, tokenizer: Any, prefix: str = "Verdict: ", choices: tuple[str, str] = ("PASS", "FAIL"), batch_size: int = 32):  # fmt: skip
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.prefix = tokenizer.encode(prefix, add_special_tokens=False)
        self.choices = [tokenizer.encode(c, add_special_tokens=False) for c in choices]

    def __call__(self, chats: list[list[dict[str, str]]]) -> list[float]:
        import torch

        from temper.data.chat import prompt_ids

        seqs = [(prompt_ids(self.tokenizer, c) + self.prefix, w) for c in chats for w in self.choices]
        scores: list[float] = []
        device = next(self.model.parameters()).device
        with torch.no_grad():
            for start in range(0, len(seqs), self.batch_size):
                chunk = seqs[start : start + self.batch_size]
                width = max(len(p) + len(w) for p, w in chunk)
                ids = torch.zeros((len(chunk), width), dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, (p, w) in enumerate(chunk):
                    ids[i, : len(p) + len(w)] = torch.tensor(p + w)
                    mask[i, : len(p) + len(w)] = 1
                logp = torch.log_softmax(self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float(), -1)  # fmt: skip
                for i, (p, w) in enumerate(chunk):  # token w[k] is predicted at position len(p) + k - 1
                    at = torch.arange(len(p) - 1, len(p) + len(w) - 1, device=device)
                    scores.append(logp[i, at, torch.tensor(w, device=device)].sum().item())
        return [
            torch.sigmoid(torch.tensor(a - b)).item() for a, b in zip(scores[0::2], scores[1::2], strict=True)
        ]


class JudgeUnreachable(UserCodeError):
    """The endpoint did not answer after every retry (the message names it and the last error): a
    failure of what the recipe names, so a run stops with this one line (`temper.guard`)."""


_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class EndpointJudge:
    """An OpenAI-compatible chat-completions endpoint (`POST <url>/chat/completions`), over the
    standard library: one small JSON request per chat, `concurrency` in flight, a `timeout` per
    request, and `retries` with exponential backoff on connection errors, timeouts, 429 and 5xx.
    Any other HTTP error (401, 404: a wrong key or model name) fails at once with the server's
    message; an endpoint that never answers raises `JudgeUnreachable` naming the URL."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_tokens: int = 64,
        temperature: float = 0.0,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 1.0,
        concurrency: int = 8,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model, self.api_key = model, api_key
        self.max_tokens, self.temperature, self.timeout = max_tokens, temperature, timeout
        self.retries, self.backoff, self.concurrency, self.sleep = retries, backoff, concurrency, sleep

    def __call__(self, chats: list[list[dict[str, str]]]) -> list[str]:
        """Every chat's reply, `concurrency` requests at a time, each under a deadline of its
        retries' timeouts and backoffs (a server that trickles bytes keeps every read under its
        timeout but may never finish)."""
        if not chats:
            return []
        limit = (self.retries + 2) * self.timeout + self.backoff * (
            2**self.retries - 1
        )  # (a timeout to spare)
        what = f"judge endpoint {self.endpoint}"
        done = guard.run_all([lambda m=m: self.one(m) for m in chats], limit, self.concurrency, "judge")
        for d in done:
            if d.timed_out:
                raise guard.timed_out(what, limit, "a request")
            if isinstance(d.error, JudgeUnreachable):
                raise d.error
            if d.error is not None:
                raise guard.raised(d.error, what) from d.error
        return [d.value for d in done]

    def one(self, messages: list[dict[str, str]]) -> str:
        body = json.dumps(
            {
                "model": self.model,
                "messages": messages,
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(self.endpoint, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    reply = json.loads(response.read())
                return _reply_text(reply, self.endpoint)
            except urllib.error.HTTPError as err:
                detail = err.read().decode(errors="replace")[:300]
                if err.code not in _RETRY_STATUS:
                    raise JudgeUnreachable(
                        f"judge endpoint {self.endpoint} refused the request: HTTP {err.code} {detail}"
                    ) from None
                last = f"HTTP {err.code} {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                last = str(getattr(err, "reason", err))
        raise JudgeUnreachable(
            f"judge endpoint {self.endpoint} unreachable after {self.retries + 1} attempts "
            f"(timeout {self.timeout:g}s each): {last}"
        )


def _reply_text(reply: Any, endpoint: str) -> str:
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise JudgeUnreachable(
            f"judge endpoint {endpoint} answered without choices[0].message.content: {str(reply)[:300]}"
        ) from None
    return content or ""


@dataclass
class Verdict:
    """One judged response: the judge's text and its parsed value (None: unparseable)."""

    text: str
    value: float | None


@dataclass
class Judge:
    """A backend and the rubric and parsing of a `JudgeSpec`."""

    complete: Complete
    spec: JudgeSpec = field(default_factory=JudgeSpec)
    choose: Callable[[list[list[dict[str, str]]]], list[float]] | None = None
    """With `verdict: choice`: chats -> P(PASS) (`ChoiceJudge`), used instead of a written verdict."""

    def grade(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Verdict]:
        """One verdict per (prompt, response), the judge called once for all of them."""
        chats = [judge_messages(self.spec.rubric, p, r) for p, r in zip(prompts, responses, strict=True)]
        if self.choose is not None:
            return [Verdict(f"P(PASS) = {v:.3f}", v) for v in self.choose(chats)]
        return [Verdict(t, parse_verdict(t, self.spec.scale)) for t in self.complete(chats)]


def endpoint_judge(spec: JudgeSpec, environ: dict[str, str] | None = None) -> Judge:
    """The `Judge` of a spec with a `url`; a named key variable that is unset is an error here,
    before any request."""
    environ = os.environ if environ is None else environ
    key = None
    if spec.api_key_env:
        key = environ.get(spec.api_key_env)
        if not key:
            raise JudgeUnreachable(
                f"judge.api_key_env names {spec.api_key_env}, which is not set in the environment"
            )
    backend = EndpointJudge(
        spec.url or "",
        spec.model,
        api_key=key,
        max_tokens=spec.max_new_tokens,
        temperature=spec.temperature,
        timeout=spec.timeout,
        retries=spec.retries,
        backoff=spec.backoff,
        concurrency=spec.concurrency,
    )
    return Judge(backend, spec)


# ---------------------------------------------------------------------------------------------
# the RL reward component and agreement with a verifier

JUDGE = "judge"
"""The reward component's name in `rewards:`."""


def judge_parts(values: Sequence[float | None], fallback: float | None) -> list[dict[str, float]]:
    """The reward parts of one group's verdicts: `judge` (the value used) and `judge_parsed` (1/0).

    An unparseable verdict gets `fallback`, or with none the mean of the group's parsed verdicts:
    a group-relative estimator then gives it no judge advantage, so it is left out of the judge's
    signal rather than read as a bad grade. A group with no parsed verdict gets 0 for all (a
    constant: no signal), and every unparseable one is still counted."""
    parsed = [v for v in values if v is not None]
    impute = fallback if fallback is not None else (sum(parsed) / len(parsed) if parsed else 0.0)
    return [{JUDGE: impute if v is None else v, "judge_parsed": float(v is not None)} for v in values]


def agreement(values: Sequence[float | None], correct: Sequence[bool]) -> dict[str, Any]:
    """How often the judge agrees with a verifier: over the parsed verdicts, the share where
    (verdict >= 0.5) == correct with its 95% Wilson interval, and Cohen's kappa
    kappa = (p_o - p_e) / (1 - p_e), p_e = p_j p_v + (1 - p_j)(1 - p_v) (p_j, p_v: each rater's
    share of "correct"; Cohen 1960), which discounts the agreement two raters reach by chance
    (a judge that passes everything agrees with a 90%-accurate verifier 90% of the time, kappa 0).
    kappa is None when p_e = 1 (both raters constant and equal)."""
    pairs = [(v >= 0.5, bool(c)) for v, c in zip(values, correct, strict=True) if v is not None]
    n = len(pairs)
    out: dict[str, Any] = {"n": len(values), "parsed": n, "unparseable": len(values) - n}
    if not n:
        return out | {"agreement": None, "lo": None, "hi": None, "kappa": None}
    agree = sum(j == v for j, v in pairs)
    p_j = sum(j for j, _ in pairs) / n
    p_v = sum(v for _, v in pairs) / n
    p_e = p_j * p_v + (1 - p_j) * (1 - p_v)
    lo, hi = wilson_interval(agree, n)
    kappa = None if p_e >= 1 else (agree / n - p_e) / (1 - p_e)
    return out | {
        "agreement": agree / n,
        "lo": lo,
        "hi": hi,
        "kappa": kappa,
        "judge_pass_rate": p_j,
        "verifier_correct_rate": p_v,
    }


GroupScorer = Callable[[list[Any], list[list[Any]]], list[list[dict[str, float]]]]
"""A batch reward component: (the step's problems, each one's episodes) -> per group, per episode,
{component: value} (`temper.train.rollouts.grade_episodes`'s `given`)."""


def judge_scorer(judge: Judge) -> GroupScorer:
    """The `judge` reward component: every episode of the step judged in one call (the problem's
    prompt, the episode's last assistant message), parsed, and made into parts by `judge_parts`."""

    def score(problems: list[Any], episodes: list[list[Any]]) -> list[list[dict[str, float]]]:
        prompts = [p.prompt for p, group in zip(problems, episodes, strict=True) for _ in group]
        responses = [_last_answer(t) for group in episodes for t in group]
        values = iter(v.value for v in judge.grade(prompts, responses))
        return [judge_parts([next(values) for _ in group], judge.spec.fallback) for group in episodes]

    return score


def _last_answer(trajectory: Any) -> str:
    """What the policy answered last (the text a single-turn task grades)."""
    last = trajectory.messages[-1] if trajectory.messages else {}
    return last.get("content") or "" if last.get("role") == "assistant" else ""
