"""The accepted log: served to the run's trainers with ACCEPTED, and pruned by the store's retention.

Decisions:
- Only the run's trainers (the lead and its co-trainers) are served: anyone else could hold the
  protocol's few inbound streams with long polls.
- Bounded state: the store is pruned every `PRUNE_EVERY_S` past the async window plus
  `ACCEPTED_RETENTION_VERSIONS` below the newest version held, and the accepted log to
  `MAX_ACCEPTED_BYTES` among the items every trainer has pulled (`AcceptedStore.prune`).
"""

from __future__ import annotations

import logging

import trio
from libp2p.peer.id import ID

from swarmnode.crypto.identity import address_of_peer_id
from swarmnode.node.validator.limits import (
    ACCEPTED_RETENTION_VERSIONS,
    MAX_ACCEPTED_BYTES,
    MAX_BATCH_BYTES,
    PRUNE_EVERY_S,
)
from swarmnode.node.validator.state import RunContext
from swarmnode.node.validator.store import MAX_CURSOR, AcceptedStore
from swarmnode.node.validator.store_rows import StoreStatistics
from swarmnode.protocol.envelope import Opened
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import AcceptedBatch, AcceptedRequest

log = logging.getLogger(__name__)


class AcceptedLog:
    """ACCEPTED's side of the validator's work, and the store's retention."""

    def __init__(
        self,
        context: RunContext,
        store: AcceptedStore,
        *,
        retention_versions: int = ACCEPTED_RETENTION_VERSIONS,
        max_accepted_bytes: int = MAX_ACCEPTED_BYTES,
        prune_every_s: float = PRUNE_EVERY_S,
    ) -> None:
        self.context = context
        self.run_id = context.run_id
        self.store = store
        self.retention_versions = retention_versions
        self.max_accepted_bytes = max_accepted_bytes
        self.prune_every_s = prune_every_s
        # the newest cursor each trainer sent (ACCEPTED): what it has pulled, for the accepted log's byte cap
        self._pulled: dict[bytes, int] = {}
        self.refused = 0  # ACCEPTED requests refused (not a trainer, a cursor out of range)
        self.pruned_judged = self.pruned_accepted = 0
        self.store_stats: StoreStatistics = store.statistics()  # as of the last prune

    def retention_floor(self) -> int | None:
        """The oldest version whose assignments are kept: the async window plus the audit horizon below
        the newest version held (None while none is held). Older ones are stale for every judge."""
        setup, engines = self.context.setup, self.context.engines
        assert setup is not None
        newest = engines.newest if engines is not None else None
        if newest is None:
            return None
        return max(0, newest - setup.descriptor.async_level - self.retention_versions)

    def pulled_by_every_trainer(self) -> int:
        """The accepted index every trainer that pulled since this start has pulled (0: none pulled)."""
        return min(self._pulled.values(), default=0)

    async def prune(self) -> None:
        """Apply the retention to the store (`AcceptedStore.prune`) and refresh its statistics."""
        floor = self.retention_floor()
        if floor is not None:
            pruned = await trio.to_thread.run_sync(
                lambda: self.store.prune(
                    floor=floor,
                    max_accepted_bytes=self.max_accepted_bytes,
                    pulled=self.pulled_by_every_trainer(),
                )
            )
            self.pruned_judged += pruned.judged
            self.pruned_accepted += pruned.accepted
            if pruned.judged or pruned.accepted:
                log.info(
                    "pruned the store",
                    extra={"floor": pruned.floor, "judged": pruned.judged, "accepted": pruned.accepted},
                )
        self.store_stats = await trio.to_thread.run_sync(self.store.statistics)

    async def prune_forever(self) -> None:
        while True:
            await self.prune()
            await trio.sleep(self.prune_every_s)

    def admits_puller(self, peer: ID) -> bool:
        """ACCEPTED before any slot or read: only the run's trainers (a peer id names its key's address)."""
        return address_of_peer_id(peer.to_bytes()) in self.context.trainers

    async def serve_accepted(self, peer: ID, opened: Opened) -> AcceptedBatch:
        """Accepted submissions after the puller's cursor; waits up to `wait_ms` for the first new one.

        Only the run's trainers are served, the lead and its co-trainers (anyone else could hold the
        protocol's few inbound streams with long polls): others, and a request before the run is known, are
        refused with Ignore NOT_FOR_US.
        """
        request = opened.message
        if not isinstance(request, AcceptedRequest) or request.run != self.run_id:
            raise Ignore(Reason.WRONG_RUN, "accepted submissions of another run")
        if opened.sender not in self.context.trainers:
            self.refused += 1
            raise Ignore(Reason.NOT_FOR_US, "accepted submissions are served to the run's trainers only")
        if not 0 <= request.after <= MAX_CURSOR:
            self.refused += 1
            raise Reject(Reason.OUT_OF_RANGE, f"cursor {request.after} is beyond any accepted index")
        # what this trainer has (its cursor), never beyond what exists: frees pulled items for the byte cap
        pulled = min(request.after, self.store.newest)
        self._pulled[opened.sender] = max(self._pulled.get(opened.sender, 0), pulled)
        if self.store.newest <= request.after and request.wait_ms:
            await self.store.wait_after(request.after, request.wait_ms / 1000)
        items, newest = await trio.to_thread.run_sync(
            self.store.after, request.after, request.limit, MAX_BATCH_BYTES
        )
        return AcceptedBatch(items=tuple(items), newest=newest)
