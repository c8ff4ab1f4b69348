"""Reading what a model wrote: the final `Answer:` line, and arithmetic expressions over integers.

Model output is untrusted text, so the expression grammar is parsed by hand (never `eval`) and
evaluated with exact `Fraction`s (8/(3-8/3) is exactly 24; floats would say 23.999...). Bounds on
length, literal size and intermediate magnitude keep a hostile or degenerate completion from
costing time or memory.

Grammar (no unary signs, so `-3` or `+3` are syntax errors; spaces and tabs are ignored):
    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := integer | "(" expr ")"
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

ANSWER_PREFIX = "Answer:"

# End-of-text strings a sampler may leave on the completion: the built-in tokenizer's `<|end|>`
# and the usual hub ones.
END_MARKERS = ("<|end|>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "</s>")

MAX_LENGTH = 100
MAX_LITERAL_DIGITS = 6
MAX_MAGNITUDE = 10**9

SYNTAX_ERROR = "syntax_error"
DIVISION_BY_ZERO = "division_by_zero"
TOO_LARGE = "too_large"


class ExpressionError(ValueError):
    """The expression cannot be graded; `reason` is SYNTAX_ERROR, DIVISION_BY_ZERO or TOO_LARGE."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Evaluation:
    """The exact value of an expression and its integer literals in order of appearance."""

    value: Fraction
    literals: tuple[int, ...]


def extract_answer(completion: object) -> str | None:
    """The text after the last `Answer:`, stripped of whitespace and end-of-text markers.

    None when there is no `Answer:` or nothing follows it. Everything up to the end of the
    completion belongs to the answer, so trailing chatter makes the answer unparseable: the
    required format is that the completion *ends* with the answer line.
    """
    if not isinstance(completion, str):
        return None
    at = completion.rfind(ANSWER_PREFIX)
    if at < 0:
        return None
    text = _strip_end_markers(completion[at + len(ANSWER_PREFIX) :])
    return text or None


def _strip_end_markers(text: str) -> str:
    while True:
        text = text.strip()
        marker = next((m for m in END_MARKERS if text.endswith(m)), None)
        if marker is None:
            return text
        text = text[: -len(marker)]


def evaluate(text: str) -> Evaluation:
    """Parse and evaluate `text` exactly; raises ExpressionError on anything else."""
    if len(text) > MAX_LENGTH:
        raise ExpressionError(TOO_LARGE, f"expression longer than {MAX_LENGTH} characters")
    parser = _Parser(_tokenize(text))
    value = parser.expr()
    if parser.peek() is not None:
        raise ExpressionError(SYNTAX_ERROR, f"unexpected {parser.peek()!r}")
    return Evaluation(value, tuple(parser.literals))


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in " \t":
            i += 1
        elif ch in "+-*/()":
            tokens.append(ch)
            i += 1
        elif "0" <= ch <= "9":
            j = i
            while j < len(text) and "0" <= text[j] <= "9":
                j += 1
            if j - i > MAX_LITERAL_DIGITS:
                raise ExpressionError(TOO_LARGE, f"literal longer than {MAX_LITERAL_DIGITS} digits")
            tokens.append(text[i:j])
            i = j
        else:
            raise ExpressionError(SYNTAX_ERROR, f"unexpected character {ch!r}")
    if not tokens:
        raise ExpressionError(SYNTAX_ERROR, "empty expression")
    return tokens


class _Parser:
    """Recursive descent over the token list; depth is bounded by MAX_LENGTH."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.literals: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError(SYNTAX_ERROR, "unexpected end of expression")
        self.pos += 1
        return token

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            value = _apply(value, op, self.term())
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            value = _apply(value, op, self.factor())
        return value

    def factor(self) -> Fraction:
        token = self.take()
        if token == "(":
            value = self.expr()
            if self.take() != ")":
                raise ExpressionError(SYNTAX_ERROR, "expected ')'")
            return value
        if token.isdigit():
            self.literals.append(int(token))
            return Fraction(int(token))
        raise ExpressionError(SYNTAX_ERROR, f"expected a number or '(', got {token!r}")


def _apply(left: Fraction, op: str, right: Fraction) -> Fraction:
    if op == "+":
        value = left + right
    elif op == "-":
        value = left - right
    elif op == "*":
        value = left * right
    elif right == 0:
        raise ExpressionError(DIVISION_BY_ZERO, "division by zero")
    else:
        value = left / right
    if abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
        raise ExpressionError(TOO_LARGE, f"intermediate numerator or denominator beyond {MAX_MAGNITUDE}")
    return value
