"""The node process: one `trio.run`, one nursery, every component a task in it.

`NodeRuntime.run` composes, in start order: the libp2p host (listening), the peer guard, gossip (its
pubsub must run before the first connection, or connection events block), the DHT (bootstraps),
liveness pings, the metrics endpoint, the status file, and finally the role service. Each component is
started with `nursery.start`, so `run` reports ready only once all of them are. Cancelling the nursery
(SIGINT/SIGTERM through `run_until_signalled`) unwinds them in reverse order; the host's context closes
every connection on the way out.

Once every component has started, the runtime collects and freezes the heap (`settle_gc`): every node
imports torch (440k objects), and a full collection walked all of them, 0.2 s on an idle core and up to
2.9 s on a loaded machine, every few seconds under gossip load, stalling the trio loop. Frozen start-up
objects are never traversed again; what the node allocates afterwards is collected as usual. `GcWatch`
times every pass (`status()["gc"]`).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import trio
from libp2p.abc import IHost

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger import Ledger
from swarmnode.ledger.errors import LedgerError
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.node.config import NodeConfig
from swarmnode.node.metrics import make_registry, serve_metrics
from swarmnode.node.p2p.clock import SeqCounter, wall_ms
from swarmnode.node.p2p.dht import Discovery
from swarmnode.node.p2p.gossip import Delivery, Gossip, LedgerView, advance_ledger_view
from swarmnode.node.p2p.host import build_host, dialable_addrs, listen_addrs
from swarmnode.node.p2p.peers import AGENT, Liveness, PeerActivity, PeerDirectory
from swarmnode.node.p2p.records import ROLES
from swarmnode.node.p2p.reqresp import RequestResponse
from swarmnode.node.p2p.scoring import PeerGuard
from swarmnode.node.roles.base import RoleNet, RoleService
from swarmnode.node.status_view import STATUS_FILE, WaitReport, waiting_line
from swarmnode.protocol.messages import Hello

log = logging.getLogger(__name__)

DELIVERIES_FILE = "deliveries.jsonl"
LOG_FILE = "node.log"
STATUS_INTERVAL = 1.0
LEDGER_VIEW_INTERVAL = 10.0  # seconds between reads of the ledger for gossip authority (spec/gossip.md)
FREEZE_GC_AFTER_START = True
"""Collect and freeze the start-up heap once the node is ready (module doc); off only for comparisons."""
LEDGER_READ_ERRORS: tuple[type[BaseException], ...] = (LedgerError, OSError, sqlite3.Error, ValueError)


def settle_gc() -> int:
    """Collect what start-up left behind, then exclude every surviving object from later collections;
    returns how many objects are frozen.

    Collections then traverse only what the running node allocates: young objects, which gossip at load
    churns, and the long-lived state it keeps (caches, queues), not the imported libraries and models.
    An object frozen here that later becomes cyclic garbage is never reclaimed; start-up state lives for
    the whole process anyway.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()  # walks the frozen list: once, not per status


