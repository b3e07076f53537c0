"""The composition root: build a role's work from the node's config, what `swarmnode run --role ROLE` runs.

The only module that imports every role package, so that the roles and what they share (node/roles/)
never import each other. `ROLE_CLASSES` names each role's network service; `make_role` gives it its real
work (imported when needed, so a relay never loads torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.config import NodeConfig, run_validator_addresses
from swarmnode.node.relay.service import Relay
from swarmnode.node.roles.base import RoleService
from swarmnode.node.roles.bootstrap import Bootstrap
from swarmnode.node.roles.common import open_work_ledger
from swarmnode.node.trainer.service import Trainer
from swarmnode.node.validator.service import Validator
from swarmnode.node.worker.service import Worker

if TYPE_CHECKING:
    from swarmnode.node.trainer.commands import RankCommand
    from swarmnode.node.worker.conduct import Conduct

ROLE_CLASSES: dict[str, type[RoleService]] = {
    "trainer": Trainer,
    "relay": Relay,
    "worker": Worker,
    "validator": Validator,
    "bootstrap": Bootstrap,
}


def make_role(config: NodeConfig, identity: NodeIdentity) -> RoleService:
    """The role service with its real work (bootstrap nodes only route and have none)."""
    role = config.role
    cls = ROLE_CLASSES[role]
    if role == "trainer" and config.work.diloco_plan:
        from swarmnode.node.diloco.rl import make_diloco_trainer

        return make_diloco_trainer(config, identity, open_work_ledger(config.ledger_url))
    if role == "trainer":
        from swarmnode.node.trainer import SwarmTrainerWork, trainer_bounds

        work = SwarmTrainerWork(
            config,
            identity,
            ledger=open_work_ledger(config.ledger_url),
            bounds=trainer_bounds(config),
            run_validators=run_validator_addresses(config.work),
            challenge_window_epochs=config.work.challenge_window_epochs,
        )
        return cls(work)  # type: ignore[call-arg]
    if role == "relay":
        from swarmnode.node.relay.work import SwarmRelayWork

        return cls(SwarmRelayWork(config))
    if role == "worker":
        from swarmnode.node.worker.eligibility import require_eligible
        from swarmnode.node.worker.work import SwarmWorkerWork

        ledger = open_work_ledger(config.ledger_url)
        if ledger is not None:
            require_eligible(ledger, identity.address, config)  # refuse before joining, with the fix
        return cls(SwarmWorkerWork(config, identity, ledger, conduct=worker_conduct(config.work.cheat)))
    if role == "validator":
        from swarmnode.node.validator import SwarmValidatorWork

        validator = SwarmValidatorWork(
            config,
            identity,
            open_work_ledger(config.ledger_url),
            retention_versions=config.work.retention_versions,
            max_accepted_bytes=config.work.accepted_max_mb * 2**20,
            credit_interval_s=config.work.credit_interval_s,
            slash_check_s=config.work.slash_check_s,
        )
        return cls(validator)  # type: ignore[call-arg]
    return cls()


def trainer_rank_families() -> Mapping[str, RankCommand]:
    """The command families ranks 1..N-1 of a trainer group serve beside the trainer's own: DiLoCo's, as
    any trainer group may be a DiLoCo participant (imported here: it loads torch)."""
    from swarmnode.node.diloco.sharded import RANK_COMMANDS

    return RANK_COMMANDS


def worker_conduct(cheat: str) -> Conduct:
    """Honest, unless `[work] cheat` names one of the devnet's dishonest workers (swarmnode.testing.cheats,
    imported only then: no honest worker loads it)."""
    from swarmnode.node.worker.conduct import HONEST

    if not cheat:
        return HONEST
    from swarmnode.testing.cheats import conduct_for

    return conduct_for(cheat)
