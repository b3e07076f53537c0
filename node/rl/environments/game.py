"""Guess the number: a multi-turn game with deterministic rules.

Rules (spec/environments.md, guess):
- A task of kind `guess` has the target `LOW..HIGH`; the secret is `LOW + sha256(domain || task id ||
  seed u64) mod (HIGH - LOW + 1)`, so each rollout of a group plays its own secret and a validator
  derives the same one.
- Each model turn's guess is its last decimal integer (`-` allowed, at most `MAX_GUESS_DIGITS` digits).
  The environment replies `higher` (the secret is greater), `lower`, or, for a turn without a readable
  integer, `invalid: write one integer from LOW to HIGH`. A correct guess ends the episode with reward
  1; the turn bound ends it with reward 0.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from swarmnode.node.rl.environments import Done, EnvBounds, EnvTurn, WrongTaskKind
from swarmnode.node.rl.tasks import GUESS_KIND, Task

NAME = KIND = GUESS_KIND
VERSION = "1"
SECRET_DOMAIN = b"swarmnode/environments/guess/secret/v1"
MAX_GUESS_DIGITS = 20
MAX_RANGE_BITS = 40  # |LOW| and |HIGH| below 2**40
_INTEGER = re.compile(r"-?[0-9]+")


class BadGuessTask(ValueError):
    """A `guess` task whose target is not `LOW..HIGH` within the bounds: a dataset error."""


def secret_range(task: Task) -> tuple[int, int]:
    """(LOW, HIGH) from the task's target `LOW..HIGH`."""
    low_text, dots, high_text = task.target.partition("..")
    if not dots or not all(_INTEGER.fullmatch(t) for t in (low_text, high_text)):
        raise BadGuessTask(f"a guess task's target is LOW..HIGH, got {task.target[:40]!r}")
    if max(len(low_text), len(high_text)) > MAX_GUESS_DIGITS:
        raise BadGuessTask(f"a guess task's bounds have at most {MAX_GUESS_DIGITS} digits")
    low, high = int(low_text), int(high_text)
    if not (low <= high and max(abs(low), abs(high)) < 2**MAX_RANGE_BITS):
        raise BadGuessTask(f"a guess task needs LOW <= HIGH, both below 2**{MAX_RANGE_BITS} in size, "
                           f"got {task.target!r}")
    return low, high


def secret(task: Task, seed: int) -> int:
    """The number to guess in the rollout with `seed` (u64) of `task`."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed {seed} outside u64")
    low, high = secret_range(task)
    digest = hashlib.sha256(SECRET_DOMAIN + task.task_id + seed.to_bytes(8, "big")).digest()
    return low + int.from_bytes(digest, "big") % (high - low + 1)


def guess_of(turn: str) -> int | None:
    """The turn's last integer, or None when it has none (or one too long to be a guess)."""
    last = None
    for match in _INTEGER.finditer(turn):
        last = match.group()
    if last is None or len(last.lstrip("-")) > MAX_GUESS_DIGITS:
        return None
    return int(last)


def make_task(low: int, high: int) -> Task:
    prompt = f"Guess my integer from {low} to {high}; I answer higher or lower."  # short: small contexts
    return Task(kind=KIND, prompt=prompt, target=f"{low}..{high}")


def generate_tasks(count: int, seed: int, max_low: int = 100, max_size: int = 1024) -> list[Task]:
    """`count` games from `seed`: ranges of 2 ... `max_size` integers starting at 0 ... `max_low`."""
    rng = random.Random(seed)
    tasks = []
    for _ in range(count):
        low = rng.randint(0, max_low)
        tasks.append(make_task(low, low + rng.randint(1, max_size - 1)))
    return tasks


@dataclass(frozen=True)
class GuessTheNumber:
    name: str = NAME
    version: str = VERSION

    @property
    def bounds(self) -> EnvBounds:
        return EnvBounds(max_turns=12, max_env_bytes=128)  # binary search finds 1 of 1024 in 11 guesses

    @property
    def kinds(self) -> tuple[str, ...]:
        return (KIND,)

    @property
    def instructions(self) -> str:
        return ""  # each game's prompt states its rules

    def respond(self, task: Task, seed: int, model_turns: Sequence[str]) -> EnvTurn | Done:
        if task.kind != KIND:
            raise WrongTaskKind(self.name, task.kind, [KIND])
        number = secret(task, seed)
        guess = guess_of(model_turns[-1])
        if guess is None:
            low, high = secret_range(task)
            return EnvTurn(f"invalid: write one integer from {low} to {high}")
        if guess == number:
            return Done(1.0)
        return EnvTurn("higher" if number > guess else "lower")
