"""SUBMIT: cheap checks, then the durable queue (spec/validation.md, step 1).

Nothing is written for a refused submission, and only a staked sender takes queue room: its stake read is
cached for `eligibility_ttl_s`, and `admits_submitter` resets an unstaked sender's streams before they
take a slot. A queued submission goes to the `PendingQueue` the judging loop takes from.
"""

from __future__ import annotations

import trio
from libp2p.peer.id import ID

from swarmnode.crypto.identity import address_of_peer_id
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.rl.validation import check_step
from swarmnode.node.roles.common import TtlCache
from swarmnode.node.validator.judgement import clip_detail
from swarmnode.node.validator.ledger_access import LedgerAccess, LedgerUnavailable
from swarmnode.node.validator.limits import (
    ELIGIBILITY_TTL_S,
    MAX_ELIGIBILITY_CACHE,
    MAX_PENDING,
    MAX_PENDING_BYTES,
    MAX_PENDING_PER_WORKER,
    QUEUED,
)
from swarmnode.node.validator.state import CreditBacklog, PendingQueue, RunContext
from swarmnode.node.validator.store import AcceptedStore
from swarmnode.protocol.codec import encode
from swarmnode.protocol.envelope import Opened
from swarmnode.protocol.errors import Ignore, ProtocolError, Reason, Reject
from swarmnode.protocol.messages import RolloutSubmission, SubmitAck


class Intake:
    """SUBMIT's side of the validator's work: refuses cheaply, queues durably."""

    def __init__(
        self,
        context: RunContext,
        store: AcceptedStore,
        queue: PendingQueue,
        credits: CreditBacklog,
        ledger_access: LedgerAccess,
        *,
        eligibility_ttl_s: float = ELIGIBILITY_TTL_S,
    ) -> None:
        self.context = context
        self.run_id = context.run_id
        self.store = store
        self.queue = queue
        self.credits = credits
        self.ledger_access = ledger_access
        # stake reads, by sender: a flood of SUBMITs costs one ledger read per sender per TTL
        self._stake_reads: TtlCache[bytes, bool] = TtlCache(eligibility_ttl_s, MAX_ELIGIBILITY_CACHE)
        self.refused = 0  # submissions answered at SUBMIT without being queued

    async def submit(self, peer: ID, opened: Opened, digest: bytes) -> SubmitAck:
        """Cheap checks, then the durable queue; status 100 once it is on disk."""
        sub = opened.message
        try:
            if not isinstance(sub, RolloutSubmission):
                raise Reject(
                    Reason.TYPE_MISMATCH, f"expected a rollout submission, got {opened.envelope.type}"
                )
            if sub.run != self.run_id or opened.envelope.run != self.run_id:
                raise Ignore(Reason.WRONG_RUN, f"submission for run {sub.run!r}, not {self.run_id!r}")
            setup = self.context.setup
            if setup is None:
                raise Ignore(Reason.BUSY, "not judging yet: the run is still loading")
            check_step(sub, setup.descriptor)  # the store then holds at most the run's counters
            if self.credits.full:
                raise Ignore(Reason.BUSY, f"{self.credits.queued} credits wait for the ledger; try later")
            self._check_fresh(sub)
            self._check_known(sub)
            await self._check_staked(opened.sender)
            item = await trio.to_thread.run_sync(
                lambda: self.store.enqueue(
                    digest=digest,
                    worker=opened.sender,
                    step=sub.step,
                    checkpoint_version=sub.checkpoint_version,
                    received_ms=wall_ms(),
                    envelope=encode(opened.envelope),
                    max_items=MAX_PENDING,
                    max_bytes=MAX_PENDING_BYTES,
                    max_per_worker=MAX_PENDING_PER_WORKER,
                )
            )
        except ProtocolError as exc:
            self.refused += 1
            return SubmitAck(submission_digest=digest, status=int(exc.reason), detail=clip_detail(exc.detail))
        self.queue.add(item)
        return SubmitAck(submission_digest=digest, status=QUEUED, detail=f"queued at {len(self.queue)}")

    async def _check_staked(self, sender: bytes) -> None:
        """Only a staked sender takes queue room: `Reject` NOT_STAKED, `Ignore` BUSY while the ledger
        cannot answer. A read is cached for `eligibility_ttl_s` (an outage is not)."""
        ledger_access = self.ledger_access
        if ledger_access.ledger is None:
            return
        now = trio.current_time()
        eligible = self._stake_reads.get(sender, now)
        if eligible is None:
            try:
                eligible = bool(
                    await ledger_access.call("is_eligible", lambda: ledger_access.eligible(sender))
                )
            except LedgerUnavailable as exc:
                raise Ignore(Reason.BUSY, f"cannot read the sender's stake now: {exc}") from None
            self._stake_reads.put(sender, eligible, trio.current_time())
        if not eligible:
            raise Reject(Reason.NOT_STAKED, f"sender {sender.hex()} is not registered with enough stake")

    def _check_fresh(self, sub: RolloutSubmission) -> None:
        engines, setup = self.context.engines, self.context.setup
        if engines is None or setup is None:
            return
        newest = engines.newest
        if newest is not None and newest - sub.checkpoint_version > setup.descriptor.async_level:
            raise Ignore(Reason.STALE, f"checkpoint v{sub.checkpoint_version} is too old (newest v{newest})")

    def _check_known(self, sub: RolloutSubmission) -> None:
        """A version above the newest trainer-signed manifest the follower has seen cannot exist yet."""
        follower = self.context.follower
        node = follower.node if follower is not None else None
        latest = node.catalog.latest_version if node is not None else None
        if latest is not None and sub.checkpoint_version > latest:
            raise Ignore(
                Reason.UNKNOWN_CHECKPOINT,
                f"checkpoint v{sub.checkpoint_version} is newer than any manifest seen (v{latest})",
            )

    def admits_submitter(self, peer: ID) -> bool:
        """SUBMIT before any slot or read: refuse a peer whose stake was read as too low within the TTL.

        An unknown peer gets one frame read (its SUBMIT reads the stake and caches the answer); after that
        an unstaked sender's streams are reset before they take a slot, however often it comes back.
        """
        address = address_of_peer_id(peer.to_bytes())
        if address is None:
            return False
        return self._stake_reads.get(address, trio.current_time()) is not False
