"""Stand-ins shared by several test files: a fake clock, a recording progress bar, a stub
tokenizer spelled by hand, toy tasks and scripted samplers. One copy each, so a fix to a fake
reaches every test that uses it. Test files import them by name (`from fakes import Clock`):
pytest puts tests/ on sys.path (rootdir import mode, no __init__.py), as for tiny_qwen.py."""

from __future__ import annotations

from dataclasses import dataclass

from temper.rollout.sampler import Sample
from temper.tasks.base import Problem, Score

# ---- time and progress ------------------------------------------------------------------------------


class Clock:
    """Stands in for the `time` module of the code under test: `perf_counter()` advances `step`
    seconds per call from `start`; `now` is the last value it gave (`start` before the first call)."""

    def __init__(self, start: float = 0.0, step: float = 0.5):
        self.now, self.step = start, step

    def perf_counter(self):
        self.now += self.step
        return self.now


class Progress:
    """Stands in for `progress_bar`: records progress_bar(enabled), add_task and update."""

    def __init__(self):
        self.calls: list = []

    def __call__(self, enabled):
        self.calls.append(("progress_bar", enabled))
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *args, **kwargs):
        self.calls.append(("add_task", args, kwargs))
        return "bar"

    def update(self, *args, **kwargs):
        self.calls.append(("update", args, kwargs))


# ---- a tokenizer known by hand -------------------------------------------------------------------------

BOS, EOS = 1, 2


class Stub:
    """A tokenizer that spells each character as its code point, adds BOS when asked for special
    tokens (as a Llama tokenizer does by default), and renders a chat as `role:content|` per
    turn, with `assistant:` as the generation prompt. `rewrite` drops the content of every
    assistant turn but the last, as templates that strip earlier reasoning do."""

    eos_token_id = EOS

    def __init__(self, rewrite=False):
        self.rewrite = rewrite

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([BOS] if add_special_tokens else []) + [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i > 2)

    def apply_chat_template(
        self, messages, tokenize=True, add_generation_prompt=False, return_dict=False, tools=None
    ):
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        text = "".join(
            f"{m['role']}:{'' if self.rewrite and m['role'] == 'assistant' and i != last else m['content']}|"
            for i, m in enumerate(messages)
        )
        text += "assistant:" if add_generation_prompt else ""
        return {"input_ids": [ord(c) for c in text]}


def codes(text):
    return [ord(c) for c in text]


# ---- toy tasks -----------------------------------------------------------------------------------------


@dataclass
class FirstByteTask:
    """Reward 1 when the completion's first character is ASCII below 'P' (about a third of the
    byte vocabulary for a random model): learnable in a few steps, with variance in every group."""

    name: str = "first_byte"

    def sample(self, split, n, seed):
        return [Problem(self.name, split, f"{seed}-{i}", f"q{(seed + i) % 7}") for i in range(n)]

    def score(self, problem, completion):
        ok = bool(completion) and completion[0] < "P"
        return Score(float(ok), ok, bool(completion), {"reason": "correct" if ok else "wrong"})

    def demonstration(self, problem):
        return "A"

    def corpus_text(self, problem):
        return problem.prompt


class YesTask:
    """Grades "yes" right and anything else wrong; problem ids carry the seed, so a test can
    tell which draw a problem came from."""

    name = "toy"

    def __init__(self, name="toy"):
        self.name = name

    def sample(self, split, n, seed):
        return [
            Problem(self.name, split, f"{self.name}-{seed % 10_000}-{j}", f"q {j}", {"seed": seed})
            for j in range(n)
        ]

    def score(self, problem, completion):
        ok = completion == "yes"
        return Score(1.0 if ok else 0.0, ok, completion != "", {"reason": "ok" if ok else "wrong"})


# ---- scripted samplers ---------------------------------------------------------------------------------


class PatternSampler:
    """Returns, per prompt, `n` samples of `length` tokens: "yes" for sample 0 and "no" for the
    others when the prompt's pattern is True (rewards differ), "no" for all when False."""

    def __init__(self, patterns, length=4, lengths=None):
        self.patterns, self.length, self.lengths = list(patterns), length, lengths
        self.calls: list[dict] = []
        self.synced = 0

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, stop=(), seed=0):
        self.calls.append(
            {"prompts": [list(p) for p in prompts], "n": n, "max_new_tokens": max_new_tokens, "temperature": temperature,
             "top_p": top_p, "seed": list(seed)}
        )  # fmt: skip
        out = []
        for i, (p, vary) in enumerate(zip(prompts, self.patterns.pop(0), strict=True)):
            group = []
            for j in range(n):
                length = self.lengths[(i + j) % len(self.lengths)] if self.lengths else self.length
                text = "yes" if vary and j == 0 else "no"
                group.append(Sample(p, [7 + j] * length, [-0.5] * length, text, "eos"))
            out.append(group)
        return out

    def sync(self, model):
        self.synced += 1


class Script:
    """A `Sampler` with no model: `reply(prompt_text, round)` gives the completion text; a stop
    string ends it there (reason "stop"), otherwise it ends with the eos token. Token ids are the
    byte tokenizer's; logprob of token t is -(t + 1) / 100 so misplaced logprobs show."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.calls = tokenizer, reply, []

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, stop=(), seed=0):
        self.calls.append({"prompts": len(prompts), "n": n, "stop": list(stop), "seed": seed})
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            out.append([self._one(prompt, self.reply(text, j), max_new_tokens, stop) for j in range(n)])
        return out

    def _one(self, prompt, text, max_new_tokens, stop):
        cut = min((text.find(s) + len(s) for s in stop if s in text), default=None)
        reason = "stop" if cut is not None else "eos"
        body = text[:cut] if cut is not None else text
        ids = self.tokenizer.encode(body, add_special_tokens=False)
        if reason == "eos":
            ids = ids + [self.tokenizer.eos_token_id]
        if len(ids) > max_new_tokens:
            ids, reason = ids[:max_new_tokens], "length"
        shown = self.tokenizer.decode(ids if reason != "eos" else ids[:-1], skip_special_tokens=True)
        if reason == "stop":
            shown = shown[: shown.rfind(next(s for s in stop if shown.endswith(s)))]
        return Sample(list(prompt), ids, [-(t + 1) / 100 for t in range(len(ids))], shown, reason)

    def sync(self, model):
        pass
