"""The four roles (and the bootstrap entry point) as small services composed by node.runtime."""

from __future__ import annotations

from swarmnode.node.roles.base import RoleService
from swarmnode.node.roles.bootstrap import Bootstrap
from swarmnode.node.roles.relay import Relay
from swarmnode.node.roles.trainer import Trainer
from swarmnode.node.roles.validator import Validator
from swarmnode.node.roles.worker import Worker

ROLE_CLASSES: dict[str, type[RoleService]] = {
    "trainer": Trainer,
    "relay": Relay,
    "worker": Worker,
    "validator": Validator,
    "bootstrap": Bootstrap,
}

__all__ = ["ROLE_CLASSES", "Bootstrap", "Relay", "RoleService", "Trainer", "Validator", "Worker"]
