"""Topic authority: the pure predicate, the message rule with it, the validator hook, and real gossip.

A message whose signer has no authority for its topic is refused before it is forwarded: a checkpoint
head from anyone but the run's trainer, a verdict from anyone but an eligible validator, a ledger entry from
an unregistered node or with a bad operation (spec/gossip.md, Authority).
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger.log import sign_operation
from swarmnode.ledger.types import Params
from swarmnode.node.p2p.clock import SeqCounter, wall_ms
from swarmnode.node.p2p.gossip import (
    DEFAULT_POLICIES,
    FORMER_GRACE_MS,
    VIEW_LAG_MS,
    AuthorityView,
    Gossip,
    LedgerView,
    SerialPubsub,
    advance_ledger_view,
    authorise,
    check_gossip_message,
)
from swarmnode.node.p2p.host import build_host, listen_addrs, parse_peer_addr
from swarmnode.node.p2p.peers import PeerActivity
from swarmnode.node.p2p.scoring import PeerGuard, ScoreParams
from swarmnode.node.runtime import read_ledger_view
from swarmnode.protocol import ids
from swarmnode.protocol.envelope import seal
from swarmnode.protocol.errors import Ignore, Reject
from swarmnode.protocol.ledger_messages import ComputeSpec, LedgerEntry, RegisterNode
from swarmnode.protocol.messages import CheckpointHead, CheckpointManifest, ShardInfo, Verdict, VerdictBatch
from swarmnode.protocol.shards import manifest_head
from swarmnode.testing.ledger import SignedHarness, register_run, slash
from tests.p2p.helpers import RUN, swarm, wait_until

NOW = 1_800_000_000_000
LEDGER_ID = "test-ledger"
TRAINER, VALIDATOR, NODE, STRANGER = (NodeIdentity(secrets.token_bytes(32)) for _ in range(4))
KINDS = ("checkpoints", "shards", "verdicts", "ledger")
addresses = st.binary(min_size=20, max_size=20)


def ledger_view(*, former: dict[bytes, int] | None = None, as_of: int = NOW) -> LedgerView:
    return LedgerView(
        validators=frozenset({VALIDATOR.address}),
        registered=frozenset({VALIDATOR.address, NODE.address, TRAINER.address}),
        former=former or {},
        as_of_ms=as_of,
        ledger_id=LEDGER_ID,
    )


FULL = AuthorityView(trainer=TRAINER.address, ledger=ledger_view())
OLD = NOW - VIEW_LAG_MS - 1  # signed long enough before the view was read to be judged by it


def verdict_of(fn, *args) -> str:  # type: ignore[no-untyped-def]
    """'accept', or 'reject NAME' / 'ignore NAME' of the typed error `fn(*args)` raised."""
    try:
        fn(*args)
    except Reject as exc:
        return f"reject {exc.reason.name}"
    except Ignore as exc:
        return f"ignore {exc.reason.name}"
    return "accept"


# --- the pure predicate --------------------------------------------------------------------------


@given(sender=addresses, ts=st.integers(0, 2**63))
def test_only_the_runs_trainer_signs_manifests(sender: bytes, ts: int) -> None:
    assert verdict_of(authorise, "checkpoints", TRAINER.address, ts, FULL) == "accept"
    expected = "accept" if sender == TRAINER.address else "reject UNAUTHORISED"
    assert verdict_of(authorise, "checkpoints", sender, ts, FULL) == expected
    # before the run descriptor is known nobody can be judged: not forwarded, nobody charged
    assert verdict_of(authorise, "checkpoints", TRAINER.address, ts, AuthorityView()) == ("ignore NOT_FOR_US")


@given(sender=addresses, ts=st.integers(0, NOW + 10**6))
def test_ledger_sets_decide_verdicts_shards_and_entries(sender: bytes, ts: int) -> None:
    members = {"verdicts": {VALIDATOR.address}, "shards": FULL.ledger.registered}  # type: ignore[union-attr]
    members["ledger"] = members["shards"]
    for kind, allowed in members.items():
        got = verdict_of(authorise, kind, sender, ts, FULL)
        if sender in allowed:
            assert got == "accept"
        elif ts > NOW - VIEW_LAG_MS:
            assert got == "ignore NOT_FOR_US"  # our view may predate its registration
        else:
            assert got == "reject UNAUTHORISED"


def test_open_mode_without_a_ledger() -> None:
    view = AuthorityView(trainer=TRAINER.address)
    assert verdict_of(authorise, "verdicts", STRANGER.address, OLD, view) == "accept"
    assert verdict_of(authorise, "shards", STRANGER.address, OLD, view) == "accept"
    # nothing to judge ledger entries by: they are neither delivered nor forwarded
    assert verdict_of(authorise, "ledger", NODE.address, OLD, view) == "ignore NOT_FOR_US"
    evm = AuthorityView(ledger=dataclasses.replace(ledger_view(), ledger_id=None))
    assert verdict_of(authorise, "ledger", NODE.address, OLD, evm) == "ignore NOT_FOR_US"
    assert verdict_of(authorise, "rollouts", NODE.address, OLD, FULL) == "ignore NOT_FOR_US"


def test_a_signer_that_just_left_is_ignored_then_rejected() -> None:
    first = advance_ledger_view(
        None, validators=frozenset({VALIDATOR.address}), registered=frozenset({VALIDATOR.address}), now_ms=NOW
    )
    gone = advance_ledger_view(first, validators=frozenset(), registered=frozenset(), now_ms=NOW + 10_000)
    assert dict(gone.former) == {VALIDATOR.address: NOW + 10_000}
    view = AuthorityView(ledger=gone)
    assert verdict_of(authorise, "verdicts", VALIDATOR.address, OLD, view) == "ignore NOT_FOR_US"
    later = advance_ledger_view(
        gone, validators=frozenset(), registered=frozenset(), now_ms=NOW + 10_000 + FORMER_GRACE_MS
    )
    assert dict(later.former) == {}
    assert verdict_of(authorise, "verdicts", VALIDATOR.address, OLD, AuthorityView(ledger=later)) == (
        "reject UNAUTHORISED"
    )
    back = advance_ledger_view(
        gone, validators=frozenset({VALIDATOR.address}), registered=frozenset(), now_ms=NOW + 20_000
    )
    assert VALIDATOR.address not in back.former  # a member again


@settings(max_examples=50)
@given(rounds=st.lists(st.frozensets(st.sampled_from([a.address for a in (TRAINER, VALIDATOR, NODE)]))))
def test_former_is_bounded_by_the_ledger_and_disjoint_from_members(rounds: list[frozenset[bytes]]) -> None:
    view = None
    for i, members in enumerate(rounds):
        view = advance_ledger_view(view, validators=members, registered=members, now_ms=NOW + i * 60_000)
        assert not set(view.former) & members
        assert all(NOW + i * 60_000 - left < FORMER_GRACE_MS for left in view.former.values())


# --- the message rule with authority -------------------------------------------------------------


def manifest(shards: int = 0) -> CheckpointManifest:
    infos = tuple(ShardInfo(name=f"s{i:05d}.safetensors", size=1, sha256=bytes(32)) for i in range(shards))
    return CheckpointManifest(
        run=RUN,
        version=1,
        parent_version=0,
        model_config_hash=bytes(32),
        total_size=shards,
        shards=infos,
        merkle_root=bytes(32),
        created_ms=NOW,
    )


def head() -> CheckpointHead:
    return manifest_head(manifest(1))


def verdict() -> Verdict:
    return Verdict(
        run=RUN,
        submission_digest=bytes(32),
        worker=bytes(20),
        step=0,
        checkpoint_version=0,
        accepted=True,
        reason_code=0,
        detail="",
        failing_chunks=(),
        tokens=0,
        mean_exp_mismatches=0.0,
        mean_mant_err=0.0,
    )


def entry(op: bytes) -> LedgerEntry:
    return LedgerEntry(index=0, prev_hash=bytes(32), epoch=0, op=op)


def register_op(author: NodeIdentity = NODE) -> bytes:
    op = RegisterNode(role="relay", compute=ComputeSpec("cpu", 1, 1, 0), peer_id=author.peer_id)
    return sign_operation(author, op, ledger_id=LEDGER_ID, nonce=1, ts_ms=NOW)


def rule(kind: str, data: bytes, view: AuthorityView = FULL) -> str:
    def check() -> None:
        check_gossip_message(DEFAULT_POLICIES[kind], data, run=RUN, now_ms=NOW, replay=None, authority=view)

    return verdict_of(check)


def test_a_head_from_anyone_but_the_trainer_is_refused() -> None:
    forged = seal(STRANGER, head(), run=RUN, seq=1, ts=OLD)
    assert rule("checkpoints", forged) == "reject UNAUTHORISED"
    assert rule("checkpoints", seal(TRAINER, head(), run=RUN, seq=1, ts=NOW)) == "accept"
    assert rule("checkpoints", forged, AuthorityView()) == "ignore NOT_FOR_US"
    # claiming the trainer's address without its key fails the signature that follows
    claimed = seal(STRANGER, head(), run=RUN, seq=1, ts=NOW)
    claimed = claimed.replace(STRANGER.address, TRAINER.address)
    assert rule("checkpoints", claimed) == "reject BAD_SIGNATURE"


def test_checkpoints_carry_heads_never_whole_manifests() -> None:
    """A manifest is fetched over HTTP: on gossip even the trainer's is refused, a big one unread."""
    big = seal(TRAINER, manifest(8192), run=RUN, seq=1, ts=NOW)
    assert len(big) > 550_000 and rule("checkpoints", big) == "reject OVERSIZED"
    assert rule("checkpoints", seal(TRAINER, manifest(1), run=RUN, seq=2, ts=NOW)) == "reject UNKNOWN_TYPE"


