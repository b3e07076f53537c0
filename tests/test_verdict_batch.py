"""VerdictBatch (spec/gossip.md, Verdict batches): built by the batcher, sealed once, checked whole."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import ENVELOPE_OVERHEAD, open_envelope, seal
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.messages import VERDICT_BATCH_MAX_ITEMS, VERDICT_BATCH_MAX_SIZE, Verdict, VerdictBatch
from swarmnode.protocol.verdicts import VerdictBatcher, check_opened_verdicts, check_verdict_batch

RUN = "batch-run"
NOW = 1_767_225_600_000
VALIDATOR = NodeIdentity(b"\x11" * 32)
OTHER = NodeIdentity(b"\x22" * 32)

verdicts = st.builds(
    Verdict,
    run=st.just(RUN),
    submission_digest=st.binary(min_size=32, max_size=32),
    worker=st.binary(min_size=20, max_size=20),
    step=st.integers(0, 2**64 - 1),
    checkpoint_version=st.integers(0, 2**32),
    accepted=st.booleans(),
    reason_code=st.integers(0, 999),
    detail=st.text(max_size=40),
    failing_chunks=st.lists(st.integers(0, 2**32), max_size=64).map(tuple),
    tokens=st.integers(0, 2**40),
    mean_exp_mismatches=st.floats(allow_nan=False, allow_infinity=False),
    mean_mant_err=st.floats(allow_nan=False, allow_infinity=False),
)
distinct = st.lists(verdicts, min_size=1, max_size=40, unique_by=lambda v: v.submission_digest)


def sealed(batch: VerdictBatch, signer: NodeIdentity = VALIDATOR, run: str = RUN) -> bytes:
    return seal(signer, batch, run=run, seq=1, ts=NOW)


def opened_check(data: bytes) -> tuple[Verdict, ...]:
    return check_opened_verdicts(open_envelope(data, run=RUN, now_ms=NOW, replay=None, expect=VerdictBatch))


def batches_of(items: list[Verdict], max_items: int) -> list[VerdictBatch]:
    batcher = VerdictBatcher(RUN, VALIDATOR.address, max_items=max_items)
    out = [b for v in items for b in batcher.add(v)]
    last = batcher.take()
    assert batcher.take() is None and len(batcher) == 0
    return out + ([last] if last is not None else [])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(distinct, st.integers(1, VERDICT_BATCH_MAX_ITEMS))
def test_batches_round_trip_and_keep_every_verdict_in_order(items: list[Verdict], max_items: int) -> None:
    batches = batches_of(items, max_items)
    assert [v for b in batches for v in b.verdicts] == items
    for batch in batches:
        assert 1 <= len(batch.verdicts) <= max_items
        data = sealed(batch)
        assert len(data) <= VERDICT_BATCH_MAX_SIZE + ENVELOPE_OVERHEAD
        assert decode(VerdictBatch, encode(batch)) == batch
        assert opened_check(data) == batch.verdicts


@settings(max_examples=30, deadline=None)
@given(st.lists(verdicts, min_size=2, max_size=20))
def test_a_repeated_submission_starts_a_new_batch(items: list[Verdict]) -> None:
    items = [*items, items[0]]  # the last repeats the first
    for batch in batches_of(items, VERDICT_BATCH_MAX_ITEMS):
        check_verdict_batch(batch, signer=VALIDATOR.address, run=RUN)


def test_a_batch_is_full_by_bytes_before_it_is_too_large_to_gossip() -> None:
    """Verdicts at their widest (4096 failing chunks of 5 bytes each, ~20 KiB) fill a batch by bytes."""
    wide = [Verdict(RUN, bytes([n]) * 32, b"\x01" * 20, n, 1, False, 605, "x" * 512,
                    tuple(range(2**31, 2**31 + 4096)), 1, 0.0, 0.0) for n in range(100)]
    batches = batches_of(wide, VERDICT_BATCH_MAX_ITEMS)
    assert len(batches) > 1 and [v for b in batches for v in b.verdicts] == wide
    for batch in batches[:-1]:
        assert len(encode(batch)) <= VERDICT_BATCH_MAX_SIZE < len(encode(batch)) + len(encode(wide[0]))
        opened_check(sealed(batch))


def _bad(items: list[Verdict], index: int, how: str) -> tuple[VerdictBatch, NodeIdentity, Reason]:
    batch = VerdictBatch(RUN, VALIDATOR.address, tuple(items))
    if how == "other-run":  # one verdict of another run: the whole batch goes
        changed = list(items)
        changed[index] = dataclasses.replace(items[index], run="other-run")
        return dataclasses.replace(batch, verdicts=tuple(changed)), VALIDATOR, Reason.RULE_VIOLATION
    if how == "repeat":  # one verdict repeats another's submission
        changed = [*items[: index + 1], items[index], *items[index + 1 :]]
        return dataclasses.replace(batch, verdicts=tuple(changed)), VALIDATOR, Reason.RULE_VIOLATION
    if how == "batch-run":
        return dataclasses.replace(batch, run="other-run"), VALIDATOR, Reason.RULE_VIOLATION
    if how == "not-the-signer":
        return batch, OTHER, Reason.WRONG_SENDER
    assert how == "empty"
    return dataclasses.replace(batch, verdicts=()), VALIDATOR, Reason.RULE_VIOLATION


@settings(max_examples=60, deadline=None)
@given(distinct, st.data(), st.sampled_from(["other-run", "repeat", "batch-run", "not-the-signer", "empty"]))
def test_every_rule_refuses_the_whole_batch(items: list[Verdict], data: st.DataObject, how: str) -> None:
    index = data.draw(st.integers(0, len(items) - 1))
    batch, signer, reason = _bad(items, index, how)
    with pytest.raises(Reject) as refused:
        opened_check(sealed(batch, signer))
    assert refused.value.reason == reason


def test_the_batcher_refuses_what_it_could_never_send() -> None:
    with pytest.raises(ValueError):
        VerdictBatcher(RUN, VALIDATOR.address, max_items=VERDICT_BATCH_MAX_ITEMS + 1)
    with pytest.raises(ValueError):
        VerdictBatcher(RUN, VALIDATOR.address, max_items=0)
    with pytest.raises(ValueError):
        VerdictBatcher(RUN, VALIDATOR.address, max_bytes=Verdict.MAX_SIZE)  # no room for a widest verdict
    batcher = VerdictBatcher(RUN, VALIDATOR.address)
    with pytest.raises(ValueError):
        batcher.add(Verdict("other-run", b"\x00" * 32, b"\x00" * 20, 0, 0, True, 0, "", (), 0, 0.0, 0.0))
    assert len(batcher) == 0 and batcher.take() is None
