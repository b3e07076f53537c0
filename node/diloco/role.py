"""DiLoCo trainers as a role of the node: announced and found through the DHT, verified by Hello.

Every trainer of a DiLoCo run provides `swarmnode/<run>/role/trainer` and needs the same role, so each
finds the others through Kademlia; the signed Hello of each gives its address and data-plane endpoint,
which is all the rounds need (everything else moves over HTTP, signed). No gossip topic is used, and
no `RunDescriptor` is fetched: the run is the owner-signed `DilocoRun` each trainer was given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar

import torch
import trio

from swarmnode.node.diloco.rounds import DilocoTrainerWork
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.roles.base import RoleNet, RoleService


def trainer_endpoints(net: RoleNet) -> Mapping[bytes, str]:
    """Address → HTTP endpoint of the trainers of this run found (and Hello-verified) so far."""
    return {record.address: record.http_endpoint for record in net.peers("trainer") if record.http_endpoint}


class DilocoWork:
    """The role seam: train through every round, hand the final θ on, then keep serving late joiners."""

    def __init__(
        self,
        trainer: DilocoTrainerWork,
        on_finished: Callable[[dict[str, torch.Tensor] | None], Awaitable[None]] | None = None,
    ) -> None:
        self.trainer = trainer
        self.on_finished = on_finished

    def status(self) -> dict[str, Any]:
        return self.trainer.status()

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        theta = await self.trainer.train(lambda: trainer_endpoints(net))
        if self.on_finished is not None:
            await self.on_finished(theta)
        await trio.sleep_forever()

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        """DiLoCo subscribes to no topic."""


class DilocoTrainer(RoleService):
    ROLE: ClassVar[str] = "trainer"
    SUBSCRIBES: ClassVar[tuple[str, ...]] = ()
    NEEDS: ClassVar[tuple[str, ...]] = ("trainer",)
    FETCH_RUN_RECORD: ClassVar[bool] = False

    def __init__(self, work: DilocoWork) -> None:
        super().__init__(work)
