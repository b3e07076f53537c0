"""Synthetic arithmetic: the devnet's task. Prompt "12+7=", target "19", exact-match reward.

Decisions:
- Generated from an explicit `random.Random(seed)`, never the global RNG, so a dataset is a pure function of
  (params, seed, count) and the recipe can be written into a run descriptor.
- Difficulty knobs: operand range, operator set, number of operands. Standard precedence (`*` before `+`/`-`)
  is computed by hand rather than with eval.
- The reward is exact: the completion (up to EOS, surrounding whitespace stripped) must equal the target.
  No partial credit, so the reward cannot be gamed by hedging.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from swarmnode.node.rl.tasks.core import Grade, Task

KIND = "arithmetic"


@dataclass(frozen=True)
class ArithmeticParams:
    """Difficulty knobs of the generator."""

    min_value: int = 0
    max_value: int = 99
    operators: str = "+"
    num_operands: int = 2


DEVNET_PARAMS = ArithmeticParams()  # two-digit addition: learnable by the tiny model in minutes
# two-digit products: beyond the tiny model by heart, a copy of the task with the calculator tool
DEVNET_PRODUCTS = ArithmeticParams(min_value=10, max_value=99, operators="*")


def evaluate(operands: Sequence[int], operators: Sequence[str]) -> int:
    """Value of `a0 op0 a1 op1 ...` with `*` binding tighter than `+` and `-`."""
    if len(operators) != len(operands) - 1:
        raise ValueError("need one operator between each pair of operands")
    terms, signs = [operands[0]], [1]
    for op, value in zip(operators, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= value
        elif op in "+-":
            terms.append(value)
            signs.append(1 if op == "+" else -1)
        else:
            raise ValueError(f"unknown operator {op!r}")
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def make_task(params: ArithmeticParams, rng: random.Random) -> Task:
    """One random problem drawn from `rng`."""
    operands = [rng.randint(params.min_value, params.max_value) for _ in range(params.num_operands)]
    operators = [rng.choice(params.operators) for _ in range(params.num_operands - 1)]
    text = str(operands[0]) + "".join(op + str(v) for op, v in zip(operators, operands[1:], strict=True))
    return Task(kind=KIND, prompt=text + "=", target=str(evaluate(operands, operators)))


def generate_tasks(params: ArithmeticParams, seed: int, count: int) -> list[Task]:
    """`count` problems from `seed` (may repeat a problem when the space is small)."""
    rng = random.Random(seed)
    return [make_task(params, rng) for _ in range(count)]


def grade(task: Task, completion: str) -> Grade:
    """1.0 when the stripped completion equals the target exactly, else 0.0."""
    answer = completion.strip()
    if not answer:
        return Grade(0.0, "empty answer")
    if answer == task.target:
        return Grade(1.0, "correct")
    return Grade(0.0, f"expected {task.target!r}, got {answer[:32]!r}")
