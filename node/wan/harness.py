"""`Wan`: a swarm's own internet on one machine: a namespace per node, shaped links, delay, loss, NAT.

Layout (one run prefix P, one /16 subnet 10.S.0.0/16 no other route on this machine uses):

    node ns P-<name>: eth0 10.S.x.y/32, default via 10.S.0.1 (onlink), tbf = the node's uplink
        |  veth
    core ns P-core:  p<i> (tbf = the node's downlink) -- bridge br0 10.S.0.1 -- TUN emu0 -- linkemu
                     host (10.S.255.2) --veth-- root ns sw<pid>h<n> (10.S.255.1), route 10.S.0.0/16
                     via the core: the machine itself (a ledger, a test) reaches every node and back

Nodes hold /32 addresses, so even two nodes on the one bridge talk through the core, where policy routing
sends every packet that entered from the bridge to the TUN, and every packet the emulator writes back
goes out by the main table. Traffic to and from the host link is routed around the emulator: the host
stands for infrastructure (the chain, the operator), not a peer on a slow line.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

from swarmnode.node.wan.netns import (
    WanError,
    WanUnavailable,
    add_namespace,
    destroy,
    host_link_name,
    run_ip,
    set_sysctls,
    spawn_in,
    stop_pids,
    valid_node_name,
)
from swarmnode.node.wan.netns import (
    _exists as pid_exists,  # package-internal: a run is stale when its pid is gone
)
from swarmnode.node.wan.netns import destroy_stale as destroy_stale_namespaces
from swarmnode.node.wan.profiles import Link
from swarmnode.node.wan.shaping import shape

DEFAULT_MTU = 1500
EMULATOR_READY_S = 15.0
SUBNETS = range(64, 224)  # the second octet of 10.S.0.0/16 a WAN may take
EMU_TABLE = "100"
TUN = "emu0"
BRIDGE = "br0"

_counter = itertools.count(1)
_WORKDIR = re.compile(r"^swan(\d+)-\d+-[A-Za-z0-9_]+$")  # tempfile.mkdtemp(prefix="swan<pid>-<n>-")
_ROUTE_TYPES = frozenset(
    {
        "local",
        "broadcast",
        "unicast",
        "unreachable",
        "blackhole",
        "prohibit",
        "throw",
        "multicast",
        "anycast",
        "nat",
    }
)

_QUIET_NS = (  # every WAN namespace: no IPv6 chatter, no redirects, no reverse-path filtering
    ("net.ipv6.conf.all.disable_ipv6", "1"),
    ("net.ipv6.conf.default.disable_ipv6", "1"),
    ("net.ipv4.conf.all.rp_filter", "0"),
    ("net.ipv4.conf.default.rp_filter", "0"),
    ("net.ipv4.conf.all.send_redirects", "0"),
    ("net.ipv4.conf.default.send_redirects", "0"),
    ("net.ipv4.conf.all.accept_redirects", "0"),
    ("net.ipv4.conf.default.accept_redirects", "0"),
)


def free_subnet(used_routes: str) -> int:
    """The first S in `SUBNETS` such that 10.S.0.0/16 overlaps no route or address in `ip -4 route` output."""
    taken = []
    for line in used_routes.splitlines():
        words = line.split()
        if words and words[0] in _ROUTE_TYPES:
            words = words[1:]
        token = words[0] if words else "default"
        if token == "default":
            continue
        try:
            taken.append(ipaddress.ip_network(token, strict=False))
        except ValueError:
            continue
    for second in SUBNETS:
        candidate = ipaddress.ip_network(f"10.{second}.0.0/16")
        if not any(candidate.overlaps(net) for net in taken):
            return second
    raise WanError("no free 10.S.0.0/16 subnet left for a WAN on this machine")


def remove_stale_workdirs(
    root: Path | None = None, *, alive: Callable[[int], bool] = pid_exists
) -> list[Path]:
    """Delete the work folders (emulator config, stats, log) of WAN runs whose process is gone.

    A run's folder is `<tmp>/swan<pid>-<n>-*`, named from the pid of the process that built it, the
    same way its namespaces are, so a folder of a live run (another test, another devnet) is kept.
    """
    root = Path(tempfile.gettempdir()) if root is None else root
    removed = []
    for entry in sorted(root.iterdir()):
        match = _WORKDIR.match(entry.name)
        if match is None or not entry.is_dir() or entry.is_symlink() or alive(int(match.group(1))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def destroy_stale() -> list[str]:
    """What crashed WAN runs left behind: their namespaces (the names removed are returned) and folders."""
    removed = destroy_stale_namespaces()
    remove_stale_workdirs()
    return removed


def node_address(second: int, index: int) -> str:
    """Node `index` (0-based) gets 10.S.0.2 upward, .2-.254 of each /24 (10.S.255.x is the host link)."""
    per_block = 253
    block, offset = divmod(index, per_block)
    if block >= 255:
        raise WanError(f"too many WAN nodes ({index + 1})")
    return f"10.{second}.{block}.{offset + 2}"


class Wan:
    """A built WAN; make one with `Wan.create`, end it with `close()` (or use it as a context manager)."""

    def __init__(self, prefix: str, second: int, links: Mapping[str, Link], mtu: int) -> None:
        self.prefix = prefix
        self.subnet = f"10.{second}.0.0/16"
        self.gateway = f"10.{second}.0.1"
        self.host_address = f"10.{second}.255.1"  # the root namespace, as every node sees it
        self.core = f"{prefix}-core"
        self.links = dict(links)
        self.mtu = mtu
        self._second = second
        self._addresses = {name: node_address(second, i) for i, name in enumerate(links)}
        self._processes: list[subprocess.Popen[Any]] = []
        self._emulator: subprocess.Popen[Any] | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        self._final_statistics: dict[str, Any] | None = None
        self.closed = False

    @classmethod
    def create(
        cls,
        links: Mapping[str, Link],
        *,
        seed: int = 0,
        mtu: int = DEFAULT_MTU,
        prefix: str | None = None,
    ) -> Wan:
        """Build namespaces, links, shaping and the emulator for these nodes; `WanUnavailable` where it can't.

        A failure part way tears down what was built before the error propagates.
        """
        if not links:
            raise ValueError("a WAN needs at least one node")
        for name in links:
            valid_node_name(name)
        prefix = prefix or f"swan{os.getpid()}-{next(_counter)}"
        add_namespace(f"{prefix}-core")  # the first thing: raises WanUnavailable where netns cannot be made
        try:
            second = free_subnet(run_ip(["-4", "route", "show", "table", "all"]))
            wan = cls(prefix, second, links, mtu)
        except BaseException:
            destroy(prefix)
            raise
        try:
            wan._build(seed)
        except BaseException:
            wan.close()
            raise
        return wan

    def address(self, name: str) -> str:
        """The IPv4 address peers reach node `name` at (never 127.0.0.1)."""
        try:
            return self._addresses[name]
        except KeyError:
            raise KeyError(f"no WAN node {name!r}") from None

    def namespace(self, name: str) -> str:
        self.address(name)
        return f"{self.prefix}-{name}"

    def spawn(self, name: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start a process inside node `name`'s namespace; `close()` stops it if it is still running."""
        process = spawn_in(self.namespace(name), argv, **popen)
        self._processes.append(process)
        return process

    def statistics(self) -> dict[str, Any]:
        """The emulator's counters (packets, bytes, drops by reason, CPU seconds), as of its last second.

        After `close()`, the last counters it wrote (its folder is gone by then).
        """
        if self._final_statistics is not None:
            return dict(self._final_statistics)
        try:
            return dict(json.loads((self._workdir / "emu-stats.json").read_text()))
        except (OSError, ValueError):
            return {}

    def close(self) -> None:
        """Stop every process started here, the emulator, and remove everything the WAN made (its
        namespaces and its work folder). Idempotent."""
        if self.closed:
            return
        stop_pids([p.pid for p in self._processes if p.poll() is None])
        for process in self._processes:
            _reap(process)
        if self._emulator is not None and self._emulator.poll() is None:
            stop_pids([self._emulator.pid])
            _reap(self._emulator)
        destroy(self.prefix)
        self._final_statistics = self.statistics()  # the emulator has stopped: these are its last
        shutil.rmtree(self._workdir, ignore_errors=True)
        self.closed = True

    def __enter__(self) -> Wan:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _build(self, seed: int) -> None:
        core, mtu = self.core, str(self.mtu)
        set_sysctls(core, (*_QUIET_NS, ("net.ipv4.ip_forward", "1")))
        run_ip(
            ["-batch", "-"],
            namespace=core,
            stdin="\n".join(
                [
                    "link set lo up",
                    f"link add {BRIDGE} mtu {mtu} type bridge",
                    f"addr add {self.gateway}/16 dev {BRIDGE}",
                    f"link set {BRIDGE} up",
                    f"tuntap add dev {TUN} mode tun",
                    f"link set {TUN} mtu {mtu} txqueuelen 10000 up",
                    f"route add default dev {TUN} table {EMU_TABLE}",
                    f"rule add iif {BRIDGE} to 10.{self._second}.255.0/24 lookup main pref 100",
                    f"rule add iif {BRIDGE} lookup {EMU_TABLE} pref 200",
                ]
            )
            + "\n",
        )
        self._build_host_link()
        for index, (name, link) in enumerate(self.links.items()):
            self._build_node(index, name, link)
        self._start_emulator(seed)

    def _build_host_link(self) -> None:
        root_end = host_link_name(self.prefix)
        core_end = f"10.{self._second}.255.2"
        run_ip(
            [
                "link",
                "add",
                root_end,
                "mtu",
                str(self.mtu),
                "type",
                "veth",
                "peer",
                "name",
                "host",
                "netns",
                self.core,
            ]
        )
        run_ip(["addr", "add", f"{self.host_address}/30", "dev", root_end])
        run_ip(["link", "set", root_end, "up"])
        run_ip(["route", "add", self.subnet, "via", core_end, "dev", root_end])
        run_ip(["addr", "add", f"{core_end}/30", "dev", "host"], namespace=self.core)
        run_ip(["link", "set", "host", "up"], namespace=self.core)

    def _build_node(self, index: int, name: str, link: Link) -> None:
        ns, port, mtu = self.namespace(name), f"p{index}", str(self.mtu)
        add_namespace(ns)
        set_sysctls(ns, _QUIET_NS)
        run_ip(
            ["link", "add", port, "mtu", mtu, "type", "veth", "peer", "name", "eth0", "netns", ns],
            namespace=self.core,
        )
        run_ip(["link", "set", port, "master", BRIDGE, "up"], namespace=self.core)
        run_ip(
            ["-batch", "-"],
            namespace=ns,
            stdin="\n".join(
                [
                    "link set lo up",
                    f"addr add {self.address(name)}/32 dev eth0",
                    "link set eth0 up",
                    f"route add default via {self.gateway} dev eth0 onlink",
                ]
            )
            + "\n",
        )
        shape(ns, "eth0", link.up_mbit, link.queue_ms, self.mtu)
        shape(self.core, port, link.down_mbit, link.queue_ms, self.mtu)

    def _start_emulator(self, seed: int) -> None:
        config = self._workdir / "emu.json"
        config.write_text(
            json.dumps(
                {
                    "seed": seed,
                    "links": {self.address(name): asdict(link) for name, link in self.links.items()},
                }
            )
        )
        argv = [
            sys.executable,
            "-m",
            "swarmnode.node.cli",
            "wan",
            "linkemu",
            "--tun",
            TUN,
            "--config",
            str(config),
            "--stats",
            str(self._workdir / "emu-stats.json"),
        ]
        log = self._workdir / "emu.log"
        with log.open("wb") as errors:
            emulator = spawn_in(self.core, argv, stdout=subprocess.PIPE, stderr=errors)
        self._emulator = emulator
        out = emulator.stdout
        ready, _, _ = select.select([out], [], [], EMULATOR_READY_S) if out is not None else ([], [], [])
        if not ready or out is None or out.readline().strip() != b"ready":
            emulator.kill()
            emulator.wait(timeout=5)
            tail = log.read_text(errors="replace").strip()[-2000:]
            raise WanError(f"the link emulator did not start: {tail or 'no output'}")

    @property
    def emulator_pid(self) -> int | None:
        return None if self._emulator is None else self._emulator.pid


def _reap(process: subprocess.Popen[Any]) -> None:
    try:
        process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        pass


__all__ = [
    "Wan",
    "WanError",
    "WanUnavailable",
    "destroy_stale",
    "free_subnet",
    "node_address",
    "remove_stale_workdirs",
]
