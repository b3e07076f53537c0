"""Pure intake checks: is a pulled ACCEPTED item one this trainer may train on (spec/validation.md)?

Every check takes what it needs as arguments (the run, the validator, the GRPO parameters, the model's
bounds, the published roots, the time) and touches no network, so they are tested without one and
`check_batch` may run in a thread. A refusal is a typed `Reject` (the delivering validator's fault) or
`Ignore` (stale: nobody's), with the reason the trainer reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from swarmnode.node.rl.learner import signal_groups
from swarmnode.node.rl.model import ModelInfo
from swarmnode.node.rl.validation import check_groups_shape
from swarmnode.node.trainer.inbox import InboxEntry
from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import Envelope, Opened, envelope_digest, open_envelope
from swarmnode.protocol.errors import Ignore, ProtocolError, Reason, Reject
from swarmnode.protocol.messages import (
    AcceptedBatch,
    AcceptedRollout,
    EnvironmentTerms,
    GrpoParams,
    RolloutSubmission,
    Verdict,
)
from swarmnode.protocol.runs import step_version

MAX_VERSION = 2**32  # a checkpoint version is the high half of a u64 assignment step
MAX_INDEX = 2**63  # SQLite integers are signed 64-bit
ADVANTAGE_SLACK = 1e-4  # relative rounding allowed above the largest group-normalised advantage


def open_stored(data: bytes, cls: type, run: str) -> Opened:
    """Every check of `open_envelope` but the clock and the replay window: the envelope was signed earlier."""
    signed_at = decode(Envelope, data).ts
    return open_envelope(data, run=run, now_ms=signed_at, replay=None, expect=cls)


def check_trainable(sub: RolloutSubmission, grpo: GrpoParams, cfg: ModelInfo,
                    terms: EnvironmentTerms | None = None) -> None:
    """Refuse a submission the GRPO step could not take (a buggy validator must not crash the trainer).

    The shape rules are the validator's own (`check_groups_shape`); here a violation is the validator's
    fault for accepting it, so it is a rule violation, not the worker's malformed rollout.
    """
    if not sub.groups:
        raise Reject(Reason.RULE_VIOLATION, "submission has no groups")
    try:
        check_groups_shape(sub, grpo, cfg, terms)
    except Reject as malformed:
        raise Reject(Reason.RULE_VIOLATION, f"accepted a malformed rollout: {malformed.detail}") from None
    # (r - mean) / std over a group of n is at most sqrt(n - 1) in magnitude (all but one reward equal)
    max_advantage = math.sqrt(max(grpo.group_size - 1, 0)) * (1 + ADVANTAGE_SLACK)
    for g, group in enumerate(sub.groups):
        for c in group.completions:
            if abs(c.advantage) > max_advantage:
                raise Reject(
                    Reason.RULE_VIOLATION,
                    f"group {g} has an advantage {c.advantage} beyond ±{max_advantage:.4f}",
                )


def check_checkpoint(sub: RolloutSubmission, roots: Mapping[int, bytes]) -> None:
    """The submission names a version we published, with our manifest's root.

    `roots` holds the versions the origin still keeps (every one a step may still take, and one more), so
    a version below them is merely stale (Ignore); one above, or missing in between, we never published.
    """
    version = sub.checkpoint_version
    if version >= MAX_VERSION or step_version(sub.step) != version:
        raise Reject(Reason.BAD_ASSIGNMENT, f"step {sub.step} is not bound to checkpoint version {version}")
    if not roots:
        raise Ignore(Reason.UNKNOWN_CHECKPOINT, "nothing is published yet")
    root = roots.get(version)
    if root is None and version < min(roots):
        raise Ignore(Reason.STALE, f"checkpoint v{version} is older than the versions kept")
    if root is None:
        raise Reject(Reason.UNKNOWN_CHECKPOINT, f"checkpoint v{version} was never published")
    if root != sub.checkpoint_root:
        raise Reject(Reason.BAD_HASH, f"checkpoint v{version} root differs from the published manifest")


def verify_accepted(
    item: AcceptedRollout,
    *,
    run: str,
    validator: bytes,
    grpo: GrpoParams,
    cfg: ModelInfo,
    roots: Mapping[int, bytes],
    received_ms: int,
    terms: EnvironmentTerms | None = None,
) -> InboxEntry:
    """An accepted item as an inbox entry, or Reject/Ignore with the reason the validator is charged for.

    The verdict must be `validator`'s own signed acceptance of exactly this submission envelope, and the
    submission must be signed by the worker the verdict names, for this run, on a checkpoint we published
    (`roots`: version → the Merkle root of our manifest).
    """
    opened_verdict = open_stored(item.verdict, Verdict, run)
    if opened_verdict.sender != validator:
        raise Reject(
            Reason.WRONG_SENDER, f"verdict signed by {opened_verdict.sender.hex()}, not the validator"
        )
    verdict: Verdict = opened_verdict.message
    if verdict.run != run:
        raise Reject(Reason.RULE_VIOLATION, f"verdict names run {verdict.run!r}")
    if not verdict.accepted:
        raise Reject(Reason.RULE_VIOLATION, "the verdict rejects the submission")
    digest = envelope_digest(item.submission)
    if verdict.submission_digest != digest:
        raise Reject(Reason.BAD_HASH, "the verdict names another submission")
    opened_sub = open_stored(item.submission, RolloutSubmission, run)
    if opened_sub.sender != verdict.worker:
        raise Reject(Reason.WRONG_SENDER, "the submission is not signed by the worker the verdict names")
    sub: RolloutSubmission = opened_sub.message
    if sub.run != run:
        raise Reject(Reason.RULE_VIOLATION, f"submission names run {sub.run!r}")
    if (sub.step, sub.checkpoint_version) != (verdict.step, verdict.checkpoint_version):
        raise Reject(
            Reason.RULE_VIOLATION, "the verdict names another step or checkpoint than the submission"
        )
    check_checkpoint(sub, roots)
    check_trainable(sub, grpo, cfg, terms)
    return InboxEntry(
        index=item.index,
        digest=digest,
        worker=verdict.worker,
        step=sub.step,
        checkpoint_version=sub.checkpoint_version,
        groups=len(sub.groups),
        signal_groups=len(signal_groups(sub.groups)),
        submission=item.submission,
        verdict=item.verdict,
        received_ms=received_ms,
    )


@dataclass(frozen=True)
class Checked:
    entries: tuple[InboxEntry, ...]
    cursor: int  # the validator's cursor once this batch is stored
    refused: tuple[tuple[int, Reason, str], ...]  # (index, reason, detail) of each item refused


def check_batch(
    batch: AcceptedBatch,
    cursor: int,
    *,
    run: str,
    validator: bytes,
    grpo: GrpoParams,
    cfg: ModelInfo,
    roots: Mapping[int, bytes],
    now_ms: int,
    terms: EnvironmentTerms | None = None,
) -> Checked:
    """Verify a pulled batch against our cursor (CPU only: callers may run it in a thread).

    Indices must rise above the cursor; refused items are skipped for good (the cursor passes them). A
    validator whose newest index fell below our cursor lost its log: the cursor starts over at 0 (what
    comes again is dropped by digest).
    """
    if not batch.items and batch.newest < cursor:
        return Checked((), 0, ())
    entries: list[InboxEntry] = []
    refused: list[tuple[int, Reason, str]] = []
    last = cursor
    for item in batch.items:
        if item.index <= last:
            refused.append((item.index, Reason.RULE_VIOLATION, f"index {item.index} is not above {last}"))
            continue
        if item.index >= MAX_INDEX:  # refused without moving the cursor there (it could not be stored)
            refused.append((item.index, Reason.OUT_OF_RANGE, f"index {item.index} is not below 2**63"))
            continue
        last = item.index
        try:
            entries.append(
                verify_accepted(item, run=run, validator=validator, grpo=grpo, cfg=cfg, roots=roots,
                                received_ms=now_ms, terms=terms)
            )
        except ProtocolError as exc:
            refused.append((item.index, exc.reason, exc.detail))
    return Checked(tuple(entries), last, tuple(refused))
