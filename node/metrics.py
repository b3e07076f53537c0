"""Prometheus endpoint: peers, DHT table size, gossip messages in/out/rejected per topic, queue drops.

Nothing is counted twice: a collector reads the `statistics()` of the live components at scrape time,
into a registry owned by this node (no process-global registry). The endpoint is a minimal HTTP/1.0
server on trio, so the node stays one trio.run with no helper threads. Beside GET /metrics it serves the
node's dashboard (node.dashboard) from the same snapshot: GET / (the page), /figures.json (what the page
shows) and /status.json (the whole status document, as `data_dir/status.json` holds it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from swarmnode.node.dashboard import PAGE, figures_document

log = logging.getLogger(__name__)

Snapshot = Callable[[], dict[str, Any]]
"""Returns the node's status document (node.runtime.NodeRuntime.status)."""


class NodeCollector(Collector):
    """Turns a node status snapshot into metric families."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        status = self.snapshot()
        labels = {"role": status["role"], "run": status["run"]}
        names, values = list(labels), list(labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"swarmnode_{name}", doc, labels=names)
            family.add_metric(values, value)
            return family

        yield gauge("peers_connected", "Peers with an open connection", len(status["connected_peers"]))
        dht = status["dht"]
        yield gauge(
            "dht_routing_table_size", "Peers in the Kademlia routing table", dht["routing_table_size"]
        )
        yield gauge("dht_provider_records", "Provider records held for others", dht["provider_records"])
        yield gauge("dht_lookup_p50_seconds", "Median provider lookup time", dht["lookup_p50_s"])
        lookups = CounterMetricFamily("swarmnode_dht_lookups", "Provider lookups", labels=names)
        lookups.add_metric(values, dht.get("lookups", 0))
        yield lookups
        guard = status["guard"]
        yield gauge("peers_banned", "Peers currently banned", guard["banned_peers"])
        bans = CounterMetricFamily("swarmnode_peer_bans", "Bans imposed", labels=names)
        bans.add_metric(values, guard["bans_total"])
        yield bans
        yield from self._gossip(status["gossip"], names, values)
        reqresp = CounterMetricFamily(
            "swarmnode_reqresp", "Request/response outcomes", labels=[*names, "protocol", "outcome"]
        )
        for key, count in sorted(status["reqresp"].items()):
            protocol, _, outcome = key.rpartition(":")
            reqresp.add_metric([*values, protocol, outcome], count)
        yield reqresp
        found = GaugeMetricFamily(
            "swarmnode_role_providers_found",
            "Verified providers found per needed role",
            labels=[*names, "needed_role"],
        )
        for role, peers in sorted(status["providers_found"].items()):
            found.add_metric([*values, role], len(peers))
        yield found

    def _gossip(self, gossip: dict[str, Any], names: list[str], values: list[str]) -> Iterator[Metric]:
        topic_labels = [*names, "topic"]
        counters = {
            "published": ("gossip_messages_out", "Messages we published"),
            "accepted": ("gossip_messages_in", "Messages that passed validation"),
            "delivered": ("gossip_messages_delivered", "Messages handed to the role"),
            "throttled": ("gossip_messages_throttled", "Messages over a sender's rate"),
            "from_banned": ("gossip_messages_from_banned", "Messages that arrived from a peer just banned"),
            "duplicates": (
                "gossip_messages_duplicate",
                "Messages delivered by libp2p without our validation",
            ),
        }
        for field, (name, doc) in counters.items():
            family = CounterMetricFamily(f"swarmnode_{name}", doc, labels=topic_labels)
            for topic, stats in _topics(gossip):
                family.add_metric([*values, topic], stats[field])
            yield family
        for field, name, doc in (
            ("rejected", "gossip_messages_rejected", "Rejected: sender at fault"),
            ("ignored", "gossip_messages_ignored", "Ignored: nobody at fault"),
        ):
            family = CounterMetricFamily(f"swarmnode_{name}", doc, labels=[*topic_labels, "reason"])
            for topic, stats in _topics(gossip):
                for reason, count in sorted(stats[field].items()):
                    family.add_metric([*values, topic, reason], count)
            yield family
        drops = CounterMetricFamily(
            "swarmnode_gossip_queue_drops",
            "Messages dropped by a full queue",
            labels=[*topic_labels, "queue"],
        )
        for topic, stats in _topics(gossip):
            drops.add_metric([*values, topic, "node"], stats["queue_drops"])  # our queue to the role
            # accepted by our validator, never delivered to the role
            drops.add_metric([*values, topic, "subscription"], stats["upstream_drops"])
            drops.add_metric(
                [*values, topic, "outbound"], stats["outbound_drops"]
            )  # libp2p's per-peer queues
        yield drops
        mesh = GaugeMetricFamily(
            "swarmnode_gossip_mesh_peers", "Peers in our mesh per topic", labels=topic_labels
        )
        for topic, stats in _topics(gossip):
            mesh.add_metric([*values, topic], stats["mesh_peers"])
        yield mesh


def _topics(gossip: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for topic, stats in sorted(gossip.items()):
        if isinstance(stats, dict):
            yield topic, stats


class NodeRegistry(CollectorRegistry):
    """The node's registry, keeping the snapshot it collects from: the dashboard reads the same one."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__(auto_describe=False)
        self.snapshot = snapshot
        self.register(NodeCollector(snapshot))


