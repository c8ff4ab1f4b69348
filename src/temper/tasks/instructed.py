"""`instructed_arithmetic`: arithmetic under a house rule stated in a system prompt, the test bed of
prompt distillation (a long instruction internalized so that it is no longer needed in the prompt).

The rule: work out the result, then answer with its ones digit only (no sign):
    prompt (system: true)   [system: INSTRUCTION] 37+45=?
    prompt (system: false)  37+45=?                       (the same problems, the rule unsaid)
    demonstration           37+45=82\\nAnswer: 2
A model fine-tuned on plain arithmetic answers 82; it obeys the rule only when the result has one
digit (about 1 problem in 6 at 2 digits), so the share graded correct here measures obedience.
The grade is arithmetic's (`Answer: <integer>` at the end) against the ones digit. Problems and
splits are `arithmetic`'s with the same options (same seed, same problems, with or without the
system turn), so `system: true` and `system: false` entries of a recipe are the same questions
asked with and without the instruction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from temper.tasks.arithmetic import Arithmetic, ArithmeticConfig
from temper.tasks.base import Problem, Score

INSTRUCTION = (
    "House rule for every question: work out the full result first, then give only its last "
    "digit on the answer line, without a sign. Example: 37+45=82 gives Answer: 2; 12-19=-7 gives Answer: 7."
)


@dataclass(frozen=True)
class InstructedArithmeticConfig:
    ops: tuple[str, ...] = ("+", "-", "*")
    min_digits: int = 1
    max_digits: int = 2
    ood_digits: int = 3
    mul_max_digits: int = 1
    system: bool = True
    """Put the instruction in a system turn before the question (false: the question alone)."""
    instruction: str = INSTRUCTION
    """The system prompt's text; the rule graded is always the ones digit."""

    def arithmetic(self) -> ArithmeticConfig:
        return ArithmeticConfig(
            ops=self.ops,
            min_digits=self.min_digits,
            max_digits=self.max_digits,
            ood_digits=self.ood_digits,
            mul_max_digits=self.mul_max_digits,
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        self.arithmetic()  # arithmetic's own checks, with its messages
        if self.system and not self.instruction.strip():
            raise ValueError("system: true needs a non-empty instruction")


@dataclass(frozen=True)
class InstructedArithmetic:
    """Arithmetic answered by the ones digit of the result; see the module docstring."""

    config: InstructedArithmeticConfig = field(default_factory=InstructedArithmeticConfig)
    name: ClassVar[str] = "instructed_arithmetic"
    config_type: ClassVar[type] = InstructedArithmeticConfig

    def _plain(self) -> Arithmetic:
        return Arithmetic(self.config.arithmetic())

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        out = []
        for p in self._plain().sample(split, n, seed):
            data = dict(p.data) | {"result": p.data["answer"], "answer": abs(p.data["answer"]) % 10}
            chat = None
            if self.config.system:
                chat = [
                    {"role": "system", "content": self.config.instruction},
                    {"role": "user", "content": p.prompt},
                ]
            out.append(replace(p, task=self.name, data=data, chat=chat))
        return out

    def score(self, problem: Problem, completion: str) -> Score:
        """Arithmetic's grade against the ones digit (`data["answer"]`); the full result is wrong."""
        return self._plain().score(problem, completion)

    def demonstration(self, problem: Problem) -> str:
        """The worked equation in the pre-training notation, then the ones digit."""
        return f"{self.corpus_text(problem)}\nAnswer: {problem.data['answer']}"

    def corpus_text(self, problem: Problem) -> str:
        d = problem.data
        return f"{d['a']}{d['op']}{d['b']}={d['result']}"
