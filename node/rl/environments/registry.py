"""The environments by name: what a run names (with the version) to commit to one. The built-in ones, and
`verifiers.<module>` for a verifiers environment module this node has (`verifiers_adapter`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from swarmnode.node.rl.environments import MAX_ENV_BYTES, Environment, verifiers_adapter
from swarmnode.node.rl.environments.calculator import Calculator
from swarmnode.node.rl.environments.game import GuessTheNumber
from swarmnode.node.rl.environments.single_turn import SINGLE_TURN

ENVIRONMENTS: Mapping[str, Environment] = MappingProxyType(
    {**SINGLE_TURN, Calculator().name: Calculator(), GuessTheNumber().name: GuessTheNumber()}
)


class UnknownEnvironment(ValueError):
    """A run names an environment (or a version of one) this node does not have: it cannot follow the run."""


def environment(name: str) -> Environment:
    """The built-in environment called `name`; KeyError naming the known ones otherwise."""
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise KeyError(f"no environment {name!r}; built in: {', '.join(sorted(ENVIRONMENTS))}") from None


def find_environment(name: str, max_env_bytes: int = MAX_ENV_BYTES) -> Environment:
    """The environment a run names: a built-in one, or a verifiers module (its replies cut just past
    `max_env_bytes`, the run's bound). UnknownEnvironment, saying why, when this node has none by that
    name."""
    if name.startswith(verifiers_adapter.PREFIX):
        try:
            return verifiers_adapter.load(name.removeprefix(verifiers_adapter.PREFIX),
                                          max_env_bytes=max_env_bytes)
        except verifiers_adapter.VerifiersRefused as exc:
            raise UnknownEnvironment(f"the run plays environment {name!r}: {exc}") from None
    env = ENVIRONMENTS.get(name)
    if env is None:
        raise UnknownEnvironment(f"the run plays environment {name!r}, which this node does not have "
                                 f"(built in: {', '.join(sorted(ENVIRONMENTS))}; or verifiers.<module>)")
    return env
