"""The validator on the ledger: the run, slashes filed and finalized, credits committed in batches.

Decisions:
- A refused batch is settled credit by credit, never retried as it was: the credits the ledger holds
  already, those of a worker no longer eligible (unregistered, not a worker, ejected, under-staked) and
  those above the run's bounds are dropped (each logged and counted by reason), the rest sent again; a
  refusal none of these explain is split in halves down to the one credit it names, which is dropped with
  the ledger's message. A refusal of the whole batch (the run not registered yet, this validator not in
  its set or not staked) drops nothing: the credits wait for the next round. The run's owner must be the
  descriptor's trainer: a validator refuses any other run (`RunMismatch`).
- The slashes this validator filed and still pending are read back from the ledger at start and tried
  every `slash_check_s`: a window still open waits; a slash no longer pending (voided, or finalized by
  anyone else) is forgotten.
- The ledger is reached through `LedgerAccess` (`ledger_access`); the `Ledger` it wraps is
  `ledger_access.ledger` (None: no ledger, nothing to settle).
"""

from __future__ import annotations

import functools
import logging

import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger import LedgerError
from swarmnode.ledger.errors import ChallengeWindowOpen, DuplicateSlash, SlashNotPending
from swarmnode.ledger.evidence import SLASHABLE_REASONS, slash_digest
from swarmnode.ledger.types import SLASH_PENDING, SLASH_VOIDED, Receipt, RunInfo
from swarmnode.node.roles.common import check_run_owner, check_run_terms, read_run
from swarmnode.node.validator.judgement import reason_name
from swarmnode.node.validator.ledger_access import (
    LedgerAccess,
    LedgerUnavailable,
    commit_blocker,
    credit_refusal,
    fit_credit,
    slash_for,
)
from swarmnode.node.validator.limits import (
    CREDIT_INTERVAL_S,
    LEDGER_RETRY_MAX_S,
    LEDGER_RETRY_S,
    RUN_WAIT_S,
    SLASH_CHECK_S,
)
from swarmnode.node.validator.state import CreditBacklog, RunContext
from swarmnode.node.validator.store import AcceptedStore
from swarmnode.protocol.ledger_messages import CommitCredits, Credit
from swarmnode.protocol.messages import RunDescriptor, Verdict

log = logging.getLogger(__name__)


