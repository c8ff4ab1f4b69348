"""Where each RL sample came from, for rollouts.jsonl and the report: the policy version (the
number of updates applied to the weights that sampled it), the sampler's kind and settings, the
chat template's hash, and each task's graders (a reward function as `module:function` with the
sha256 of its file; a built-in verifier as its class `module:Class` with the task's fingerprint,
or else the sha256 of the class's source file).

Everything but the policy version is fixed for a run, so `RunProvenance` computes it once, at the
start; `row(task, version)` only picks the task's entry.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.tasks.base import Fingerprinted, Task
from temper.tasks.dataset_task import DataTask


def sha(text: str | bytes) -> str:
    """The first 12 hex digits of sha256 (enough to tell two versions apart in a log)."""
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()[:12]


def chat_template_hash(tokenizer: Any) -> str | None:
    """sha of the tokenizer's chat template, or None when it has none."""
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    return sha(template if isinstance(template, str) else repr(template)) if template else None


def graders(task: Task) -> list[dict[str, str]]:
    """The identity of what grades `task`: its reward functions, or its verifier class."""
    if isinstance(task, DataTask) and task.rewards:
        return [{"name": f.name, "sha": sha(f.source) if f.source else ""} for f in task.rewards]
    cls = type(task)
    entry = {"name": f"{cls.__module__}:{cls.__qualname__}"}
    if isinstance(task, Fingerprinted):
        return [entry | {"fingerprint": task.fingerprint()}]
    try:
        entry["sha"] = sha(Path(inspect.getsourcefile(cls) or "").read_bytes())
    except (OSError, TypeError):
        entry["sha"] = ""
    return [entry]


def sampler_kind(sampler: Any, base: Any = None) -> str:
    """The sampler's class name; with a feature's wrapper, `Wrapper(Base)`."""
    kind = type(sampler).__name__
    return kind if base is None or base is sampler else f"{kind}({type(base).__name__})"


@dataclass
class RunProvenance:
    """What every sample of a run shares, computed once; `row` adds the policy version."""

    sampler: dict[str, Any]
    chat_template: str | None
    task_graders: dict[str, list[dict[str, str]]]

    @classmethod
    def of_run(
        cls, sampler: Any, tokenizer: Any, tasks: list[Task], config: Any, base: Any = None
    ) -> RunProvenance:
        """`sampler`: what training draws from; `base`: the sampler a feature wrapped, if any."""
        settings = {
            "kind": sampler_kind(sampler, base),
            "temperature": config.temperature,
            "top_p": config.top_p,
            "top_k": 0,
            "max_new_tokens": config.max_new_tokens,
            "seed": config.seed,
        }
        return cls(settings, chat_template_hash(tokenizer), {t.name: graders(t) for t in tasks})

    def row(self, task: str, policy_version: int) -> dict[str, Any]:
        return {
            "policy_version": policy_version,
            "sampler": self.sampler,
            "chat_template": self.chat_template,
            "graders": self.task_graders.get(task, []),
        }
