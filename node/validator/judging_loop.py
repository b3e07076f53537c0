"""The judging loop: which queued submission to judge next, and the judgement of one carried through to
the store, the ledger and the gossip (spec/validation.md, steps 2-3). The decision itself (the draw, the
checks, the verdict) is `judgement`'s.

Decisions:
- Crash safety: the decision is durable (`AcceptedStore.decide`) before the ledger is written (a slash),
  and the judgement leaves the queue (`finish`) after it. A submission with a stored decision is never
  judged again: after a restart its slash is replayed from the decision (a duplicate refusal means it was
  filed before the crash) and it finishes with the verdict sealed the first time, whatever checkpoints
  the restarted validator holds. A credit is queued by `finish` itself, so an acceptance is credited
  after any crash; one committed just before a crash, not yet marked, is found credited and dropped.
- The gossip of verdicts runs in its own task behind a bounded channel, so a slow mesh never holds up the
  judge (a full channel drops the gossip copy and counts it; the ledger and the accepted log keep it).
  That task gossips `VerdictBatch`es: full ones at once, the rest `verdict_flush_s` after their first
  verdict (spec/gossip.md, Verdict batches).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.rl.validation import Accepted, ValidationContext, judge_fault
from swarmnode.node.validator.fairness import RoundRobin
from swarmnode.node.validator.judgement import (
    Decision,
    Judgement,
    fault_verdict,
    gets_full_check,
    judge_submission,
    make_verdict,
)
from swarmnode.node.validator.ledger_access import LedgerAccess, LedgerUnavailable, credit_for
from swarmnode.node.validator.limits import (
    LEDGER_RETRY_MAX_S,
    LEDGER_RETRY_S,
    VERDICT_BACKLOG,
    VERDICT_FLUSH_S,
    WAIT_FOR_CHECKPOINT_S,
)
from swarmnode.node.validator.settlement import Settlement
from swarmnode.node.validator.state import CreditBacklog, OutcomeCounts, PendingQueue, RunContext
from swarmnode.node.validator.store import AcceptedStore
from swarmnode.node.validator.store_rows import PendingItem, RunCredit
from swarmnode.node.validator.store_schema import ACCEPTED as ACCEPTED_STATUS
from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import Envelope
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import VERDICT_BATCH_MAX_ITEMS, RolloutSubmission, Verdict, VerdictBatch
from swarmnode.protocol.verdicts import VerdictBatcher

log = logging.getLogger(__name__)


class VerdictOut(Protocol):
    """Where verdicts go: sealed with the node key, gossiped on a topic (`RoleNet` is one). Its
    `identity` seals, so it is the validator a `VerdictBatch` names."""

    @property
    def identity(self) -> NodeIdentity: ...

    def seal(self, message: Any) -> bytes: ...

    async def publish(self, kind: str, message: Any) -> bytes: ...


class JudgingLoop:
    """Takes queued submissions one at a time, fairly, as their checkpoints arrive, and carries each
    judgement through: decision stored, ledger written (through `Settlement`), finished, gossiped, counted."""

    def __init__(
        self,
        context: RunContext,
        store: AcceptedStore,
        queue: PendingQueue,
        counts: OutcomeCounts,
        credits: CreditBacklog,
        settlement: Settlement,
        ledger_access: LedgerAccess,
        *,
        wait_for_checkpoint_s: float = WAIT_FOR_CHECKPOINT_S,
        ledger_retry_s: float = LEDGER_RETRY_S,
        ledger_retry_max_s: float = LEDGER_RETRY_MAX_S,
        verdict_flush_s: float = VERDICT_FLUSH_S,
        verdict_batch_items: int = VERDICT_BATCH_MAX_ITEMS,
    ) -> None:
        self.context = context
        self.run_id = context.run_id
        self.store = store
        self.queue = queue
        self.counts = counts
        self.credits = credits
        self.settlement = settlement
        self.ledger_access = ledger_access
        self.wait_for_checkpoint_s = wait_for_checkpoint_s
        self.ledger_retry_s = ledger_retry_s
        self.ledger_retry_max_s = ledger_retry_max_s
        self.verdict_flush_s = verdict_flush_s
        self.verdict_batch_items = verdict_batch_items
        self._secret = store.secret()  # the key of the draw for the full checks (`gets_full_check`)
        self._deadlines: dict[int, float] = {}
        self._turns = RoundRobin()  # fair judging: whose turn it is (node.validator.fairness)
        # decided and stored, the ledger write and `finish` still to do (by item id); read back on a restart
        self._decided: dict[int, Decision] = {i: Decision.restore(d) for i, d in store.decided().items()}
        self._attempts: dict[int, int] = {}  # ledger failures of an item so far
        self.retry_at: dict[int, float] = {}  # an item deferred by a ledger failure: not before then
        self._progress = trio.Event()  # a submission judged
        self.ledger_retries = 0  # judgements put back in the queue by a ledger failure
        self.quarantined = 0  # items the judge failed on, taken out of the queue as JUDGE_FAULT
        self.verdicts_gossiped = self.verdicts_dropped = 0
        self.verdict_batches = 0  # VerdictBatches gossiped (each carries 1..verdict_batch_items verdicts)

    async def judge_each(self, out: VerdictOut, gossip: trio.MemorySendChannel[Verdict]) -> None:
        """Forever: the next ready submission, judged. Total: an exception on one item's path (but a ledger
        that cannot answer, which defers it) quarantines that item, and the loop goes on with the next."""
        while True:
            item = await self._next_ready()
            try:
                await self._judge(item, out, gossip)
            except Exception as exc:  # one item's fault: quarantine it, never stop the judge
                log.exception("judging an item failed", extra={"digest": item.digest.hex()[:16]})
                await self._quarantine(item, exc)

    def verdict_channel(self) -> tuple[trio.MemorySendChannel[Verdict], trio.MemoryReceiveChannel[Verdict]]:
        """Between the judge and the gossip of verdicts: bounded, so a slow mesh never holds up the judge."""
        return trio.open_memory_channel[Verdict](VERDICT_BACKLOG)

    async def wait_judged(self, count: int) -> None:
        """Wait until `count` submissions have been judged (since the store was created)."""
        while self.counts.judged < count:
            await self._progress.wait()

    def _ready(self, item: PendingItem) -> bool:
        """Judge now: the version is held, or it is so old that no wait can make it fresh."""
        engines, setup = self.context.engines, self.context.setup
        assert engines is not None and setup is not None
        if engines.holds(item.checkpoint_version):
            return True
        newest = engines.newest
        return newest is not None and newest - item.checkpoint_version > setup.descriptor.async_level

    async def _next_ready(self) -> PendingItem:
        """The next submission to judge among those that can be judged now (or whose wait for their
        checkpoint ran out): round-robin across workers (`fairness.RoundRobin`), oldest first per worker."""
        while True:
            now = trio.current_time()
            soonest = float("inf")
            ready = []
            for item in self.queue:
                deadline = self._deadlines.setdefault(item.id, now + self.wait_for_checkpoint_s)
                retry = self.retry_at.get(item.id, now)
                if retry > now:  # deferred by a ledger failure
                    soonest = min(soonest, retry)
                    continue
                if item.id in self._decided or deadline <= now or self._ready(item):
                    ready.append(item)
                else:
                    soonest = min(soonest, deadline)
            if ready:
                item = self._turns.pick(ready)
                self._turns.served(item.worker)
                return item
            await self.queue.wait_changed(soonest)

    async def _judge(
        self, item: PendingItem, out: VerdictOut, gossip: trio.MemorySendChannel[Verdict]
    ) -> None:
        """Judge `item` (once: the decision is stored before the ledger write), write the ledger, finish.
        When the ledger cannot answer, the item stays queued (with its decision) and is tried again after a
        backoff; a decision read back after a restart only replays the ledger write and finishes."""
        assert self.context.setup is not None
        evidence = await trio.to_thread.run_sync(self.store.pending_envelope, item.id)
        try:
            decision = self._decided.get(item.id)
            if decision is None:
                decision = await self._decide(item, evidence, out)
                record = decision.record()
                decided_ms = wall_ms()
                await trio.to_thread.run_sync(lambda: self.store.decide(item, record, decided_ms=decided_ms))
                self._decided[item.id] = decision
            slashed = await self._write_ledger(decision, evidence)
        except LedgerUnavailable as exc:
            self._defer(item, exc)
            return
        outcome, verdict = decision.outcome, decision.verdict
        status = ACCEPTED_STATUS if isinstance(outcome, Accepted) else int(outcome.reason)
        credit = None
        if isinstance(outcome, Accepted) and self.ledger_access.ledger is not None:
            engines = self.context.engines
            assert engines is not None
            credit = RunCredit(self.run_id, credit_for(verdict, engines.parameters))
        await self.store.finish_async(
            item,
            status=status,
            tokens=verdict.tokens,
            verdict=decision.sealed,
            submission=evidence if isinstance(outcome, Accepted) else None,
            judged_ms=wall_ms(),
            ignored=isinstance(outcome, Ignore),
            credit=credit,
        )
        if credit is not None:
            self.credits.added()
        if not isinstance(outcome, Ignore):
            try:
                gossip.send_nowait(verdict)
            except trio.WouldBlock:
                self.verdicts_dropped += 1
        self._forget(item)
        self.counts.count(item.worker, outcome, decision.judgement, slashed)
        log.info(
            "judged submission",
            extra={
                "digest": item.digest.hex()[:16],
                "worker": "0x" + item.worker.hex(),
                "version": item.checkpoint_version,
                "verdict": "accept" if isinstance(outcome, Accepted) else str(outcome),
                "full": decision.judgement.full,
                "cpu_s": round(decision.judgement.cpu_s, 4),
            },
        )

    def _forget(self, item: PendingItem) -> None:
        self.queue.remove(item)
        for state in (self._deadlines, self._decided, self._attempts, self.retry_at):
            state.pop(item.id, None)
        self._progress.set()
        self._progress = trio.Event()

    async def _quarantine(self, item: PendingItem, exc: Exception) -> None:
        """Take an item the judge failed on out of the queue as a JUDGE_FAULT ignore (its decision, if
        stored, goes with it). When even that cannot be written (the store's disk fails), the item is
        deferred like a ledger failure: the loop goes on either way."""
        outcome = judge_fault(exc)
        try:
            await trio.to_thread.run_sync(
                lambda: self.store.quarantine(item, status=int(outcome.reason), judged_ms=wall_ms())
            )
        except Exception as store_exc:  # the store itself failed: try again later, judge the others
            log.exception("quarantine failed", extra={"digest": item.digest.hex()[:16]})
            self._defer(item, LedgerUnavailable(f"store: {store_exc!r}"))
            return
        self.quarantined += 1
        self._forget(item)
        self.counts.count(item.worker, outcome, Judgement(outcome, 0.0, False), False)
        log.warning(
            "quarantined submission",
            extra={"digest": item.digest.hex()[:16], "worker": "0x" + item.worker.hex(), "error": str(exc)},
        )

    async def _decide(self, item: PendingItem, evidence: bytes, out: VerdictOut) -> Decision:
        """Read the worker's stake, judge, seal the verdict (an ignore is not sealed). A stored envelope
        that does not decode is a JUDGE_FAULT; a second submission for an assignment held by another one
        (two SUBMITs racing) is rejected ASSIGNMENT_REUSED without judging."""
        setup, engines = self.context.setup, self.context.engines
        assert setup is not None and engines is not None
        descriptor = setup.descriptor
        try:
            sub = decode(RolloutSubmission, decode(Envelope, evidence).body)
        except Exception as exc:  # our own store's bytes: a verdict about this item, not a dead judge
            fault = judge_fault(exc)
            judgement = Judgement(fault, 0.0, False)
            return Decision(fault, judgement, fault_verdict(self.run_id, item, fault), b"")
        holder = await trio.to_thread.run_sync(self.store.reused, item)
        if holder is not None:
            reused = Reject(Reason.ASSIGNMENT_REUSED, f"assignment held by submission {holder.hex()[:16]}")
            verdict = make_verdict(sub, item.digest, item.worker, reused, False)
            return Decision(reused, Judgement(reused, 0.0, False), verdict, out.seal(verdict))
        eligible = await self._eligible(item.worker)  # LedgerUnavailable: not judged yet
        fraction = descriptor.policy.sample_fraction
        full = gets_full_check(sub, setup.dataset, self._secret, item.digest, fraction)
        async with self.context.engines_lock():  # the versions held cannot change until the judgement is done
            ctx = ValidationContext(
                descriptor=descriptor,
                dataset=setup.dataset,
                dataset_ids=setup.dataset_ids,
                newest_version=engines.newest if engines.newest is not None else -1,
                checkpoint_roots=engines.roots(),
                is_eligible=lambda _: eligible,
                model=engines.model_info,
                tokenizer=engines.tokenizer,
            )
            judgement = await trio.to_thread.run_sync(judge_submission, sub, item.worker, ctx, engines, full)
        outcome = judgement.outcome
        verdict = make_verdict(sub, item.digest, item.worker, outcome, judgement.full)
        sealed = b"" if isinstance(outcome, Ignore) else out.seal(verdict)
        return Decision(outcome, judgement, verdict, sealed)

    async def _write_ledger(self, decision: Decision, evidence: bytes) -> bool:
        """Slash as a rejection warrants; True when a slash was filed. (An acceptance's credit is queued
        by `finish` and committed in a batch.)"""
        setup = self.context.setup
        assert setup is not None
        if isinstance(decision.outcome, Reject):
            return await self.settlement.slash(decision.verdict, evidence, setup.descriptor.policy.slash_gwei)
        return False

    def _defer(self, item: PendingItem, exc: Exception) -> None:
        """Leave `item` queued (the ledger, or the store, could not answer); try it again after 1, 2, 4, ...
        `ledger_retry_s`, at most the max."""
        attempts = self._attempts.get(item.id, 0) + 1
        self._attempts[item.id] = attempts
        delay = min(self.ledger_retry_max_s, self.ledger_retry_s * 2 ** min(attempts - 1, 32))
        self.retry_at[item.id] = trio.current_time() + delay
        self.ledger_retries += 1
        log.warning(
            "ledger or store unavailable, submission stays queued",
            extra={
                "digest": item.digest.hex()[:16],
                "attempt": attempts,
                "retry_s": delay,
                "error": str(exc),
            },
        )

    async def _eligible(self, worker: bytes) -> bool:
        """The worker's stake (without a ledger, everyone). A refusal reads as not eligible; a ledger that
        cannot answer raises `LedgerUnavailable`: the submission waits, it is never judged unread."""
        ledger_access = self.ledger_access
        if ledger_access.ledger is None:
            return True
        eligible = await ledger_access.call("is_eligible", lambda: ledger_access.eligible(worker))
        return bool(eligible)

    async def gossip_verdicts(self, out: VerdictOut, receive: trio.MemoryReceiveChannel[Verdict]) -> None:
        """Gossip verdicts in batches: a batch goes when it is full, or `verdict_flush_s` after its first
        verdict arrived, so a verdict waits at most one interval and a busy validator signs once per batch.
        Publishing is outside the timer's cancel scope: a batch is never lost to its own deadline."""
        batcher = VerdictBatcher(self.run_id, out.identity.address, max_items=self.verdict_batch_items)
        deadline = float("inf")
        closed = False
        while not closed:
            verdict: Verdict | None = None
            with trio.move_on_at(deadline):
                try:
                    verdict = await receive.receive()
                except trio.EndOfChannel:
                    closed = True
            if verdict is not None:
                started = not batcher
                done = batcher.add(verdict)
                for batch in done:
                    await self._publish_batch(out, batch)
                if not batcher:
                    deadline = float("inf")
                elif started or done:  # a new pending batch: its interval starts now
                    deadline = trio.current_time() + self.verdict_flush_s
                continue
            deadline = float("inf")  # the interval ran out (or the channel closed): flush what is pending
            last = batcher.take()
            if last is not None:
                await self._publish_batch(out, last)

    async def _publish_batch(self, out: VerdictOut, batch: VerdictBatch) -> None:
        await out.publish("verdicts", batch)
        self.verdicts_gossiped += len(batch.verdicts)
        self.verdict_batches += 1
