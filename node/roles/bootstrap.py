"""Bootstrap: the well-known entry point. A DHT server and gossip relay on every run topic; it announces
no role and needs none. Any node can act as one; devnets start one first and give its address to all.
"""

from __future__ import annotations

from typing import ClassVar

from swarmnode.node.roles.base import RoleService


class Bootstrap(RoleService):
    ROLE: ClassVar[str] = "bootstrap"
    SUBSCRIBES: ClassVar[tuple[str, ...]] = ("checkpoints", "shards", "verdicts", "ledger")
    NEEDS: ClassVar[tuple[str, ...]] = ()
    ANNOUNCE: ClassVar[bool] = False
    FETCH_RUN_RECORD: ClassVar[bool] = False
