"""The rows the validator store (`node.validator.store`) hands out and takes: a queued submission, a
decision, a credit owed, and the counts behind the status. Plain frozen values: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from swarmnode.protocol.ledger_messages import Credit


@dataclass(frozen=True)
class PendingItem:
    """A queued submission as the judge's scheduler sees it (the envelope stays on disk)."""

    id: int  # arrival order
    digest: bytes
    worker: bytes
    step: int
    checkpoint_version: int
    received_ms: int
    size: int


@dataclass(frozen=True)
class Decided:
    """A pending submission's decision, made before its ledger write (the `decided` table)."""

    outcome: str  # one of OUTCOMES
    status: int  # ACCEPTED, or the reason code
    tokens: int
    verdict: bytes  # the encoded `Verdict` body (reason, detail, failing chunks, tokens, TOPLOC means)
    sealed: bytes  # the verdict envelope, sealed once; b"" for an ignore
    full: bool  # the prefill checks ran
    cpu_s: float


@dataclass(frozen=True)
class RunCredit:
    """A credit an acceptance is owed in one run (the `credits` table)."""

    run: str
    credit: Credit


@dataclass(frozen=True)
class CreditCounts:
    """The `credits` table by state (settled rows pruned below the floor are no longer counted)."""

    queued: int
    committed: int
    dropped: int


@dataclass(frozen=True)
class JudgedCounts:
    """What the `judged` table says, for the status after a restart."""

    by_status: dict[int, int]  # verdicts (acceptances and rejections) by status
    ignored: dict[int, int]  # ignores by reason code
    per_worker: dict[bytes, dict[int, int]]  # verdicts only
    tokens: int


@dataclass(frozen=True)
class Pruned:
    """What one `prune` did."""

    floor: int  # the floor version now
    judged: int  # judged rows dropped
    accepted: int  # accepted items dropped


@dataclass(frozen=True)
class StoreStatistics:
    pending: int
    pending_bytes: int
    decided: int
    judged: int
    accepted: int
    accepted_bytes: int
    floor: int
    credits_queued: int = 0