def test_header_checks_keep_their_verdicts_before_authority() -> None:
    other_run = seal(STRANGER, dataclasses.replace(head(), run="other"), run="other", seq=1, ts=OLD)
    assert rule("checkpoints", other_run) == "ignore WRONG_RUN"
    assert rule("checkpoints", seal(STRANGER, verdict(), run=RUN, seq=1, ts=OLD)) == "reject UNKNOWN_TYPE"
    assert rule("checkpoints", b"\xc1") == "reject UNDECODABLE"


def test_verdicts_only_from_eligible_validators() -> None:
    def batch(signer: NodeIdentity) -> VerdictBatch:  # `verdicts` carries batches (spec/gossip.md)
        return VerdictBatch(RUN, signer.address, (verdict(),))

    assert rule("verdicts", seal(VALIDATOR, batch(VALIDATOR), run=RUN, seq=1, ts=NOW)) == "accept"
    assert rule("verdicts", seal(NODE, batch(NODE), run=RUN, seq=1, ts=NOW - 4 * 60_000)) == (
        "reject UNAUTHORISED"
    )


def test_ledger_entries_from_registered_nodes_and_well_formed() -> None:
    good = seal(NODE, entry(register_op()), run=RUN, seq=1, ts=NOW)
    assert rule("ledger", good) == "accept"
    assert rule("ledger", seal(STRANGER, entry(register_op()), run=RUN, seq=1, ts=OLD)) == (
        "reject UNAUTHORISED"
    )
    junk = seal(NODE, entry(secrets.token_bytes(900_000)), run=RUN, seq=2, ts=NOW)
    assert rule("ledger", junk) == "reject MALFORMED_OPERATION"
    wrong_ledger = sign_operation(
        NODE,
        RegisterNode("relay", ComputeSpec("cpu", 1, 1, 0), NODE.peer_id),
        ledger_id="other",
        nonce=1,
        ts_ms=NOW,
    )
    assert rule("ledger", seal(NODE, entry(wrong_ledger), run=RUN, seq=3, ts=NOW)) == "reject WRONG_LEDGER"
    forged_op = register_op()[:-3] + bytes(3)
    assert rule("ledger", seal(NODE, entry(forged_op), run=RUN, seq=4, ts=NOW)) in (
        "reject BAD_LEDGER_SIGNATURE",
        "reject MALFORMED_OPERATION",
    )