class Settlement:
    """The ledger side of the validator's work: slashes and credits."""

    def __init__(
        self,
        context: RunContext,
        identity: NodeIdentity,
        ledger_access: LedgerAccess,
        store: AcceptedStore,
        credits: CreditBacklog,
        *,
        max_challenge_window_epochs: int,
        credit_interval_s: float = CREDIT_INTERVAL_S,
        slash_check_s: float = SLASH_CHECK_S,
        ledger_retry_s: float = LEDGER_RETRY_S,
        ledger_retry_max_s: float = LEDGER_RETRY_MAX_S,
    ) -> None:
        self.context = context
        self.run_id = context.run_id
        self.identity = identity
        self.ledger_access = ledger_access
        self.store = store
        self.credits = credits
        self.max_challenge_window_epochs = max_challenge_window_epochs
        self.credit_interval_s = credit_interval_s
        self.slash_check_s = slash_check_s
        self.ledger_retry_s = ledger_retry_s
        self.ledger_retry_max_s = ledger_retry_max_s
        self.pending_slashes: dict[int, int] = {}  # slash index -> its final epoch: filed here, pending
        self.slashes_finalized = self.slashes_voided = self.slashes_settled_elsewhere = 0
        self.contributions = self.batches = 0  # credits committed, and their batches
        self.credits_dropped: dict[str, int] = {}  # reason -> credits dropped (`credit_refusal`, "refused")
        self.credit_blocked = ""  # why the last commit round could not commit (the run, our standing)

    async def slash(self, verdict: Verdict, evidence: bytes, amount_gwei: int) -> bool:
        """File the slash (pending on the ledger) and remember it for `finalize_slashes`. A duplicate
        refusal (filed before a crash) is remembered too, but not counted again."""
        ledger = self.ledger_access.ledger
        if ledger is None or verdict.reason_code not in SLASHABLE_REASONS or amount_gwei < 1:
            return False
        capped = await self.ledger_access.call("params", lambda: self.ledger_access.slash_cap(amount_gwei))
        op = slash_for(verdict, evidence, capped or 0)
        if op is None:
            return False
        result = await self.ledger_access.attempt("slash", lambda: ledger.slash(self.identity, op))
        if isinstance(result, LedgerError) and not isinstance(result, DuplicateSlash):
            return False
        digest = slash_digest(op)
        records = await self.ledger_access.call("slashes", lambda: ledger.slashes(op.worker))
        for record in records or ():
            mine = record.validator == self.identity.address and record.submission_digest == digest
            if mine and record.status == SLASH_PENDING:
                self.pending_slashes[record.index] = record.final_epoch
        if isinstance(result, LedgerError):
            return False
        log.info(
            "filed a slash",
            extra={"worker": "0x" + verdict.worker.hex(), "reason": reason_name(verdict.reason_code)},
        )
        return True

    async def ledger_run(self) -> RunInfo | None:
        """The run as the ledger holds it (None: not registered yet). RunMismatch when its owner is not
        the descriptor's trainer. LedgerUnavailable when the ledger cannot answer."""
        ledger = self.ledger_access.ledger
        setup = self.context.setup
        assert ledger is not None and setup is not None
        info = await self.ledger_access.call("run", lambda: read_run(ledger, self.run_id))
        if info is not None:
            check_run_owner(info, setup.descriptor)
            check_run_terms(info, self.max_challenge_window_epochs)
        return info

    async def wait_run_on_ledger(self, descriptor: RunDescriptor) -> RunInfo | None:
        """Before judging: wait until the run is on the ledger, and refuse it (RunMismatch) unless its
        owner is the trainer that signed `descriptor` and its challenge window is one this node accepts.
        Without a ledger, nothing to wait for."""
        ledger = self.ledger_access.ledger
        if ledger is None:
            return None
        waiting = False
        while True:
            try:
                info = await self.ledger_access.call("run", lambda: read_run(ledger, descriptor.run))
            except LedgerUnavailable:
                info = None
            if info is not None:
                check_run_owner(info, descriptor)
                check_run_terms(info, self.max_challenge_window_epochs)
                if self.identity.address not in info.validators:
                    log.warning(
                        "this validator is not in the run's validator set: its credits wait until the "
                        "run's owner adds it",
                        extra={"run": descriptor.run},
                    )
                return info
            if not waiting:
                log.info("waiting for the run's owner to register it", extra={"run": descriptor.run})
                waiting = True
            await trio.sleep(RUN_WAIT_S)

    async def commit_forever(self) -> None:
        """`commit_credits` every `credit_interval_s`, or at once when a batch is full; after a failure,
        the ledger retry backoff (a full queue must not spin on a ledger that is down)."""
        failures = 0
        while True:
            await self.credits.wait_batch_full(self.credit_interval_s)
            try:
                await self.commit_credits()
                failures = 0
            except LedgerUnavailable as exc:
                failures += 1
                self.credit_blocked = str(exc)
                backoff = self.ledger_retry_s * 2 ** min(failures - 1, 32)
                await trio.sleep(min(self.ledger_retry_max_s, backoff))

    async def commit_credits(self) -> None:
        """Commit the queued credits of the run, a batch at a time, until none is left or the batch as a
        whole cannot be committed now (`credit_blocked` says why). LedgerUnavailable: try again later."""
        ledger = self.ledger_access.ledger
        if ledger is None:
            return
        self.credits.queued = (await trio.to_thread.run_sync(self.store.credit_counts)).queued
        while True:
            credits = await trio.to_thread.run_sync(
                self.store.queued_credits, self.run_id, self.credits.max_per_batch
            )
            if not credits:
                self.credit_blocked = ""
                return
            if not await self._commit(credits):
                return

    async def _blocked(self) -> RunInfo | None:
        """The run, when a batch can be committed to it now; else None (why: `credit_blocked`)."""
        ledger = self.ledger_access.ledger
        assert ledger is not None
        run = await self.ledger_run()
        if run is None:
            self.credit_blocked = f"run {self.run_id!r} is not registered on the ledger yet"
            return None
        blocker = await self.ledger_access.call(
            "run standing", lambda: commit_blocker(ledger, run, self.identity.address)
        )
        if blocker is not None:
            self.credit_blocked = blocker
            return None
        return run

    async def _commit(self, credits: list[Credit]) -> bool:
        """One batch (sorted by (worker, step)). True when every credit was settled: committed, or
        dropped for a reason of its own; False when the batch as a whole cannot be committed now."""
        ledger = self.ledger_access.ledger
        assert ledger is not None
        run = await self._blocked()
        if run is None:
            return False
        op = CommitCredits(self.run_id, tuple(fit_credit(c, run) for c in credits))
        result = await self.ledger_access.attempt(
            "commit_credits", lambda: ledger.commit_credits(self.identity, op)
        )
        if isinstance(result, Receipt):
            await self._settle(credits, committed=True, detail="")
            self.batches += 1
            log.info("committed credits", extra={"credits": len(credits), "run": self.run_id})
            return True
        return await self._settle_refused(run, credits, result)

    async def _settle_refused(self, run: RunInfo, credits: list[Credit], error: LedgerError) -> bool:
        """A refused batch: drop what `credit_refusal` explains (the rest go in the next round); a refusal
        nothing explains is split in halves down to the credit it names (dropped with the ledger's
        message). Terminates: every round settles a credit at least, or stops on a refusal of the whole
        batch; the splitting recurses at most log2(batch) deep."""
        ledger = self.ledger_access.ledger
        assert ledger is not None
        checked = await self.ledger_access.call(
            "credit checks", lambda: [credit_refusal(ledger, run, c) for c in credits]
        )
        reasons = checked if checked is not None else [None] * len(credits)
        dropped = [(c, r) for c, r in zip(credits, reasons, strict=True) if r is not None]
        if dropped:  # the rest stay queued: the next round sends them
            for credit, reason in dropped:
                await self._drop(credit, reason, reason)
            return True
        if await self._blocked() is None:
            return False
        if len(credits) == 1:
            await self._drop(credits[0], "refused", str(error))
            return True
        half = len(credits) // 2
        first = await self._commit(credits[:half])
        return await self._commit(credits[half:]) and first

    async def _drop(self, credit: Credit, reason: str, detail: str) -> None:
        await self._settle([credit], committed=False, detail=detail)
        self.credits_dropped[reason] = self.credits_dropped.get(reason, 0) + 1
        log.warning(
            "credit dropped",
            extra={
                "worker": "0x" + credit.worker.hex(),
                "step": credit.step,
                "reason": reason,
                "error": detail,
            },
        )

    async def _settle(self, credits: list[Credit], *, committed: bool, detail: str) -> None:
        settled = [(c, detail) for c in credits]
        marked = await trio.to_thread.run_sync(
            lambda: self.store.settle_credits(self.run_id, settled, committed=committed)
        )
        self.credits.settled(marked)
        if committed:
            self.contributions += marked

    async def finalize_forever(self) -> None:
        """Read back the pending slashes this validator filed, then `finalize_slashes` every
        `slash_check_s`; a ledger that cannot answer is asked again next time."""
        ledger = self.ledger_access.ledger
        assert ledger is not None
        me = self.identity.address
        loaded = False
        while True:
            try:
                if not loaded:
                    records = await self.ledger_access.call("slashes", lambda: ledger.slashes(me))
                    for record in records or ():
                        if record.validator == me and record.status == SLASH_PENDING:
                            self.pending_slashes.setdefault(record.index, record.final_epoch)
                    loaded = True
                await self.finalize_slashes()
            except LedgerUnavailable:
                pass
            await trio.sleep(self.slash_check_s)

    async def finalize_slashes(self) -> None:
        """Finalize each pending slash filed here whose challenge window has passed (anyone may; the one
        who filed it has the reason to). A window still open waits; a slash no longer pending is dropped."""
        ledger = self.ledger_access.ledger
        if ledger is None or not self.pending_slashes:
            return
        epoch = await self.ledger_access.call("current_epoch", ledger.current_epoch)
        for index, final_epoch in sorted(self.pending_slashes.items()):
            if epoch is None or epoch < final_epoch:
                continue
            result = await self.ledger_access.attempt(
                "finalize_slash", functools.partial(ledger.finalize_slash, self.identity, index)
            )
            if isinstance(result, ChallengeWindowOpen):
                continue
            del self.pending_slashes[index]
            if isinstance(result, Receipt):
                self.slashes_finalized += 1
                log.info("finalized a slash", extra={"slash": index})
            elif isinstance(result, SlashNotPending):
                await self._count_settled(index)
            else:
                log.warning("finalizing a slash was refused", extra={"slash": index, "error": str(result)})

    async def _count_settled(self, index: int) -> None:
        """A slash someone else settled: voided (the worker keeps its stake), or finalized by another."""
        ledger = self.ledger_access.ledger
        assert ledger is not None
        me = self.identity.address
        records = await self.ledger_access.call("slashes", lambda: ledger.slashes(me))
        record = next((r for r in records or () if r.index == index), None)
        if record is not None and record.status == SLASH_VOIDED:
            self.slashes_voided += 1
        else:
            self.slashes_settled_elsewhere += 1