class GcWatch:
    """Times the cyclic collector's passes per generation through `gc.callbacks` (`statistics()`)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.collections = [0, 0, 0]
        self.pause_s = [0.0, 0.0, 0.0]
        self.max_pause_s = [0.0, 0.0, 0.0]
        self.collected = 0
        self.frozen = 0  # objects `settle_gc` froze
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = self.clock()
            return
        if self._started is None:  # installed mid-collection
            return
        pause = self.clock() - self._started
        self._started = None
        generation = info["generation"]
        self.collections[generation] += 1
        self.pause_s[generation] += pause
        self.max_pause_s[generation] = max(self.max_pause_s[generation], pause)
        self.collected += info["collected"]

    def install(self) -> None:
        gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def statistics(self) -> dict[str, Any]:
        return {
            "collections": list(self.collections),
            "pause_ms": [round(p * 1e3, 3) for p in self.pause_s],
            "max_pause_ms": [round(p * 1e3, 3) for p in self.max_pause_s],
            "collected": self.collected,
            "frozen": self.frozen,
            "thresholds": list(gc.get_threshold()),
        }


class NodeRuntime:
    """Composes host + DHT + gossip + request/response + liveness + one role service."""

    def __init__(
        self,
        config: NodeConfig,
        identity: NodeIdentity,
        role: RoleService,
        *,
        freeze_gc: bool = FREEZE_GC_AFTER_START,
    ) -> None:
        self.config = config
        self.identity = identity
        self.role = role
        self.seq = SeqCounter()
        self.started_at = time.time()
        self.ready = False
        self.net: RoleNet | None = None
        self.guard: PeerGuard | None = None
        self.liveness: Liveness | None = None
        self.metrics_port: int | None = None
        self._deliveries: TextIO | None = None
        self.ledger_reads = 0
        self.ledger_read_errors = 0
        self.freeze_gc = freeze_gc
        self.gc_watch = GcWatch()

    def _compose(self, host: IHost) -> tuple[RoleNet, PeerGuard, Liveness]:
        """Build every component around a host; nothing runs yet."""
        config = self.config
        guard = PeerGuard(host, config.scoring)
        activity = PeerActivity()
        reqresp = RequestResponse(
            host, self.identity, config.run, self.seq, guard, on_activity=activity.touch
        )
        gossip = Gossip(
            host,
            self.identity,
            config.run,
            self.seq,
            guard,
            activity,
            subscribe=self.role.SUBSCRIBES,
            settings=config.gossip,
        )
        settings = config.discovery_settings()
        discovery = Discovery(host, guard, settings, client=not config.dialable)  # NAT: a DHT client
        if settings.trainer is not None:
            gossip.set_trainer(settings.trainer)  # the operator's pin: manifests judged before the record
        directory = None
        if self.role.ROLE in ROLES:  # bootstrap and probe nodes have no role to introduce
            hello = Hello(
                run=config.run, role=self.role.ROLE, http_endpoint=config.http_endpoint, agent=AGENT
            )
            directory = PeerDirectory(reqresp, hello)
        liveness = Liveness(
            host,
            reqresp,
            activity,
            guard,
            interval=config.liveness.interval,
            idle_after=config.liveness.idle_after,
            max_strikes=config.liveness.max_strikes,
            on_drop=directory.forget if directory else None,
        )
        net = RoleNet(
            self.identity,
            config.run,
            self.role.ROLE,
            host,
            discovery,
            gossip,
            reqresp,
            directory,
            guard,
            config.data_dir,
        )
        return net, guard, liveness

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        host = build_host(self.identity, [config.listen], announce=config.announce, dialable=config.dialable)
        async with host.run(listen_addrs([config.listen])):
            self.net, self.guard, self.liveness = net, guard, liveness = self._compose(host)
            gossip, discovery = net.gossip, net.discovery
            if config.record_deliveries:
                self._deliveries = (config.data_dir / DELIVERIES_FILE).open("a", buffering=1)
                gossip.add_observer(self._record_delivery)
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(guard.run)
                    await nursery.start(gossip.run)
                    await nursery.start(discovery.run)
                    await nursery.start(liveness.run)
                    if config.ledger_url:
                        await nursery.start(self._follow_ledger, gossip)
                    if config.metrics_port:
                        self.metrics_port = await nursery.start(
                            serve_metrics, make_registry(self.status), config.metrics_port
                        )
                    await nursery.start(self.role.run, self.net)
                    if self.freeze_gc:
                        self.gc_watch.frozen = settle_gc()
                    self.gc_watch.install()  # the running node's passes, not start-up's
                    self.ready = True
                    nursery.start_soon(self._write_status_forever)
                    log.info(
                        "node started",
                        extra={
                            "peer": self.identity.peer_id,
                            "role": self.role.ROLE,
                            "addrs": dialable_addrs(host),
                        },
                    )
                    task_status.started()
            finally:
                self.ready = False
                self.gc_watch.remove()
                if self._deliveries is not None:
                    self._deliveries.close()
                self._write_status(final=True)

    async def _follow_ledger(
        self, gossip: Gossip, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep gossip's ledger view current: who is registered, who is an eligible validator.

        A read that fails keeps the last view (counted); until the first read succeeds the node judges
        ledger-backed topics in open mode, like a node without a ledger.
        """
        from swarmnode.node.roles.common import (
            open_work_ledger,  # imports torch: only nodes with a ledger pay
        )

        ledger = await trio.to_thread.run_sync(open_work_ledger, self.config.ledger_url)
        assert ledger is not None
        task_status.started()
        view: LedgerView | None = None
        try:
            while True:
                try:
                    view = await trio.to_thread.run_sync(
                        read_ledger_view, ledger, view, wall_ms(), self.config.run
                    )
                    gossip.set_ledger_view(view)
                    self.ledger_reads += 1
                except LEDGER_READ_ERRORS as exc:
                    self.ledger_read_errors += 1
                    log.warning("ledger read for gossip authority failed", extra={"error": str(exc)})
                await trio.sleep(LEDGER_VIEW_INTERVAL)
        finally:
            ledger.close()

    def _record_delivery(self, delivery: Delivery) -> None:
        assert self._deliveries is not None
        envelope = delivery.opened.envelope
        message = delivery.opened.message
        line = {
            "kind": delivery.kind,
            "type": envelope.type,
            "sender": "0x" + envelope.sender.hex(),
            "seq": envelope.seq,
            "ts": envelope.ts,
            "recv_ns": delivery.received_wall_ns,
            "forwarder": delivery.forwarder,
            "size": delivery.size,
            "tag": getattr(message, "endpoint", ""),
        }
        self._deliveries.write(json.dumps(line) + "\n")

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot of the node (status file, metrics, devnet display)."""
        net, guard, liveness = self.net, self.guard, self.liveness
        base: dict[str, Any] = {
            "peer_id": self.identity.peer_id,
            "address": self.identity.checksum_address,
            "role": self.role.ROLE,
            "run": self.config.run,
            "pid": os.getpid(),
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started_at, 1),
            "updated": time.time(),
            "needs": list(self.role.NEEDS),
            "subscribes": list(self.role.SUBSCRIBES),
            "gc": self.gc_watch.statistics(),
        }
        if net is None or guard is None or liveness is None:
            return base | {"connected_peers": [], "providers_found": {}, "dht": {}, "gossip": {}}
        work = self.role.work
        peers = net.host.get_connected_peers()
        return base | {
            # ready: started and connected, unless it is where the others connect (no bootstrap of its own)
            "ready": self.ready and (bool(peers) or not self.config.bootstrap),
            "started": self.ready,
            "listen_addrs": dialable_addrs(net.host),
            "metrics_port": self.metrics_port,
            "connected_peers": sorted(str(p) for p in peers),
            "providers_found": net.finder.summary(),
            "run_record": net.run_record is not None,
            "dht": net.discovery.statistics(),
            "bootstrap_unreachable": dict(net.discovery.bootstrap_report.unreachable),
            "gossip": net.gossip.statistics(),
            "guard": guard.statistics(),
            "scores": guard.scores.snapshot(trio.current_time()),
            "reqresp": net.reqresp.statistics(),
            "liveness": liveness.statistics(),
            "authority": _authority_status(net.gossip, self.ledger_reads, self.ledger_read_errors),
            "work": _work_status(work),
        }

    def _write_status(self, *, final: bool = False) -> dict[str, Any]:
        document = self.status() | ({"stopped": True} if final else {})
        path = self.config.data_dir / STATUS_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(document, default=str))
        os.replace(tmp, path)
        return document

    async def _write_status_forever(self) -> None:
        """The status file every second, and a "waiting for" line while the node cannot work yet."""
        waits = WaitReport()
        said_ready = False
        while True:
            document = self._write_status()
            if document.get("ready") and not said_ready:  # connected: what "ready" means to an operator
                said_ready = True
                log.info("node ready", extra={"peers": len(document.get("connected_peers") or [])})
            due = waits.observe(waiting_line(document), time.monotonic())
            if due is not None:
                log.info("waiting for %s", due[0], extra={"waited_s": round(due[1])})
            await trio.sleep(STATUS_INTERVAL)


def read_ledger_view(
    ledger: Ledger, previous: LedgerView | None, now_ms: int, run: str | None = None
) -> LedgerView:
    """Blocking: one read of the sets gossip authority needs (registered nodes, eligible validators).

    Verdicts are run-scoped (spec/gossip.md, Authority): once `run` is on the ledger, only the eligible
    validators of its validator set may sign them; a staked validator outside the set has no more say on
    this run's gossip than on its credits."""
    if isinstance(ledger, SignedLog):
        ledger.refresh()  # entries other writers appended since our last look
    nodes = [n for n in ledger.nodes() if not n.ejected]
    eligible = {s.address for s in ledger.stakes() if s.eligible}
    info = ledger.run(run) if run else None
    if info is not None:
        eligible &= set(info.validators)
    return advance_ledger_view(
        previous,
        validators=frozenset(n.address for n in nodes if n.role == "validator" and n.address in eligible),
        registered=frozenset(n.address for n in nodes),
        now_ms=now_ms,
        ledger_id=ledger.ledger_id if isinstance(ledger, SignedLog) else None,
    )


