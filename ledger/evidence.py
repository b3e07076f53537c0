"""Checks on what a contribution or a slash cites: pure functions over signed envelope bytes.

The signed log runs them inside the state machine; the EVM backend runs the same functions before it
sends a transaction (the contract cannot afford to decode msgpack or hash a 16 MiB submission, so on
chain the validator's own transaction signature is the attestation; spec/ledger.md, Trust).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crypto.hashing import sha256
from crypto.signing import InvalidSignature, recover_address
from ledger.errors import InvalidEvidence
from protocol.codec import decode
from protocol.envelope import Envelope, signing_digest
from protocol.errors import Reason, Reject
from protocol.ledger_messages import RecordContribution, Slash
from protocol.messages import RolloutSubmission, Verdict

# Rejections whose verdict anyone holding the checkpoint and the run descriptor can recompute. A malformed
# rollout (a field outside what the run allows, e.g. a token id beyond the vocabulary) is read off the
# signed submission and the descriptor alone.
SLASHABLE_REASONS = frozenset(
    {
        Reason.BAD_ASSIGNMENT,
        Reason.BAD_REWARD,
        Reason.BAD_TERMINATION,
        Reason.BAD_PROOF,
        Reason.BAD_SAMPLING,
        Reason.MALFORMED_ROLLOUT,
    }
)


@dataclass(frozen=True)
class SignedMessage:
    """An envelope whose signature recovered to its sender, with the decoded body."""

    envelope: Envelope
    message: Any


def open_signed(data: bytes, cls: type, what: str) -> SignedMessage:
    """Decode an envelope of type `cls`, recover its signer, decode its body; InvalidEvidence otherwise.

    No clock and no replay window: stored evidence is re-verified long after it was signed.
    """
    try:
        envelope = decode(Envelope, data)
    except Reject as exc:
        raise InvalidEvidence(f"{what} is not a canonical envelope: {exc.detail}") from None
    if envelope.type != cls.TYPE:  # type: ignore[attr-defined]
        raise InvalidEvidence(f"{what} is a {envelope.type!r} envelope, expected {cls.TYPE!r}")  # type: ignore[attr-defined]
    digest = signing_digest(
        envelope.type, envelope.run, envelope.sender, envelope.seq, envelope.ts, envelope.body
    )
    try:
        signer = recover_address(digest, envelope.sig)
    except InvalidSignature as exc:
        raise InvalidEvidence(f"{what} signature is invalid: {exc}") from None
    if signer != envelope.sender:
        raise InvalidEvidence(f"{what} signature does not recover to its sender {envelope.sender.hex()}")
    try:
        message: Any = decode(cls, envelope.body)
    except Reject as exc:
        raise InvalidEvidence(f"{what} body does not decode: {exc.detail}") from None
    return SignedMessage(envelope, message)


def check_verdict(op: RecordContribution, validator: bytes) -> bytes:
    """The cited verdict must be the recording validator's own signed acceptance of exactly this submission.

    Returns the verdict digest (sha256 of its envelope) that the ledger stores.
    """
    signed = open_signed(op.verdict, Verdict, "verdict")
    verdict: Verdict = signed.message
    if signed.envelope.sender != validator:
        raise InvalidEvidence("the verdict was signed by another node than the recording validator")
    if not verdict.accepted:
        raise InvalidEvidence("the verdict rejected the submission; only accepted work is credited")
    mismatches = [
        name
        for name, ours, theirs in (
            ("run", op.run, verdict.run),
            ("envelope run", op.run, signed.envelope.run),
            ("worker", op.worker, verdict.worker),
            ("step", op.step, verdict.step),
            ("rollout digest", op.rollout_digest, verdict.submission_digest),
            ("tokens", op.tokens, verdict.tokens),
        )
        if ours != theirs
    ]
    if mismatches:
        raise InvalidEvidence(f"the contribution disagrees with its verdict on {', '.join(mismatches)}")
    return sha256(op.verdict)


def check_slash_form(op: Slash) -> None:
    """The stateless rules the contract also enforces: a slashable reason and ascending chunk indices."""
    if op.reason_code not in SLASHABLE_REASONS:
        raise InvalidEvidence(f"reason {op.reason_code} is not a recomputable, slashable rejection")
    if any(b <= a for a, b in zip(op.failing_chunks, op.failing_chunks[1:], strict=False)):
        raise InvalidEvidence("failing chunk indices must be strictly ascending")
    if op.reason_code == Reason.BAD_PROOF and not op.failing_chunks:
        raise InvalidEvidence("a bad-proof slash must name at least one failing chunk")


def _chunk_count(submission: RolloutSubmission) -> int:
    return sum(len(c.proofs) for group in submission.groups for c in group.completions)


def check_slash_evidence(op: Slash) -> None:
    """The evidence must be a submission the slashed worker signed, named by the digest, in this run."""
    if sha256(op.evidence) != op.submission_digest:
        raise InvalidEvidence("the evidence does not hash to the named submission digest")
    signed = open_signed(op.evidence, RolloutSubmission, "evidence submission")
    if signed.envelope.sender != op.worker:
        raise InvalidEvidence("the evidence submission was not signed by the slashed worker")
    submission: RolloutSubmission = signed.message
    if submission.run != op.run or signed.envelope.run != op.run:
        raise InvalidEvidence(f"the evidence submission belongs to run {submission.run!r}, not {op.run!r}")
    chunks = _chunk_count(submission)
    if op.failing_chunks and op.failing_chunks[-1] >= chunks:
        raise InvalidEvidence(
            f"failing chunk {op.failing_chunks[-1]} is outside the submission's {chunks} chunks"
        )