def make_registry(snapshot: Snapshot) -> NodeRegistry:
    return NodeRegistry(snapshot)


JSON_TYPE = b"application/json"
HTML_TYPE = b"text/html; charset=utf-8"
PAGE_BYTES = PAGE.encode()


def respond(registry: NodeRegistry, target: bytes) -> tuple[bytes, bytes, bytes]:
    """(status, content type, body) of a GET of `target`; every answer is built from one snapshot."""
    if target.startswith(b"/metrics"):
        return b"200 OK", CONTENT_TYPE_LATEST.encode(), generate_latest(registry)
    path = target.split(b"?", 1)[0]
    if path == b"/":
        return b"200 OK", HTML_TYPE, PAGE_BYTES
    if path == b"/figures.json":
        return b"200 OK", JSON_TYPE, json.dumps(figures_document(registry.snapshot()), default=str).encode()
    if path == b"/status.json":
        return b"200 OK", JSON_TYPE, json.dumps(registry.snapshot(), default=str).encode()
    return b"404 Not Found", b"text/plain", b"not found\n"


async def serve_metrics(
    registry: NodeRegistry,
    port: int,
    host: str = "127.0.0.1",
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve GET /metrics and the dashboard until cancelled; reports the bound port through task_status.

    One request per connection, its head at most 8 KiB and read within 5 s: a slow or oversized client
    costs one short-lived task, never the node.
    """

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.fail_after(5):
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 8192:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    head += chunk
                request_line = head.split(b"\r\n", 1)[0].split()
                if len(request_line) >= 2 and request_line[0] == b"GET":
                    try:
                        status, content_type, body = respond(registry, request_line[1])
                    except Exception as exc:  # noqa: BLE001 - a page that fails must never stop the node
                        log.warning("metrics request failed", extra={"error": repr(exc)})
                        status, content_type, body = b"500 Internal Server Error", b"text/plain", b"failed\n"
                else:
                    status, content_type, body = b"404 Not Found", b"text/plain", b"not found\n"
                await stream.send_all(
                    b"HTTP/1.0 "
                    + status
                    + b"\r\nContent-Type: "
                    + content_type
                    + b"\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
                    + body
                )
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await stream.aclose()

    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info(
        "metrics endpoint and dashboard",
        extra={"url": f"http://{host}:{bound}/metrics", "dashboard": f"http://{host}:{bound}/"},
    )
    task_status.started(bound)
    await trio.serve_listeners(handle, listeners)
