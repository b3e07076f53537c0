"""In-process swarms for the fast tests: several NodeRuntimes in one trio.run, on loopback."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.assemble import ROLE_CLASSES
from swarmnode.node.config import LivenessSettings, NodeConfig
from swarmnode.node.p2p.dht import DiscoverySettings
from swarmnode.node.p2p.ports import free_port
from swarmnode.node.roles.base import RoleService
from swarmnode.node.runtime import NodeRuntime

RUN = "testrun"
FAST_DISCOVERY = DiscoverySettings(early_refresh=(0.5, 1.0, 2.0), lookup_interval=2.0)


def node_config(
    tmp: Path, name: str, role: str, *, port: int, bootstrap: Sequence[str] = (), record: bool = False
) -> NodeConfig:
    return NodeConfig(
        identity=tmp / f"{name}.key",
        run=RUN,
        role=role,
        data_dir=tmp / name,
        listen=f"/ip4/127.0.0.1/tcp/{port}",
        bootstrap=tuple(bootstrap),
        http_port=0,
        record_deliveries=record,
        discovery=FAST_DISCOVERY,
        liveness=LivenessSettings(interval=1.0, idle_after=2.0, max_strikes=2),
    )


@asynccontextmanager
async def swarm(
    tmp: Path, roles: Sequence[str], *, services: dict[int, RoleService] | None = None, record: bool = False
) -> AsyncIterator[list[NodeRuntime]]:
    """Start `roles` (the first is the bootstrap everyone else is given) and yield the runtimes."""
    identities = [NodeIdentity(secrets.token_bytes(32)) for _ in roles]
    ports = [free_port() for _ in roles]
    bootstrap = f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/{identities[0].peer_id}"
    runtimes = []
    async with trio.open_nursery() as nursery:
        for i, role in enumerate(roles):
            config = node_config(
                tmp, f"n{i}-{role}", role, port=ports[i], bootstrap=(bootstrap,) if i else (), record=record
            )
            service = (services or {}).get(i) or ROLE_CLASSES[role]()
            runtime = NodeRuntime(config, identities[i], service)
            await nursery.start(runtime.run)
            runtimes.append(runtime)
        yield runtimes
        nursery.cancel_scope.cancel()


async def wait_until(predicate: Callable[[], bool], *, timeout: float) -> None:  # noqa: ASYNC109
    """Poll `predicate` (state owned by libp2p, which offers no event for it) until true or timeout."""
    with trio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.1)


def replaced(config: NodeConfig, **changes: object) -> NodeConfig:
    return replace(config, **changes)  # type: ignore[arg-type]
