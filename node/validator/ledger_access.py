"""The ledger from trio (`LedgerAccess`), and what the validator writes to it or is refused for.

`slash_for`, `credit_for` and `fit_credit` build what a write carries; `commit_blocker` and
`credit_refusal` say (blocking reads) why the ledger refuses a batch or one credit.

Decisions:
- Ledger calls block (an fsynced SQLite commit, or a chain transaction): they run in threads, one at a time.
  Every failed ledger call is logged and counted (`ledger_errors`); none ever stops the judging. A typed
  refusal (a `LedgerError` of the state machine: duplicate, invalid evidence, ejected, ...) decides the
  write: the judgement moves on without it. Any other failure (`BackendError`, a corrupt or locked log,
  a replayed nonce, an OS, SQLite or web3 error) is transient: the submission stays queued with its stored
  decision, and the ledger write is retried with exponential backoff (`ledger_retries`). A worker
  whose stake cannot be read is not judged at all until it can (never accepted on an unread stake).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import trio

from swarmnode.ledger import Ledger, LedgerError
from swarmnode.ledger.evidence import SLASHABLE_REASONS
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.ledger.types import RunInfo
from swarmnode.node.roles.common import is_refusal
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.ledger_messages import MAX_FAILING_CHUNKS, Credit, Slash
from swarmnode.protocol.messages import Verdict

log = logging.getLogger(__name__)

T = TypeVar("T")


def slash_for(verdict: Verdict, evidence: bytes, amount_gwei: int) -> Slash | None:
    """The slash a rejection warrants, or None: not slashable, no amount, or a bad proof without a chunk."""
    if verdict.accepted or verdict.reason_code not in SLASHABLE_REASONS or amount_gwei < 1:
        return None
    chunks = verdict.failing_chunks[:MAX_FAILING_CHUNKS] if verdict.reason_code == Reason.BAD_PROOF else ()
    if verdict.reason_code == Reason.BAD_PROOF and not chunks:
        return None
    return Slash(
        run=verdict.run,
        worker=verdict.worker,
        amount_gwei=amount_gwei,
        failing_chunks=chunks,
        reason_code=verdict.reason_code,
        evidence=evidence,
    )


def credit_for(verdict: Verdict, parameters: int) -> Credit:
    """The credit an acceptance earns: its tokens, about 2 · parameters FLOPs per token, the submission."""
    return Credit(
        worker=verdict.worker,
        step=verdict.step,
        tokens=verdict.tokens,
        flops=2 * parameters * verdict.tokens,
        rollout_digest=verdict.submission_digest,
    )


def fit_credit(credit: Credit, run: RunInfo) -> Credit:
    """The FLOPs the run lets a credit claim: at most its bound per token (the ledger caps that bound, so
    a model beyond it is credited the cap)."""
    return replace(credit, flops=min(credit.flops, credit.tokens * run.max_flops_per_token))


def commit_blocker(ledger: Ledger, run: RunInfo, validator: bytes) -> str | None:
    """Blocking: why no batch of this validator can be committed to the run now (None: one can)."""
    if validator not in run.validators:
        return f"not one of run {run.run!r}'s {len(run.validators)} validators (its owner sets them)"
    info = ledger.node(validator)
    if info is None or info.role != "validator" or info.ejected or not ledger.is_eligible(validator):
        return "this node is not a registered, unejected, fully staked validator on the ledger"
    return None


def credit_refusal(ledger: Ledger, run: RunInfo, credit: Credit) -> str | None:
    """Blocking: why the ledger refuses this one credit whatever batch carries it (None: no such reason)."""
    if ledger.is_credited(run.run, credit.worker, credit.step):
        return "already_credited"
    worker = ledger.node(credit.worker)
    if worker is None or worker.role != "worker" or worker.ejected or not ledger.is_eligible(credit.worker):
        return "ineligible"
    if credit.tokens > run.max_tokens_per_credit:
        return "out_of_bounds"
    return None


class LedgerUnavailable(Exception):
    """A ledger call failed for a reason that may pass (backend down, RPC error, file error): retry later."""


class LedgerAccess:
    """Blocking ledger calls in a thread, one at a time. A typed refusal returns None (`attempt`: the
    refusal itself); any other exception (web3's and the OS's included) raises `LedgerUnavailable`. Both
    are counted."""

    def __init__(self, ledger: Ledger | None) -> None:
        self.ledger = ledger
        self.errors = 0  # refusals and failures
        self.refusals = 0
        self.last_error = ""
        self._lock: trio.Lock | None = None

    async def call(self, what: str, fn: Callable[[], T]) -> T | None:
        result = await self.attempt(what, fn)
        return None if isinstance(result, LedgerError) else result

    async def attempt(self, what: str, fn: Callable[[], T]) -> T | LedgerError:
        """`call`, returning a typed refusal (to act on its kind) instead of None."""
        if self._lock is None:
            self._lock = trio.Lock()
        async with self._lock:
            try:
                return await trio.to_thread.run_sync(fn)
            except Exception as exc:  # backends raise anything (web3 has no common base); never let it out
                self.errors += 1
                self.last_error = f"{what}: {exc}"
                if isinstance(exc, LedgerError) and is_refusal(exc):
                    self.refusals += 1
                    log.warning("ledger refused", extra={"call": what, "error": str(exc)})
                    return exc
                log.warning("ledger call failed", extra={"call": what, "error": repr(exc)})
                raise LedgerUnavailable(f"{what}: {exc!r}") from exc

    def eligible(self, address: bytes) -> bool:
        """Blocking: the worker's stake now (a signed log first reads what other writers appended)."""
        assert self.ledger is not None
        if isinstance(self.ledger, SignedLog):
            self.ledger.refresh()
        return self.ledger.is_eligible(address)

    def slash_cap(self, amount_gwei: int) -> int:
        """Blocking: the run's slash amount, capped by the ledger's maximum."""
        assert self.ledger is not None
        return min(amount_gwei, self.ledger.params.slash_gwei)
