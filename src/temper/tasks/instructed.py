"""`instructed_arithmetic`: arithmetic under a house rule stated in a system prompt, the test bed of
prompt distillation (a long instruction internalized so that it is no longer needed in the prompt).

The rule: work out the result, then answer with its ones digit only (no sign):
    prompt (system: true)   [system: INSTRUCTION] 37+45=?
    prompt (system: false)  37+45=?                       (the same problems, the rule unsaid)
    demonstration           37+45=82\\nAnswer: 2
A model fine-tuned on plain arithmetic answers 82; it obeys the rule only when the result has one
digit (about 1 problem in 6 at 2 digits), so the share graded correct here measures obedience.
The grade is arithmetic's (`Answer: <integer>` at the end) against the ones digit; `grade: rule`
grades obedience alone (the last digit of whatever result the completion wrote), so a tiny model's
arithmetic errors do not hide whether it follows the instruction. Problems and
splits are `arithmetic`'s with the same options (same seed, same problems, with or without the
system turn), so `system: true` and `system: false` entries of a recipe are the same questions
asked with and without the instruction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

from temper.tasks.arithmetic import Arithmetic, ArithmeticConfig
from temper.tasks.base import Problem, Score

INSTRUCTION = "House rule: write out the full result, then answer with only its last digit, no sign."
_STATED = re.compile(r"=\s*(-?[0-9]+)")


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
    grade: Literal["result", "rule"] = "result"
    """result: correct when the answer is the ones digit of the true result. rule: correct when the
    rule was obeyed, right or wrong arithmetic: the answer is one digit, the last digit of the result
    the completion itself wrote (`...=82`), or of the true result when it wrote none."""

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
        if self.grade not in ("result", "rule"):
            raise ValueError(f"grade must be 'result' or 'rule', got {self.grade!r}")


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
        """Arithmetic's grade against the ones digit (`data["answer"]`); the full result is wrong.
        With grade: rule, whether the answer obeys the rule given the result the completion states."""
        plain = self._plain().score(problem, completion)
        if self.config.grade == "result" or not plain.parsed:
            return plain
        answer = int(plain.details["answer"])
        before = completion[: completion.rfind("Answer:")] if isinstance(completion, str) else ""
        stated = _STATED.findall(before)
        result = int(stated[-1]) if stated else problem.data["result"]
        obeyed = 0 <= answer <= 9 and answer == abs(result) % 10 and plain.details["answer"].strip().isdigit()
        details = {
            "reason": "obeyed" if obeyed else "disobeyed",
            "answer": plain.details["answer"],
            "stated": result,
        }
        return Score(float(obeyed), obeyed, True, details)

    def demonstration(self, problem: Problem) -> str:
        """The worked equation in the pre-training notation, then the ones digit."""
        return f"{self.corpus_text(problem)}\nAnswer: {problem.data['answer']}"

    def corpus_text(self, problem: Problem) -> str:
        d = problem.data
        return f"{d['a']}{d['op']}{d['b']}={d['result']}"
