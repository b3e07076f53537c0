"""The built-in environments by name: what a run will name (with the version) to commit to one."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from swarmnode.node.rl.environments import Environment
from swarmnode.node.rl.environments.calculator import Calculator
from swarmnode.node.rl.environments.game import GuessTheNumber
from swarmnode.node.rl.environments.single_turn import SINGLE_TURN

ENVIRONMENTS: Mapping[str, Environment] = MappingProxyType(
    {**SINGLE_TURN, Calculator().name: Calculator(), GuessTheNumber().name: GuessTheNumber()}
)


def environment(name: str) -> Environment:
    """The built-in environment called `name`; KeyError naming the known ones otherwise."""
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise KeyError(f"no environment {name!r}; built in: {', '.join(sorted(ENVIRONMENTS))}") from None
