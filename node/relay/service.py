"""Relay: fans checkpoint shards out. Hears manifests and Have announcements, announces what it holds
(`ShardHave` on `shards`, DHT provider of each checkpoint version through `RoleNet.provide_checkpoint`).

Needs: the trainer (the shards' origin). The data plane (HTTP, node/dataplane) does the moving.
"""

from __future__ import annotations

from typing import ClassVar

from swarmnode.node.roles.base import RoleService


class Relay(RoleService):
    ROLE: ClassVar[str] = "relay"
    SUBSCRIBES: ClassVar[tuple[str, ...]] = ("checkpoints", "shards", "ledger")
    NEEDS: ClassVar[tuple[str, ...]] = ("trainer",)