# --- the validator hook charges the forwarder ------------------------------------------------------


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_unauthorised_messages_charge_the_forwarder_until_banned() -> None:
    me = NodeIdentity(secrets.token_bytes(32))
    host = build_host(me, ["/ip4/127.0.0.1/tcp/0"])
    clock = Clock()
    guard = PeerGuard(host, clock=clock)
    gossip = Gossip(
        host,
        me,
        RUN,
        SeqCounter(),
        guard,
        PeerActivity(clock),
        subscribe=KINDS,
        now_ms=lambda: NOW,
        clock=clock,
    )
    forwarder = ID.from_base58(NodeIdentity(secrets.token_bytes(32)).peer_id)

    def push(kind: str, data: bytes) -> bool:
        return gossip._validate(kind, forwarder, rpc_pb2.Message(data=data, topicIDs=[ids.topic(RUN, kind)]))

    assert not push("checkpoints", seal(TRAINER, head(), run=RUN, seq=1, ts=NOW))  # no descriptor yet
    assert gossip.stats["checkpoints"].ignored["NOT_FOR_US"] == 1
    assert guard.scores.score(str(forwarder), 0.0) == 0.0
    gossip.set_trainer(TRAINER.address)
    assert push("checkpoints", seal(TRAINER, head(), run=RUN, seq=2, ts=NOW))
    penalty = ScoreParams().unauthorised_penalty
    threshold = -ScoreParams().ban_threshold
    for seq in range(int(threshold / penalty)):
        assert not push("checkpoints", seal(STRANGER, head(), run=RUN, seq=10 + seq, ts=NOW))
    assert gossip.stats["checkpoints"].rejected["UNAUTHORISED"] == int(threshold / penalty)
    assert guard.is_banned(forwarder)
    gossip.set_ledger_view(ledger_view(as_of=NOW))
    assert push("verdicts", seal(VALIDATOR, verdict(), run=RUN, seq=3, ts=NOW)) is False  # banned now


