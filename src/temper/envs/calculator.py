"""calculator_arithmetic: arithmetic with an inline code tool (ReTool's protocol, Feng et al. 2025).

The tiny default multiplies short numbers in its head and fails on longer ones (length
generalization is what it lacks). Here it may write a program instead:

    prompt         4821*7=?
    policy         <code>print(4821*7)</code>
    environment    <interpreter>33747</interpreter>          (inserted, never trained on)
    policy         \\nAnswer: 33747<|end|>

Sampling pauses at `</code>`; the code runs in `temper.sandbox` (untrusted code from the model
never runs anywhere else); its output, truncated to `max_output_chars`, comes back inline as
`<interpreter>...</interpreter>` and the policy continues the same assistant turn. The episode
ends when a turn ends without a code block (the answer, graded by the arithmetic verifier) or
at the limits (`max_calls` tool calls).

Rewards: the outcome is the arithmetic grade of the final answer; each tool call costs
`call_cost` as a (negative) per-step reward, so with a `process` weight RL can learn when a call
pays (the optional-tool variant: `mental_ops` are demonstrated without the tool). Signals per
step: `tool_calls`, `tool_errors` (non-zero exit, timeout or output cut), `sandbox_seconds`.

A sandbox failure (no tier on the host, bubblewrap broken) raises: it is an infrastructure error
and ends the episode as "env_error", never a zero reward for the model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from temper.envs.base import StepResult
from temper.tasks.arithmetic import Arithmetic, ArithmeticConfig
from temper.tasks.base import Problem, Score, split_of

CODE_OPEN, CODE_CLOSE = "<code>", "</code>"
OUT_OPEN, OUT_CLOSE = "<interpreter>", "</interpreter>"
_CODE = re.compile(re.escape(CODE_OPEN) + r"(.*?)" + re.escape(CODE_CLOSE) + r"\s*$", re.DOTALL)


@dataclass(frozen=True)
class CalculatorConfig(ArithmeticConfig):
    """The arithmetic problems (every ArithmeticConfig option) and the tool's settings."""

    ops: tuple[str, ...] = ("*",)
    mental_ops: tuple[str, ...] = ()
    """Ops whose demonstrations answer without the tool (the optional-tool variant)."""
    mental_share: float = 1.0
    """Share of the `mental_ops` problems demonstrated without the tool (a stable hash of the
    problem picks them); the rest are demonstrated with it, so the SFT policy calls the tool on
    those ops some of the time and RL can learn whether a call pays."""
    call_cost: float = 0.05
    """Per-step reward of a tool call: -call_cost (weighted by the `process` reward component)."""
    max_calls: int = 2
    """Tool calls per episode; the next action after the last allowed call must answer."""
    max_output_chars: int = 64
    """Interpreter output shown to the policy (stdout, else stderr's last line), cut beyond this."""
    timeout_s: float = 5.0
    """Wall-clock limit of one program in the sandbox."""
    unsafe: bool = False
    """Run the model's code with rlimits only where no sandbox tier works (never the default)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "mental_ops", tuple(self.mental_ops))
        if any(op not in self.ops for op in self.mental_ops):
            raise ValueError(f"mental_ops must be a subset of ops {self.ops}, got {self.mental_ops}")
        if not 0.0 <= self.mental_share <= 1.0:
            raise ValueError(f"mental_share must be in [0, 1], got {self.mental_share}")
        if self.max_calls < 1 or self.max_output_chars < 8 or self.timeout_s <= 0 or self.call_cost < 0:
            raise ValueError("need max_calls >= 1, max_output_chars >= 8, timeout_s > 0, call_cost >= 0")


@dataclass(frozen=True)
class CalculatorArithmetic:
    """Arithmetic problems played as episodes with the inline code tool (module docstring)."""

    config: CalculatorConfig = field(default_factory=CalculatorConfig)
    name: ClassVar[str] = "calculator_arithmetic"
    config_type: ClassVar[type] = CalculatorConfig

    @property
    def max_turns(self) -> int:
        return self.config.max_calls + 1

    def _arithmetic(self) -> Arithmetic:
        c = self.config
        return Arithmetic(
            ArithmeticConfig(
                c.ops, c.min_digits, c.max_digits, c.ood_digits, c.mul_max_digits, c.test_fraction
            )
        )

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """The arithmetic task's problems (same splits), under this task's name."""
        return [
            Problem(self.name, p.split, p.id, p.prompt, p.data)
            for p in self._arithmetic().sample(split, n, seed)
        ]

    def score(self, problem: Problem, completion: str) -> Score:
        """The arithmetic verifier on the final `Answer:` line (code and interpreter output before
        it are ignored; `Answer:` must end the completion)."""
        return self._arithmetic().score(problem, completion)

    def uses_tool(self, problem: Problem) -> bool:
        """Whether the demonstration of `problem` calls the tool."""
        if problem.data["op"] not in self.config.mental_ops:
            return True
        return split_of(f"mental/{problem.id}", self.config.mental_share) != "test"

    def demonstration(self, problem: Problem) -> str:
        """`<code>print(a op b)</code><interpreter>result</interpreter>\\nAnswer: result`, or the
        mental arithmetic demonstration for `mental_ops`. The interpreter span is the environment's
        (see `environment_spans`); SFT does not train on it."""
        d = problem.data
        if not self.uses_tool(problem):
            return self._arithmetic().demonstration(problem)
        call = f"{CODE_OPEN}print({d['a']}{d['op']}{d['b']}){CODE_CLOSE}"
        return f"{call}{OUT_OPEN}{d['answer']}{OUT_CLOSE}\nAnswer: {d['answer']}"

    def environment_spans(self, problem: Problem) -> list[str]:
        """The parts of the demonstration the environment inserts (not trained on in SFT)."""
        return [f"{OUT_OPEN}{problem.data['answer']}{OUT_CLOSE}"] if self.uses_tool(problem) else []

    def corpus_text(self, problem: Problem) -> str:
        return self._arithmetic().corpus_text(problem)

    def make_env(self, problem: Problem) -> CalculatorEnv:
        return CalculatorEnv(self, problem)


class CalculatorEnv:
    """One episode of `CalculatorArithmetic` (module docstring). The sandbox (and its workspace)
    is made at the first tool call and removed when the episode ends (`close`)."""

    stop: Sequence[str] = (CODE_CLOSE,)

    def __init__(self, task: CalculatorArithmetic, problem: Problem):
        self.task, self.problem, self.config = task, problem, task.config
        self.text = ""  # the assistant turn so far (policy and interpreter text)
        self.calls = 0
        self._sandbox: Any = None

    def reset(self) -> list[dict[str, Any]]:
        return self.problem.messages()

    def step(self, action: str) -> StepResult:
        self.text += action
        code = _CODE.search(action)
        if code is None or self.calls >= self.config.max_calls:  # the answer (or one call too many)
            self.close()
            return StepResult(
                done=True, score=self.task.score(self.problem, self.text), signals={"tool_calls": 0}
            )
        self.calls += 1
        result = self._run(code.group(1))
        shown = result.stdout.strip() or (result.stderr.strip().splitlines() or [""])[-1]
        error = not result.ok or result.truncated
        if result.timed_out:
            shown = "timeout"
        if len(shown) > self.config.max_output_chars:
            shown, error = shown[: self.config.max_output_chars] + "...", True
        inline = f"{OUT_OPEN}{shown}{OUT_CLOSE}"
        self.text += inline
        signals = {
            "tool_calls": 1,
            "tool_errors": int(error),
            "sandbox_seconds": result.wall_s,
            "tier": result.tier,
        }
        return StepResult(inline=inline, reward=-self.config.call_cost, signals=signals)

    def _run(self, code: str):
        from temper.sandbox import Limits, Sandbox  # the sandbox probes the host: only when used

        if self._sandbox is None:
            limits = Limits(wall_s=self.config.timeout_s, output_bytes=4096)
            self._sandbox = Sandbox(limits=limits, unsafe=self.config.unsafe)
        return self._sandbox.run(code)

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()  # its default workspace goes with its private scratch
            self._sandbox = None
