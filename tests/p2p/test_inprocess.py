"""Fast tests: a few real hosts in one trio.run, talking over loopback TCP with Noise and yamux."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.tools.anyio_service import background_trio_service

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.p2p.endpoints import HELLO
from swarmnode.node.p2p.host import build_host, listen_addrs, parse_peer_addr
from swarmnode.node.p2p.records import role_key, run_record_key
from swarmnode.node.p2p.reqresp import PeerUnreachable
from swarmnode.node.roles.probe import Probe, ProbePlan
from swarmnode.protocol import ids
from swarmnode.protocol.envelope import seal
from swarmnode.protocol.messages import ShardHave
from tests.p2p.adversary import forged_envelopes
from tests.p2p.helpers import RUN, swarm, wait_until

pytestmark = pytest.mark.timeout(120)


def test_host_offers_only_noise_and_yamux() -> None:
    identity = NodeIdentity(secrets.token_bytes(32))
    host = build_host(identity, ["/ip4/127.0.0.1/tcp/0"])
    upgrader = host.get_network().upgrader  # type: ignore[attr-defined]
    assert list(upgrader.security_multistream.transports) == [NOISE_PROTOCOL_ID]
    assert [str(p) for p in upgrader.muxer_multistream.transports] == ["/yamux/1.0.0"]
    assert str(host.get_id()) == identity.peer_id


def test_discovery_gossip_and_hello(tmp_path: Path) -> None:
    """Bootstrap, trainer, relay, worker, validator: everyone finds what it needs; gossip reaches all."""

    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap", "trainer", "relay", "worker", "validator"]) as nodes:

            def discovered() -> bool:
                return all(all(n.net.finder.found(r) for r in n.role.NEEDS) for n in nodes)  # type: ignore[union-attr]

            await wait_until(discovered, timeout=30)
            for node in nodes[1:]:
                assert node.net is not None
                if node.role.ROLE != "trainer":
                    await wait_until(lambda node=node: node.net.run_record is not None, timeout=20)
            trainer, relay, worker, validator = (n.net for n in nodes[1:])
            assert worker is not None and relay is not None and validator is not None and trainer is not None
            assert [r.peer_id for r in worker.peers("relay")] == [relay.identity.peer_id]
            assert worker.peers("validator")[0].address == validator.identity.address
            assert (
                worker.run_record is not None
                and worker.run_record.descriptor.trainer == trainer.identity.address
            )

            # one message on shards reaches every subscriber of shards, once
            subscribers = [n for n in nodes if "shards" in n.role.SUBSCRIBES and n.net is not relay]
            await wait_until(lambda: relay.gossip.topic_peers("shards") >= len(subscribers), timeout=20)
            await relay.publish(
                "shards",
                ShardHave(
                    run=RUN, version=7, merkle_root=bytes(32), bitfield=b"\x01", endpoint="http://relay"
                ),
            )
            await wait_until(
                lambda: all(n.net.gossip.stats["shards"].delivered == 1 for n in subscribers), timeout=10
            )
            assert relay.gossip.stats["shards"].own == 1 and relay.gossip.stats["shards"].delivered == 0

            # hello from a worker to the relay, then an unreachable peer fails typed
            record = await worker.directory.exchange(relay.host.get_id())  # type: ignore[union-attr]
            assert record.role == "relay"
            ghost = NodeIdentity(secrets.token_bytes(32))
            with pytest.raises(PeerUnreachable):
                await worker.reqresp.request(ID.from_base58(ghost.peer_id), HELLO, worker.directory.hello)  # type: ignore[union-attr]

    trio.run(main)


def test_provider_lookup_is_deduplicated_and_includes_network(tmp_path: Path) -> None:
    """Two relays: each finds the other even though it holds a local record for the key itself."""

    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap", "relay", "relay", "worker"]) as nodes:
            relay_a, relay_b, worker = (n.net for n in nodes[1:])
            assert relay_a is not None and relay_b is not None and worker is not None
            await wait_until(lambda: len(worker.peers("relay")) == 2, timeout=30)
            key = role_key(RUN, "relay")
            found = await relay_a.discovery.find_providers(key)
            assert [str(p.peer_id) for p in found] == [relay_b.identity.peer_id]
            with_self = await relay_a.discovery.find_providers(key, include_self=True)
            assert len({str(p.peer_id) for p in with_self}) == len(with_self) == 2
            assert worker.discovery.stats["provider_duplicates_merged"] > 0  # py-libp2p returned duplicates

    trio.run(main)


def test_dht_refuses_values_outside_our_namespace(tmp_path: Path) -> None:
    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap", "trainer"]) as nodes:
            boot, trainer = nodes[0].net, nodes[1].net
            assert boot is not None and trainer is not None
            store = trainer.discovery.dht.value_store
            peer = boot.host.get_id()
            # a plain key, an IPNS-style key and a forged run record: all refused by the remote validator
            assert not await store._store_at_peer(peer, b"plain-key", b"value")
            assert not await store._store_at_peer(peer, b"/ipns/whatever", b"value")
            forged = forged_envelopes(RUN, trainer.identity, NodeIdentity(secrets.token_bytes(32)), 1)[0][1]
            # (py-libp2p sends its local record instead of `value` when it holds one: use a key nobody holds)
            assert not await store._store_at_peer(peer, run_record_key("other-run").encode(), forged)
            assert boot.discovery.dht.value_store.get(b"plain-key") is None
            assert boot.discovery.record_validator.rejected >= 1
            # the real record is there, and a local put of a bad value is refused before it leaves
            assert boot.discovery.dht.value_store.get(run_record_key(RUN).encode()) is not None
            with pytest.raises(ValueError):
                await trainer.discovery.put_run_record(RUN, forged)
            # provider keys that are not sha2-256 multihashes are not stored
            await trainer.discovery.providers._send_add_provider(peer, b"not-a-multihash")
            await wait_until(lambda: boot.discovery.providers.refused["bad_key"] >= 1, timeout=5)

    trio.run(main)


async def _adversary_pubsub(host):  # type: ignore[no-untyped-def]
    router = GossipSub(
        [TProtocol(PROTOCOL_ID_V11), TProtocol(PROTOCOL_ID)],
        6,
        4,
        12,
        heartbeat_interval=1,
        max_messages_per_topic_per_second=1e6,
        adaptive_gossip_enabled=False,
    )
    return router, Pubsub(host, router)


def test_forged_garbage_and_oversized_gossip_is_rejected_scored_and_banned(tmp_path: Path) -> None:
    """A peer without validators floods bad gossip: nothing is delivered or forwarded, and it is banned."""

    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap", "relay", "worker"]) as nodes:
            boot, relay, worker = (n.net for n in nodes)
            assert boot is not None and relay is not None and worker is not None
            await wait_until(lambda: worker.peers("relay") != [], timeout=30)
            me = NodeIdentity(secrets.token_bytes(32))
            host = build_host(me, ["/ip4/127.0.0.1/tcp/0"])
            async with host.run(listen_addrs(["/ip4/127.0.0.1/tcp/0"])):
                router, pubsub = await _adversary_pubsub(host)
                async with background_trio_service(pubsub), background_trio_service(router):
                    await pubsub.wait_until_ready()
                    target = parse_peer_addr(nodes[1].net.host.get_addrs()[0].__str__())  # type: ignore[union-attr]
                    await host.connect(target)
                    topic = ids.topic(RUN, "shards")
                    await pubsub.wait_for_subscription(target.peer_id, topic, timeout=10)
                    await pubsub.publish(topic, os.urandom(100))
                    await pubsub.publish(topic, os.urandom(6000))
                    for _kind, data in forged_envelopes(RUN, me, NodeIdentity(secrets.token_bytes(32)), 2):
                        await pubsub.publish(topic, data)
                    # banned: the relay closes the connection, and every reconnect (libp2p pubsub redials)
                    await wait_until(lambda: relay.guard.disconnects >= 1, timeout=10)
                    valid = seal(
                        me,
                        ShardHave(run=RUN, version=1, merkle_root=bytes(32), bitfield=b"", endpoint=""),
                        run=RUN,
                        seq=1,
                        ts=wall_ms(),
                    )
                    await pubsub.publish(topic, valid)  # even a valid message from a banned peer goes nowhere
                    await trio.sleep(1)
            stats = relay.gossip.stats["shards"]
            malformed = (
                stats.rejected["UNDECODABLE"] + stats.rejected["TRAILING_BYTES"]
            )  # random bytes: either
            assert malformed == 1 and stats.rejected["OVERSIZED"] == 1
            assert stats.rejected["BAD_SIGNATURE"] >= 3
            assert stats.delivered == 0
            assert worker.gossip.stats["shards"].accepted == 0  # nothing was forwarded
            assert relay.guard.statistics()["banned_peers"] == 1
            assert relay.guard.is_banned(ID.from_base58(me.peer_id))
            assert relay.gossip.pubsub.is_peer_blacklisted(ID.from_base58(me.peer_id))

    trio.run(main)


def test_bad_request_frames_are_charged_and_node_keeps_serving(tmp_path: Path) -> None:
    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap", "relay"]) as nodes:
            relay = nodes[1].net
            assert relay is not None
            me = NodeIdentity(secrets.token_bytes(32))
            host = build_host(me, ["/ip4/127.0.0.1/tcp/0"])
            async with host.run(listen_addrs(["/ip4/127.0.0.1/tcp/0"])):
                target = parse_peer_addr(str(relay.host.get_addrs()[0]))
                await host.connect(target)
                stream = await host.new_stream(target.peer_id, [TProtocol(ids.HELLO)])
                await stream.write(b"\xff\xff\xff\xff")  # claims a 4 GiB frame
                with trio.move_on_after(5):
                    try:
                        await stream.read(1)
                    except Exception:  # noqa: BLE001 - the reset surfaces as any stream error here
                        pass
            stats = relay.reqresp.statistics()
            assert stats[f"{ids.HELLO}:bad_frame"] == 1
            assert relay.guard.scores.score(me.peer_id, trio.current_time()) < 0
            # an honest peer is still served
            boot = nodes[0].net
            assert boot is not None
            pong_rtt = await nodes[0].liveness.ping(relay.host.get_id())  # type: ignore[attr-defined]
            assert pong_rtt < 5

    trio.run(main)


def test_probe_node_times_lookups_and_publishes(tmp_path: Path) -> None:
    async def main() -> None:
        plan = ProbePlan(rate=20, count=5, wait_subscribers=2, lookups=1, linger=0.5)
        probe = Probe(plan)
        async with swarm(
            tmp_path, ["bootstrap", "relay", "worker", "probe"], services={3: probe}, record=True
        ) as nodes:
            with trio.fail_after(30):
                await probe.probe_work.done.wait()
            await wait_until(lambda: nodes[2].net.gossip.stats["shards"].delivered == 5, timeout=10)  # type: ignore[union-attr]
            report = probe.probe_work.report
            assert [i for i, _ in report.published] == list(range(5))
            assert report.lookup_found["relay"] == [[nodes[1].identity.peer_id]]
            assert report.lookup_found["trainer"] == [[]]
            lines = (nodes[2].config.data_dir / "deliveries.jsonl").read_text().splitlines()
            assert len(lines) == 5

    trio.run(main)