# --- real gossip: a forged-signer head never reaches a third node ---------------------------------------


async def _plain_pubsub(host):  # type: ignore[no-untyped-def]
    """A pubsub without our validators: it forwards whatever it is asked to publish."""
    router = GossipSub(
        [TProtocol(PROTOCOL_ID_V11), TProtocol(PROTOCOL_ID)],
        6,
        4,
        12,
        heartbeat_interval=1,
        max_messages_per_topic_per_second=1e6,
        adaptive_gossip_enabled=False,
    )
    return router, SerialPubsub(host, router)  # py-libp2p's own Pubsub may corrupt its large writes


@pytest.mark.timeout(120)
def test_forged_head_and_ledger_junk_are_not_forwarded(tmp_path: Path) -> None:
    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap", "trainer", "relay", "worker"]) as nodes:
            trainer, relay, worker = nodes[1], nodes[2].net, nodes[3].net
            assert relay is not None and worker is not None
            await wait_until(
                lambda: relay.run_record is not None and worker.run_record is not None, timeout=30
            )
            assert relay.gossip.authority.trainer == trainer.identity.address
            await wait_until(lambda: worker.gossip.topic_peers("checkpoints") >= 1, timeout=20)
            attacker = NodeIdentity(secrets.token_bytes(32))
            host = build_host(attacker, ["/ip4/127.0.0.1/tcp/0"])
            async with host.run(listen_addrs(["/ip4/127.0.0.1/tcp/0"])):
                router, pubsub = await _plain_pubsub(host)
                async with background_trio_service(pubsub), background_trio_service(router):
                    await pubsub.wait_until_ready()
                    target = parse_peer_addr(str(relay.host.get_addrs()[0]))
                    await host.connect(target)
                    checkpoints, ledger = ids.topic(RUN, "checkpoints"), ids.topic(RUN, "ledger")
                    await pubsub.wait_for_subscription(target.peer_id, checkpoints, timeout=10)
                    await pubsub.publish(checkpoints, seal(attacker, head(), run=RUN, seq=1, ts=wall_ms()))
                    junk = entry(secrets.token_bytes(100_000))
                    await pubsub.publish(ledger, seal(attacker, junk, run=RUN, seq=2, ts=wall_ms()))
                    # control: the same path carries an authentic head of the trainer to the worker
                    real = seal(trainer.identity, head(), run=RUN, seq=wall_ms() * 1000, ts=wall_ms())
                    await pubsub.publish(checkpoints, real)
                    await wait_until(lambda: worker.gossip.stats["checkpoints"].delivered == 1, timeout=20)
                    await wait_until(
                        lambda: relay.gossip.stats["ledger"].ignored["NOT_FOR_US"] == 1, timeout=10
                    )
            relay_stats = relay.gossip.stats["checkpoints"]
            assert relay_stats.rejected["UNAUTHORISED"] == 1 and relay_stats.accepted == 1
            assert relay.guard.scores.score(attacker.peer_id, trio.current_time()) < 0
            for node in nodes:
                assert node.net is not None
                assert node.net.gossip.stats["checkpoints"].accepted <= 1  # only the trainer's, anywhere
                assert node.net.gossip.stats["ledger"].accepted == 0

    trio.run(main)