def _authority_status(gossip: Gossip, reads: int, errors: int) -> dict[str, Any]:
    view = gossip.authority
    ledger = view.ledger
    return {
        "trainer": "0x" + view.trainer.hex() if view.trainer is not None else None,
        "ledger_reads": reads,
        "ledger_read_errors": errors,
        "validators": len(ledger.validators) if ledger is not None else None,
        "registered": len(ledger.registered) if ledger is not None else None,
        "former": len(ledger.former) if ledger is not None else None,
    }


def _work_status(work: Any) -> dict[str, Any]:
    """The work's own status; a failing one is reported, never allowed to stop the status file."""
    if not hasattr(work, "status"):
        return dict(getattr(work, "received", {}))
    try:
        return dict(work.status())
    except Exception as exc:  # noqa: BLE001 - the status file must still be written
        log.warning("work status failed", extra={"error": repr(exc)})
        return {"status_error": repr(exc)}


async def cancel_on_signal(scope: trio.CancelScope) -> None:
    """Cancel `scope` on the first SIGINT or SIGTERM (clean shutdown of the whole node)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("shutting down", extra={"signal": signal.Signals(signum).name})
            scope.cancel()
            return


async def run_until_signalled(runtime: NodeRuntime) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_on_signal, nursery.cancel_scope)
        await nursery.start(runtime.run)


_STANDARD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every `extra=` field."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        document.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS})
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


class ExtraFormatter(logging.Formatter):
    """Human-readable stderr lines with the `extra=` fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS)
        return super().format(record) + (f" {extras}" if extras else "")


