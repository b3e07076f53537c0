"""Arithmetic with a calculator tool: the model may call `<calc>EXPR</calc>` before it answers.

Rules (spec/environments.md, calculator):
- A model turn containing `<calc>` is a call: the expression is the text up to the next `</calc>`. The
  environment replies `<result>VALUE</result>` (an integer, or `p/q` in lowest terms) or
  `<error>WHY</error>`. Only the first call of a turn is evaluated (an engine stops a turn at `</calc>`).
- Any other model turn is the answer: the content of its last `\\boxed{...}` when it has one, else the
  whole turn, graded by the arithmetic grader (exact match with the target). The episode ends there, or
  with reward 0 at the turn bound.
- EXPR: decimal integers, `+ - * /`, unary minus, parentheses, spaces. Exact rational arithmetic. Its
  length, literal digits, nesting and every intermediate value's size are bounded before the work is
  done, so any text costs microseconds and the parser raises nothing but `CalcError` (never eval).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from swarmnode.node.rl.environments import Done, EnvBounds, EnvTurn, WrongTaskKind
from swarmnode.node.rl.tasks import Task, arithmetic
from swarmnode.node.rl.tasks.math import extract_boxed

NAME = "calculator"
VERSION = "1"
CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
MAX_EXPRESSION_CHARS = 256
MAX_LITERAL_DIGITS = 40
MAX_DEPTH = 32  # nested parentheses and unary signs
MAX_VALUE_BITS = 256  # of the numerator and the denominator of every intermediate value
DIGITS = frozenset("0123456789")
OPERATORS = frozenset("+-*/()")
INSTRUCTIONS = (
    "You may use a calculator: write <calc>EXPR</calc> (integers, + - * /, parentheses) and stop; the "
    "reply is <result>VALUE</result> or <error>WHY</error>. When you know the answer, write it as \\boxed{N}."
)


class CalcError(ValueError):
    """An expression the calculator refuses: its message is the `<error>` the model sees."""


def tokenize(text: str) -> list[str]:
    """Integer literals and single-character operators; spaces dropped."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == " ":
            i += 1
        elif char in OPERATORS:
            tokens.append(char)
            i += 1
        elif char in DIGITS:
            start = i
            while i < len(text) and text[i] in DIGITS:
                i += 1
            if i - start > MAX_LITERAL_DIGITS:
                raise CalcError(f"a number longer than {MAX_LITERAL_DIGITS} digits")
            tokens.append(text[start:i])
        else:
            raise CalcError(f"unexpected character at position {i}")
    return tokens


def bounded(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_VALUE_BITS:
        raise CalcError(f"a value beyond {MAX_VALUE_BITS} bits")
    return value


class _Parser:
    """Recursive descent over the tokens: expr = term (+|- term)*, term = factor (*|/ factor)*,
    factor = (+|-) factor | integer | ( expr )."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.position, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise CalcError("the expression ends too early")
        self.position += 1
        return token

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            operator, right = self.take(), self.term()
            value = bounded(value + right if operator == "+" else value - right)
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            operator, right = self.take(), self.factor()
            if operator == "/" and right == 0:
                raise CalcError("division by zero")
            value = bounded(value * right if operator == "*" else value / right)
        return value

    def factor(self) -> Fraction:
        token = self.take()
        if token in ("+", "-", "("):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise CalcError(f"nested deeper than {MAX_DEPTH}")
            if token == "(":
                value = self.expression()
                if self.take() != ")":
                    raise CalcError("a parenthesis is not closed")
            else:
                value = self.factor() if token == "+" else -self.factor()
            self.depth -= 1
            return value
        if token[0] in DIGITS:
            return bounded(Fraction(int(token)))
        raise CalcError(f"unexpected {token!r}")


def evaluate(text: str) -> Fraction:
    """The exact value of a calculator expression, or CalcError (and nothing else) for any text."""
    tokens = tokenize(text)
    if not tokens:
        raise CalcError("empty expression")
    parser = _Parser(tokens)
    value = parser.expression()
    if parser.peek() is not None:
        raise CalcError(f"unexpected {parser.peek()!r} after the expression")
    return value


def render(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def tool_reply(call_turn: str) -> str:
    """The environment's reply to a turn containing `<calc>`."""
    start = call_turn.index(CALL_OPEN) + len(CALL_OPEN)
    end = call_turn.find(CALL_CLOSE, start)
    if end < 0:
        return f"<error>no {CALL_CLOSE} after {CALL_OPEN}</error>"
    try:
        return f"<result>{render(evaluate(call_turn[start:end]))}</result>"
    except CalcError as error:
        return f"<error>{error}</error>"


def demonstration(task: Task) -> tuple[str, str]:
    """The model turns of a correct episode on an arithmetic task: call the calculator on the task's
    expression, then box the result (a warm start's supervised example)."""
    expression = task.prompt.strip().removesuffix("=")
    return f"{CALL_OPEN}{expression}{CALL_CLOSE}", f"\\boxed{{{task.target}}}"


def answer_of(turn: str) -> str:
    """The answer a turn gives: its last `\\boxed{}` content, else the whole turn."""
    boxed = extract_boxed(turn)
    return turn if boxed is None else boxed


@dataclass(frozen=True)
class Calculator:
    """Arithmetic tasks with the calculator tool."""

    name: str = NAME
    version: str = VERSION

    @property
    def bounds(self) -> EnvBounds:
        return EnvBounds(max_turns=8, max_env_bytes=256)

    @property
    def kinds(self) -> tuple[str, ...]:
        return (arithmetic.KIND,)

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    def respond(self, task: Task, seed: int, model_turns: Sequence[str]) -> EnvTurn | Done:
        if task.kind != arithmetic.KIND:
            raise WrongTaskKind(self.name, task.kind, [arithmetic.KIND])
        turn = model_turns[-1]
        if CALL_OPEN in turn:
            return EnvTurn(tool_reply(turn))
        return Done(arithmetic.grade(task, answer_of(turn)).reward)
