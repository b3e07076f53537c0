"""DHT key formats and the run-record validator (invalid cases outnumber valid ones)."""

from __future__ import annotations

import dataclasses

import pytest

from swarmnode.crypto.hashing import sha256
from swarmnode.node.p2p.records import (
    InvalidRecord,
    RunRecordValidator,
    checkpoint_key,
    checkpoint_name,
    is_provider_key,
    open_run_record,
    parse_run_record_key,
    provider_key,
    role_key,
    role_name,
    run_record_key,
    select_run_record,
)
from swarmnode.node.trainer.service import dev_run_descriptor
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, seal
from swarmnode.protocol.messages import ShardHave
from tests.conformance.keys import vector_identity

RUN = "run-1"
TRAINER = vector_identity(1)
OTHER = vector_identity(2)


def record(identity=TRAINER, *, run=RUN, trainer=None, created_ms=1_700_000_000_000, seq=1):  # type: ignore[no-untyped-def]
    descriptor = dev_run_descriptor(
        run, trainer if trainer is not None else identity.address, created_ms=created_ms
    )
    return seal(identity, descriptor, run=run, seq=seq, ts=created_ms)


def test_provider_keys_are_sha256_multihashes_of_names() -> None:
    assert role_name(RUN, "relay") == "swarmnode/run-1/role/relay"
    assert checkpoint_name(RUN, 7) == "swarmnode/run-1/checkpoint/7"
    key = role_key(RUN, "relay")
    assert key == b"\x12\x20" + sha256(b"swarmnode/run-1/role/relay") == provider_key(role_name(RUN, "relay"))
    assert is_provider_key(key) and is_provider_key(checkpoint_key(RUN, 7))
    assert len({role_key(RUN, r) for r in ("trainer", "relay", "worker", "validator")}) == 4


@pytest.mark.parametrize(
    "bad", [b"", b"\x12\x20" + b"x" * 31, b"\x12\x21" + b"x" * 32, b"\x13\x20" + b"x" * 32, b"plain-key"]
)
def test_provider_key_shape_is_checked(bad: bytes) -> None:
    assert not is_provider_key(bad)


@pytest.mark.parametrize("run", ["", "UPPER", "-lead", "a" * 65, "spa ce", "sl/ash"])
def test_bad_run_ids_are_refused(run: str) -> None:
    with pytest.raises(InvalidRecord):
        role_key(run, "relay")
    with pytest.raises(InvalidRecord):
        run_record_key(run)


def test_unknown_roles_and_versions_are_refused() -> None:
    with pytest.raises(InvalidRecord):
        role_key(RUN, "bootstrap")
    with pytest.raises(InvalidRecord):
        checkpoint_key(RUN, -1)
    with pytest.raises(InvalidRecord):
        checkpoint_key(RUN, 2**64)


def test_run_record_roundtrip() -> None:
    assert run_record_key(RUN) == "/swarmnode/run/run-1"
    assert parse_run_record_key("/swarmnode/run/run-1") == RUN
    opened = open_run_record(run_record_key(RUN), record())
    assert opened.sender == TRAINER.address and opened.descriptor.run == RUN


def test_run_record_is_valid_long_after_it_was_signed() -> None:
    old = record(created_ms=1_000)  # years ago: freshness does not apply to stored records
    assert open_run_record(run_record_key(RUN), old).descriptor.created_ms == 1_000


@pytest.mark.parametrize("key", ["/swarmnode/run/other", "/swarmnode/runs/run-1", "/pk/run-1", "run-1"])
def test_run_record_under_the_wrong_key(key: str) -> None:
    with pytest.raises(InvalidRecord):
        open_run_record(key, record())


def test_run_record_must_be_signed_by_the_trainer_it_names() -> None:
    with pytest.raises(InvalidRecord, match="signed by the trainer"):
        open_run_record(run_record_key(RUN), record(OTHER, trainer=TRAINER.address))


def test_run_record_pinned_trainer() -> None:
    with pytest.raises(InvalidRecord, match="pinned"):
        open_run_record(run_record_key(RUN), record(OTHER), trainer=TRAINER.address)
    assert open_run_record(run_record_key(RUN), record(), trainer=TRAINER.address)


def test_run_record_other_types_garbage_and_tampering() -> None:
    key = run_record_key(RUN)
    have = seal(
        TRAINER,
        ShardHave(run=RUN, version=0, merkle_root=bytes(32), bitfield=b"", endpoint=""),
        run=RUN,
        seq=1,
        ts=1,
    )
    for value in (have, b"", b"\x00" * 40, record()[:-1]):
        with pytest.raises(InvalidRecord):
            open_run_record(key, value)
    envelope = decode(Envelope, record())
    tampered = encode(dataclasses.replace(envelope, body=envelope.body[:-1] + bytes([envelope.body[-1] ^ 1])))
    with pytest.raises(InvalidRecord):
        open_run_record(key, tampered)
    descriptor_for_other_run = seal(
        TRAINER, dev_run_descriptor("other", TRAINER.address), run=RUN, seq=1, ts=1
    )
    with pytest.raises(InvalidRecord, match="names run"):
        open_run_record(key, descriptor_for_other_run)


def test_select_prefers_valid_then_newest() -> None:
    key = run_record_key(RUN)
    old, new = record(created_ms=1_000, seq=1), record(created_ms=2_000, seq=2)
    assert select_run_record(key, [old, new]) == 1
    assert select_run_record(key, [new, old]) == 0
    assert select_run_record(key, [b"garbage", old]) == 1
    validator = RunRecordValidator()
    with pytest.raises(InvalidRecord):
        validator.validate(key, b"garbage")
    assert validator.rejected == 1
    validator.validate(key, new)
    assert validator.select(key, [old, new]) == 1
