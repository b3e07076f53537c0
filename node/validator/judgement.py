"""A judgement and what it becomes (spec/validation.md): `judge_submission` runs `judge_total` and
times it, `gets_full_check` decides which submissions get the prefill checks (those whose grading executes
a completion, and those `drawn_for_full_check` draws), `make_verdict` turns the outcome into the signed
verdict's body, and a `Decision` (the outcome, the verdict and its sealed bytes) is what the store keeps
before any ledger write, read back unchanged after a restart.

A verdict is public (gossiped, cited by slashes): its detail names where a check failed, never what a
grader computed (`check_rewards`), and an ignore (a JUDGE_FAULT among them, whose detail quotes an
exception) is never sealed nor gossiped.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.validation import (
    Accepted,
    BadProof,
    ProofFailure,
    ValidationContext,
    grades_by_execution,
    judge_total,
)
from swarmnode.node.validator.engines import CheckpointEngines
from swarmnode.node.validator.limits import MAX_DETAIL_BYTES, MAX_VERDICT_CHUNKS, UNSAMPLED
from swarmnode.node.validator.store_rows import Decided, PendingItem
from swarmnode.node.validator.store_schema import ACCEPTED as ACCEPTED_STATUS
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.errors import Ignore, ProtocolError, Reason, Reject
from swarmnode.protocol.messages import RolloutSubmission, Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Judgement:
    outcome: Accepted | ProtocolError
    cpu_s: float  # this thread's CPU time spent judging
    full: bool  # the prefill checks ran


def judge_submission(
    sub: RolloutSubmission, worker: bytes, ctx: ValidationContext, engines: CheckpointEngines, full: bool
) -> Judgement:
    """`judge_total` with its CPU time (blocking: run in a thread). Total: an exception that is not a
    typed refusal (a check tripping over hostile input, an engine error) is a JUDGE_FAULT ignore."""
    start = time.thread_time()
    outcome = judge_total(sub, worker, ctx, engines.engine, prefill=full)
    if isinstance(outcome, Ignore) and outcome.reason == Reason.JUDGE_FAULT:
        log.error(
            "judging failed",
            extra={"worker": "0x" + worker.hex(), "step": sub.step},
            exc_info=outcome.__cause__,
        )
    return Judgement(outcome, time.thread_time() - start, full)


def drawn_for_full_check(secret: bytes, digest: bytes, fraction: float) -> bool:
    """Whether a submission gets the prefill checks: HMAC-SHA256(secret, digest) < fraction · 2^256.

    The secret never leaves the validator, so a worker cannot grind its envelope into the unchecked part.
    """
    if fraction >= 1.0:
        return True
    if not fraction > 0.0:
        return False
    draw = int.from_bytes(hmac.digest(secret, digest, "sha256"), "big")
    return draw < int(fraction * 2**256)


def gets_full_check(
    sub: RolloutSubmission, dataset: Mapping[bytes, Task], secret: bytes, digest: bytes, fraction: float
) -> bool:
    """Whether a submission gets the prefill checks: always when grading it would execute a completion
    (its text must first be shown to be the model's own: `grades_by_execution`), else when drawn."""
    return grades_by_execution(sub, dataset) or drawn_for_full_check(secret, digest, fraction)


def clip_detail(text: str) -> str:
    return text.encode()[:MAX_DETAIL_BYTES].decode(errors="ignore")


def make_verdict(
    sub: RolloutSubmission, digest: bytes, worker: bytes, outcome: Accepted | ProtocolError, full: bool = True
) -> Verdict:
    """The signed judgement's body: acceptance statistics, or the reason code and failing chunks."""
    if isinstance(outcome, Accepted):
        return Verdict(
            run=sub.run,
            submission_digest=digest,
            worker=worker,
            step=sub.step,
            checkpoint_version=sub.checkpoint_version,
            accepted=True,
            reason_code=0,
            detail="" if full else UNSAMPLED,
            failing_chunks=(),
            tokens=outcome.tokens,
            mean_exp_mismatches=outcome.mean_exp_mismatches,
            mean_mant_err=outcome.mean_mant_err,
        )
    failure = outcome.failure if isinstance(outcome, BadProof) else ProofFailure((), 0.0, 0.0)
    return Verdict(
        run=sub.run,
        submission_digest=digest,
        worker=worker,
        step=sub.step,
        checkpoint_version=sub.checkpoint_version,
        accepted=False,
        reason_code=int(outcome.reason),
        detail=clip_detail(outcome.detail),
        failing_chunks=failure.failing_chunks[:MAX_VERDICT_CHUNKS],
        tokens=0,
        mean_exp_mismatches=failure.mean_exp_mismatches,
        mean_mant_err=failure.mean_mant_err,
    )


def fault_verdict(run: str, item: PendingItem, outcome: Ignore) -> Verdict:
    """The verdict body of an item whose stored envelope could not be read back (never sealed)."""
    return Verdict(
        run=run,
        submission_digest=item.digest,
        worker=item.worker,
        step=item.step,
        checkpoint_version=item.checkpoint_version,
        accepted=False,
        reason_code=int(outcome.reason),
        detail=clip_detail(outcome.detail),
        failing_chunks=(),
        tokens=0,
        mean_exp_mismatches=0.0,
        mean_mant_err=0.0,
    )


@dataclass(frozen=True)
class Decision:
    """A judgement made and sealed, waiting for its ledger write and `finish` (kept across ledger retries
    and, as the store's `Decided` record, across restarts)."""

    outcome: Accepted | ProtocolError
    judgement: Judgement
    verdict: Verdict
    sealed: bytes  # b"" for an ignore

    def record(self) -> Decided:
        """What the store keeps of it."""
        outcome = self.outcome
        if isinstance(outcome, Accepted):
            kind, status = "accepted", ACCEPTED_STATUS
        else:
            kind, status = ("ignored" if isinstance(outcome, Ignore) else "rejected"), int(outcome.reason)
        return Decided(
            outcome=kind,
            status=status,
            tokens=self.verdict.tokens,
            verdict=encode(self.verdict),
            sealed=self.sealed,
            full=self.judgement.full,
            cpu_s=self.judgement.cpu_s,
        )

    @classmethod
    def restore(cls, decided: Decided) -> Decision:
        """The decision a stored record holds (its sealed verdict unchanged: it is never sealed again)."""
        verdict = decode(Verdict, decided.verdict)
        outcome: Accepted | ProtocolError
        if decided.outcome == "accepted":
            outcome = Accepted(verdict.tokens, verdict.mean_exp_mismatches, verdict.mean_mant_err)
        elif decided.outcome == "ignored":
            outcome = Ignore(Reason(decided.status), verdict.detail)
        elif decided.status == Reason.BAD_PROOF:
            failure = ProofFailure(verdict.failing_chunks, verdict.mean_exp_mismatches, verdict.mean_mant_err)
            outcome = BadProof(verdict.detail, failure)
        else:
            outcome = Reject(Reason(decided.status), verdict.detail)
        return cls(outcome, Judgement(outcome, decided.cpu_s, decided.full), verdict, decided.sealed)


def reason_name(code: int) -> str:
    try:
        return Reason(code).name
    except ValueError:
        return str(code)