# --- the runtime's view of a real signed log -------------------------------------------------------------


LOG_PARAMS = Params(min_stake_per_unit_gwei=10, unbonding_delay_epochs=1, slash_gwei=5, ejection_threshold=1)


def registered_log(tmp_path: Path, *roles: str) -> tuple[SignedHarness, list[NodeIdentity]]:
    """A real signed log with one fresh identity registered per role (none staked yet)."""
    harness = SignedHarness.create(tmp_path, LOG_PARAMS, ledger_id=LEDGER_ID)
    identities = [NodeIdentity(secrets.token_bytes(32)) for _ in roles]
    for identity, role in zip(identities, roles, strict=True):
        harness.ledger.register(identity, role, ComputeSpec("cpu", 1, 1, 0), identity.peer_id)
    return harness, identities


def test_the_ledger_view_is_read_from_a_real_signed_log(tmp_path: Path) -> None:
    harness, (staked, unstaked, worker) = registered_log(tmp_path, "validator", "validator", "worker")
    log = harness.ledger
    log.deposit(staked, 10)
    log.deposit(worker, 10)
    view = read_ledger_view(log, None, NOW)
    assert view.validators == {staked.address}  # registered as validator *and* eligible
    assert view.registered == {staked.address, unstaked.address, worker.address}
    assert view.ledger_id == LEDGER_ID and view.as_of_ms == NOW and not view.former
    authority = AuthorityView(ledger=view)
    assert verdict_of(authorise, "verdicts", staked.address, OLD, authority) == "accept"
    assert verdict_of(authorise, "verdicts", unstaked.address, OLD, authority) == "reject UNAUTHORISED"
    assert verdict_of(authorise, "verdicts", worker.address, OLD, authority) == "reject UNAUTHORISED"
    # a slash that ejects the worker takes it out of `registered`, into `former` for the grace period
    owner = NodeIdentity(secrets.token_bytes(32))
    log.register(owner, "trainer", ComputeSpec("cpu", 1, 1, 0), owner.peer_id)
    log.deposit(owner, 10)
    log.register_run(owner, register_run("run-1", (staked,), window=0))
    log.slash(staked, slash(worker, LOG_PARAMS.slash_gwei))
    log.finalize_slash(staked, 0)  # a window of 0: final at once
    later = read_ledger_view(log, view, NOW + 1000)
    assert worker.address not in later.registered and later.former == {worker.address: NOW + 1000}
    assert verdict_of(authorise, "shards", worker.address, OLD, AuthorityView(ledger=later)) == (
        "ignore NOT_FOR_US"
    )
    harness.close()


def test_verdicts_are_scoped_to_the_runs_validator_set(tmp_path: Path) -> None:
    """Issue #31: a staked validator outside a run forged 16 batches of 256 accepting verdicts for made-up
    workers, and every honest worker's pacer counted 4,097 workers. Once the run is on the ledger, only its
    own validators may sign its verdicts; one outside is Ignored for the grace period, then Rejected."""
    harness, (inside, outside, owner) = registered_log(tmp_path, "validator", "validator", "trainer")
    log = harness.ledger
    for identity in (inside, outside, owner):
        log.deposit(identity, 10)
    before = read_ledger_view(log, None, NOW, "run-1")  # not registered yet: any eligible validator
    assert before.validators == {inside.address, outside.address}
    log.register_run(owner, register_run("run-1", (inside,), window=0))
    view = read_ledger_view(log, before, NOW + 1000, "run-1")
    assert view.validators == {inside.address}
    authority = AuthorityView(ledger=view)
    assert verdict_of(authorise, "verdicts", inside.address, OLD, authority) == "accept"
    assert verdict_of(authorise, "verdicts", outside.address, OLD, authority) == "ignore NOT_FOR_US"  # grace
    settled = read_ledger_view(log, view, NOW + 1000 + FORMER_GRACE_MS, "run-1")
    assert verdict_of(authorise, "verdicts", outside.address, OLD, AuthorityView(ledger=settled)) == (
        "reject UNAUTHORISED"
    )
    other_run = read_ledger_view(log, None, NOW, "run-2")  # another run's nodes: not registered, all eligible
    assert other_run.validators == {inside.address, outside.address}
    harness.close()
