"""The Prometheus endpoint renders a live node's status: peers, DHT, gossip in/out/rejected, drops."""

from __future__ import annotations

from pathlib import Path

import trio

from swarmnode.node.metrics import make_registry, serve_metrics
from swarmnode.protocol.messages import ShardHave
from tests.p2p.helpers import RUN, swarm, wait_until


async def http_get(port: int, path: str) -> tuple[str, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], body.decode()


def test_metrics_endpoint(tmp_path: Path) -> None:
    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap", "relay", "worker"]) as nodes:
            relay, worker = nodes[1], nodes[2]
            assert relay.net is not None and worker.net is not None
            await wait_until(lambda: relay.net.gossip.topic_peers("shards") >= 2, timeout=60)  # type: ignore[union-attr]
            have = ShardHave(run=RUN, version=1, merkle_root=bytes(32), bitfield=b"", endpoint="x")
            await relay.net.publish("shards", have)
            await wait_until(lambda: worker.net.gossip.stats["shards"].delivered == 1, timeout=30)  # type: ignore[union-attr]
            async with trio.open_nursery() as nursery:
                port = await nursery.start(serve_metrics, make_registry(worker.status), 0)
                status, body = await http_get(port, "/metrics")
                missing, _ = await http_get(port, "/nope")
                nursery.cancel_scope.cancel()
            assert status.endswith("200 OK") and missing.endswith("404 Not Found")
            labels = f'role="worker",run="{RUN}"'
            assert f"swarmnode_peers_connected{{{labels}}} 2.0" in body
            assert f'swarmnode_gossip_messages_in_total{{{labels},topic="shards"}} 1.0' in body
            assert f'swarmnode_gossip_messages_delivered_total{{{labels},topic="shards"}} 1.0' in body
            assert (
                f'swarmnode_gossip_queue_drops_total{{queue="outbound",{labels},topic="shards"}} 0.0' in body
            )
            assert "swarmnode_dht_routing_table_size" in body and "swarmnode_role_providers_found" in body
            assert "swarmnode_gossip_messages_rejected_total" in body

    trio.run(main)