class RaisedToCallerFilter(logging.Filter):
    """py-libp2p logs some failures at ERROR and then raises them to our code, which handles them (a peer
    that left, a backoff, a retry) and logs what they mean: `Failed to open stream to peer ...` floods every
    log when peers stop normally (issue #32), and a bootstrap dial to a wrong port or peer id is explained
    by `node.p2p.bootstrap`. The ERROR duplicates are shown only at DEBUG."""

    PREFIXES = {  # logger -> the messages it raises to the caller right after logging them
        "libp2p.host.basic_host": ("Failed to open stream to peer",),
        "libp2p.transport.tcp.tcp": ("Failed to open TCP stream",),
        "libp2p.network.swarm": ("failed to upgrade security for peer",),
    }

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.prefixes):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def configure_logging(config: NodeConfig, *, stream: TextIO = sys.stderr) -> None:
    """Structured JSON lines to data_dir/node.log, readable lines to stderr; libp2p's own logs included."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(config.log_level)
    file_handler = logging.FileHandler(config.data_dir / LOG_FILE)
    file_handler.setFormatter(JsonFormatter())
    console = logging.StreamHandler(stream)
    console.setFormatter(ExtraFormatter(f"%(asctime)s {config.role} %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file_handler)
    root.addHandler(console)
    # py-libp2p disables propagation of its logs at import (utils/logging.py:122); route them to us
    libp2p_logger = logging.getLogger("libp2p")
    libp2p_logger.handlers.clear()
    libp2p_logger.propagate = True
    libp2p_logger.setLevel(config.libp2p_log_level)
    for name, child in logging.root.manager.loggerDict.items():
        # some py-libp2p modules pin their own level at import (network/auto_connector.py:137 sets INFO)
        if name.startswith("libp2p.") and isinstance(child, logging.Logger):
            child.setLevel(logging.NOTSET)
    for name, prefixes in RaisedToCallerFilter.PREFIXES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, RaisedToCallerFilter) for f in logger.filters):
            logger.addFilter(RaisedToCallerFilter(prefixes))
