"""Conformance cases for DHT keys, run records, gossip topics and the gossip message rule.

The `p2p` suite of node/conformance.py: scripts/gen_vectors.py writes `SUITES` to spec/vectors/p2p/*.json;
tests/p2p/test_vectors.py fails when the committed files and these cases disagree, and replays the files.
Invalid cases outnumber valid ones: the reasons are the contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from swarmnode.ledger.log import sign_operation
from swarmnode.node.p2p.conformance import (
    check_dht_key,
    check_gossip_authority,
    check_gossip_message_case,
    check_gossip_topic,
    check_run_record,
)
from swarmnode.node.p2p.gossip import VIEW_LAG_MS
from swarmnode.node.p2p.records import run_record_key
from swarmnode.node.trainer.service import dev_run_descriptor
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, seal
from swarmnode.protocol.ledger_messages import ComputeSpec, LedgerEntry, RegisterNode
from swarmnode.protocol.messages import CheckpointHead, CheckpointManifest, ShardHave, Verdict, VerdictBatch
from tests.conformance.keys import NOW_MS, RUN, vector_identity

Vector = dict[str, Any]
TRAINER, OTHER = vector_identity(1), vector_identity(2)


def _h(data: bytes) -> str:
    return "0x" + data.hex()


def _case(name: str, kind: str, inp: dict[str, Any], check: Any) -> Vector:
    return {"name": name, "kind": kind, "input": inp, "expect": check(inp)}


def dht_key_cases() -> Iterator[Vector]:
    for role in ("trainer", "relay", "worker", "validator"):
        yield _case(f"dht-key/role-{role}", "dht_key", {"run": RUN, "role": role}, check_dht_key)
    for version in (0, 1, 2**64 - 1):
        yield _case(
            f"dht-key/checkpoint-{version}", "dht_key", {"run": RUN, "version": version}, check_dht_key
        )
    bad = [
        ("role-bootstrap", {"run": RUN, "role": "bootstrap"}),
        ("role-empty", {"run": RUN, "role": ""}),
        ("run-uppercase", {"run": "Run", "role": "relay"}),
        ("run-empty", {"run": "", "role": "relay"}),
        ("run-too-long", {"run": "a" * 65, "role": "relay"}),
        ("run-slash", {"run": "a/b", "role": "relay"}),
        ("version-negative", {"run": RUN, "version": -1}),
        ("version-over-u64", {"run": RUN, "version": 2**64}),
    ]
    for name, inp in bad:
        yield _case(f"dht-key/invalid-{name}", "dht_key", inp, check_dht_key)


def _record(
    identity: Any = TRAINER, *, run: str = RUN, trainer: bytes | None = None, created: int = NOW_MS
) -> bytes:
    descriptor = dev_run_descriptor(
        run, trainer if trainer is not None else identity.address, created_ms=created
    )
    return seal(identity, descriptor, run=run, seq=1, ts=created)


def _with_co_trainers(co_trainers: tuple[bytes, ...]) -> bytes:
    """A lead-signed run record whose co-trainer list breaks the descriptor rule."""
    descriptor = dataclasses.replace(
        dev_run_descriptor(RUN, TRAINER.address, created_ms=NOW_MS), co_trainers=co_trainers
    )
    return seal(TRAINER, descriptor, run=RUN, seq=1, ts=NOW_MS)


def run_record_cases() -> Iterator[Vector]:
    key = run_record_key(RUN)
    good = _record()
    yield _case("run-record/valid", "run_record", {"key": key, "value": _h(good)}, check_run_record)
    yield _case(
        "run-record/valid-pinned",
        "run_record",
        {"key": key, "value": _h(good), "trainer": _h(TRAINER.address)},
        check_run_record,
    )
    yield _case(
        "run-record/valid-old",
        "run_record",
        {"key": key, "value": _h(_record(created=1_000))},
        check_run_record,
    )
    envelope = decode(Envelope, good)
    tampered = encode(dataclasses.replace(envelope, body=envelope.body[:-1] + bytes([envelope.body[-1] ^ 1])))
    have = seal(
        TRAINER,
        ShardHave(run=RUN, version=0, merkle_root=bytes(32), bitfield=b"", endpoint=""),
        run=RUN,
        seq=1,
        ts=NOW_MS,
    )
    invalid = [
        ("pinned-to-other", {"key": key, "value": _h(good), "trainer": _h(OTHER.address)}),
        ("signed-by-other", {"key": key, "value": _h(_record(OTHER, trainer=TRAINER.address))}),
        ("wrong-key-run", {"key": run_record_key("other-run"), "value": _h(good)}),
        (
            "descriptor-for-other-run",
            {
                "key": key,
                "value": _h(
                    seal(
                        TRAINER,
                        dev_run_descriptor("other-run", TRAINER.address, created_ms=NOW_MS),
                        run=RUN,
                        seq=1,
                        ts=NOW_MS,
                    )
                ),
            },
        ),
        ("co-trainer-repeated", {"key": key, "value": _h(_with_co_trainers((OTHER.address, OTHER.address)))}),
        ("co-trainer-is-lead", {"key": key, "value": _h(_with_co_trainers((TRAINER.address,)))}),
        ("not-a-descriptor", {"key": key, "value": _h(have)}),
        ("tampered-body", {"key": key, "value": _h(tampered)}),
        ("truncated", {"key": key, "value": _h(good[:-1])}),
        ("garbage", {"key": key, "value": _h(b"\x00" * 40)}),
        ("non-namespaced-key", {"key": "plain-key", "value": _h(good)}),
        ("ipns-key", {"key": f"/ipns/{RUN}", "value": _h(good)}),
    ]
    for name, inp in invalid:
        yield _case(f"run-record/invalid-{name}", "run_record", inp, check_run_record)


def gossip_topic_cases() -> Iterator[Vector]:
    for kind in ("checkpoints", "shards", "verdicts", "ledger"):
        yield _case(f"gossip-topic/{kind}", "gossip_topic", {"run": RUN, "kind": kind}, check_gossip_topic)
    yield _case(
        "gossip-topic/invalid-kind", "gossip_topic", {"run": RUN, "kind": "rollouts"}, check_gossip_topic
    )


def gossip_message_cases() -> Iterator[Vector]:
    sender = vector_identity(3)
    have = ShardHave(
        run=RUN, version=4, merkle_root=bytes(range(32)), bitfield=b"\x0f", endpoint="http://r:8080"
    )
    good = seal(sender, have, run=RUN, seq=10, ts=NOW_MS)

    def case(name: str, kind: str, data: bytes, **extra: Any) -> Vector:
        inp = {"run": RUN, "kind": kind, "now_ms": NOW_MS, "data": _h(data), **extra}
        return _case(f"gossip-message/{name}", "gossip_message", inp, check_gossip_message_case)

    yield case("shard-have", "shards", good)
    verdict = Verdict(
        run=RUN,
        submission_digest=bytes(32),
        worker=bytes(20),
        step=1,
        checkpoint_version=4,
        accepted=True,
        reason_code=0,
        detail="",
        failing_chunks=(),
        tokens=100,
        mean_exp_mismatches=0.5,
        mean_mant_err=1.0,
    )
    # `verdicts` carries batches, judged whole (spec/gossip.md, Verdict batches)
    second = dataclasses.replace(verdict, submission_digest=bytes(range(32)), accepted=False, reason_code=605,
                                 failing_chunks=(3, 7))
    batch = VerdictBatch(RUN, sender.address, (verdict, second))
    foreign = dataclasses.replace(second, run="other-run")
    bad_batches = [
        ("item-of-another-run", sender, dataclasses.replace(batch, verdicts=(verdict, foreign))),
        ("repeated-submission", sender, dataclasses.replace(batch, verdicts=(verdict, verdict))),
        ("empty", sender, dataclasses.replace(batch, verdicts=())),
        ("of-another-validator", OTHER, batch),
        ("names-another-run", sender, dataclasses.replace(batch, run="other-run")),
    ]
    yield case("verdict-batch", "verdicts", seal(sender, batch, run=RUN, seq=11, ts=NOW_MS))
    for seq, (name, signer, bad) in enumerate(bad_batches, 17):
        data = seal(signer, bad, run=RUN, seq=seq, ts=NOW_MS)
        yield case(f"invalid-verdict-batch-{name}", "verdicts", data)
    single = seal(sender, verdict, run=RUN, seq=22, ts=NOW_MS)
    yield case("invalid-single-verdict-on-verdicts", "verdicts", single)
    manifest = CheckpointManifest(
        run=RUN,
        version=4,
        parent_version=3,
        model_config_hash=bytes(32),
        total_size=0,
        shards=(),
        merkle_root=bytes(32),
        created_ms=NOW_MS,
    )
    head = CheckpointHead(
        run=RUN,
        version=4,
        parent_version=3,
        model_config_hash=bytes(32),
        total_size=1 << 40,
        shard_count=1300,
        merkle_root=bytes(range(32)),
        manifest_digest=bytes(range(32, 64)),
        created_ms=NOW_MS,
    )
    yield case("checkpoint-head", "checkpoints", seal(TRAINER, head, run=RUN, seq=12, ts=NOW_MS))
    envelope = decode(Envelope, good)
    yield case("invalid-oversized-for-topic", "shards", b"\x00" * 5000)
    # a manifest travels over HTTP (spec/shards.md, Checkpoint heads): never on `checkpoints`
    whole = seal(TRAINER, manifest, run=RUN, seq=16, ts=NOW_MS)
    yield case("invalid-manifest-on-checkpoints", "checkpoints", whole)
    yield case("invalid-verdict-on-shards", "shards", seal(sender, verdict, run=RUN, seq=13, ts=NOW_MS))
    yield case("invalid-shard-have-on-verdicts", "verdicts", good)
    yield case("invalid-garbage", "shards", b"\xc1")
    yield case("invalid-trailing-bytes", "shards", good + b"\x00")
    yield case("invalid-forged-sender", "shards", encode(dataclasses.replace(envelope, sender=OTHER.address)))
    yield case(
        "invalid-tampered-body",
        "shards",
        encode(dataclasses.replace(envelope, body=envelope.body[:-1] + bytes([envelope.body[-1] ^ 1]))),
    )
    yield case(
        "ignore-wrong-run",
        "shards",
        seal(sender, dataclasses.replace(have, run="other-run"), run="other-run", seq=14, ts=NOW_MS),
    )
    yield case("ignore-clock-skew", "shards", seal(sender, have, run=RUN, seq=15, ts=NOW_MS - 10 * 60 * 1000))
    yield case("ignore-replay", "shards", good, accepted_before=[_h(good)])


def gossip_authority_cases() -> Iterator[Vector]:
    """Who may sign on each topic (spec/gossip.md, Authority): the pure predicate under a given view."""
    validator, node, stranger, gone = (vector_identity(i) for i in (4, 5, 6, 7))
    ledger_id = "vector-ledger"
    ledger = {
        "validators": [_h(validator.address)],
        "registered": [_h(validator.address), _h(node.address)],
        "former": {_h(gone.address): NOW_MS - 60_000},
        "as_of_ms": NOW_MS,
        "ledger_id": ledger_id,
    }
    full = {"trainer": _h(TRAINER.address), "ledger": ledger}
    open_mode = {"trainer": _h(TRAINER.address), "ledger": None}
    evm = {"trainer": _h(TRAINER.address), "ledger": {**ledger, "ledger_id": None}}
    old, fresh = NOW_MS - VIEW_LAG_MS - 1, NOW_MS - VIEW_LAG_MS + 1

    def op(author: Any, ledger_name: str = ledger_id) -> bytes:
        register = RegisterNode(role="relay", compute=ComputeSpec("cpu", 1, 1, 0), peer_id=author.peer_id)
        return sign_operation(author, register, ledger_id=ledger_name, nonce=1, ts_ms=NOW_MS)

    def entry(data: bytes) -> str:
        return _h(encode(LedgerEntry(index=3, prev_hash=bytes(32), epoch=0, op=data)))

    def case(name: str, kind: str, sender: Any, view: dict[str, Any], ts: int = old, **extra: Any) -> Vector:
        inp = {"kind": kind, "sender": _h(sender.address), "ts_ms": ts, "view": view, **extra}
        return _case(f"gossip-authority/{name}", "gossip_authority", inp, check_gossip_authority)

    yield case("manifest-from-trainer", "checkpoints", TRAINER, full)
    yield case("verdict-from-eligible-validator", "verdicts", validator, full)
    yield case("verdict-open-mode", "verdicts", stranger, open_mode)
    yield case("have-from-registered", "shards", node, full)
    yield case("have-open-mode", "shards", stranger, open_mode)
    yield case("ledger-entry-from-registered", "ledger", node, full, entry=entry(op(node)))
    yield case("invalid-manifest-from-other", "checkpoints", OTHER, full)
    yield case("ignore-manifest-before-descriptor", "checkpoints", TRAINER, {"trainer": None, "ledger": None})
    yield case("invalid-verdict-from-registered-non-validator", "verdicts", node, full)
    yield case("invalid-verdict-from-stranger", "verdicts", stranger, full)
    yield case("ignore-verdict-signed-after-view", "verdicts", stranger, full, ts=fresh)
    yield case("ignore-verdict-from-former-validator", "verdicts", gone, full)
    yield case("invalid-have-from-stranger", "shards", stranger, full)
    yield case("ignore-ledger-open-mode", "ledger", node, open_mode, entry=entry(op(node)))
    yield case("ignore-ledger-without-signed-log", "ledger", node, evm, entry=entry(op(node)))
    yield case("invalid-ledger-from-stranger", "ledger", stranger, full, entry=entry(op(stranger)))
    yield case("invalid-ledger-entry-junk-op", "ledger", node, full, entry=entry(b"\x00" * 64))
    yield case("invalid-ledger-entry-other-ledger", "ledger", node, full, entry=entry(op(node, "other")))
    yield case("invalid-ledger-entry-undecodable", "ledger", node, full, entry=_h(b"\xc1"))
    yield case("ignore-unknown-topic", "rollouts", node, full)


SUITES = {
    "p2p-dht-keys": dht_key_cases,
    "p2p-run-records": run_record_cases,
    "p2p-gossip-topics": gossip_topic_cases,
    "p2p-gossip-messages": gossip_message_cases,
    "p2p-gossip-authority": gossip_authority_cases,
}
