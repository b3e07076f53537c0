"""Worker: follows checkpoints (manifests, shard announcements), generates rollouts, submits them to a
validator found through the DHT, and watches verdicts and the ledger.

Needs: relays (shards) and validators (submissions).
"""

from __future__ import annotations

from typing import ClassVar

from swarmnode.node.roles.base import RoleService


class Worker(RoleService):
    ROLE: ClassVar[str] = "worker"
    SUBSCRIBES: ClassVar[tuple[str, ...]] = ("checkpoints", "shards", "verdicts", "ledger")
    NEEDS: ClassVar[tuple[str, ...]] = ("relay", "validator")
