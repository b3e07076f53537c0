"""The `verdicts` topic carries VerdictBatches, judged whole by the topic rule (spec/gossip.md)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.gossip.checks import check_gossip_message
from swarmnode.node.p2p.gossip.policy import DEFAULT_POLICIES
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, ReplayWindow, seal
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import Verdict, VerdictBatch

RUN = "gossip-run"
NOW = 1_767_225_600_000
VALIDATOR = NodeIdentity(b"\x33" * 32)
POLICY = DEFAULT_POLICIES["verdicts"]


def verdict(n: int, run: str = RUN) -> Verdict:
    return Verdict(run, n.to_bytes(32, "big"), b"\x05" * 20, n, 2, True, 0, "", (), 10, 0.1, 0.2)


def check(data: bytes, replay: ReplayWindow | None = None):  # type: ignore[no-untyped-def]
    return check_gossip_message(POLICY, data, run=RUN, now_ms=NOW, replay=replay or ReplayWindow())


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 256), st.data())
def test_one_bad_verdict_refuses_the_batch_and_leaves_no_trace(size: int, data: st.DataObject) -> None:
    items = [verdict(n) for n in range(size)]
    good = seal(VALIDATOR, VerdictBatch(RUN, VALIDATOR.address, tuple(items)), run=RUN, seq=1, ts=NOW)
    assert check(good).message.verdicts == tuple(items)
    bad_at = data.draw(st.integers(0, size - 1))
    items[bad_at] = verdict(bad_at, run="other-run")
    replay = ReplayWindow()
    bad = seal(VALIDATOR, VerdictBatch(RUN, VALIDATOR.address, tuple(items)), run=RUN, seq=2, ts=NOW)
    with pytest.raises(Reject) as refused:
        check(bad, replay)
    assert refused.value.reason == Reason.RULE_VIOLATION and f"verdict {bad_at} " in str(refused.value)


def test_a_single_verdict_is_not_carried() -> None:
    data = seal(VALIDATOR, verdict(1), run=RUN, seq=1, ts=NOW)
    with pytest.raises(Reject) as refused:
        check(data)
    assert refused.value.reason == Reason.UNKNOWN_TYPE


def test_a_batch_of_another_run_is_dropped_before_its_signature_or_items() -> None:
    """Run-scoped: the envelope's run decides first; a garbled signature and body are never looked at."""
    other = VerdictBatch("other-run", VALIDATOR.address, (verdict(1, "other-run"),))
    envelope = decode(Envelope, seal(VALIDATOR, other, run="other-run", seq=1, ts=NOW))
    garbled = dataclasses.replace(envelope, sig=b"\x00" * 65, body=envelope.body[:-4] + b"\xc1\xc1\xc1\xc1")
    with pytest.raises(Ignore) as ignored:
        check(encode(garbled))
    assert ignored.value.reason == Reason.WRONG_RUN


def test_the_topic_cap_holds_the_largest_batch() -> None:
    assert POLICY.max_bytes == 960 * 1024 == VerdictBatch.MAX_SIZE + 512
