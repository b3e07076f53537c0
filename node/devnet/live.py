"""The devnet's live view: the status table, and the loop that runs a devnet while showing it.

`run_devnet` starts the bootstrap, then every other node, and redraws `status_table` from the nodes'
`status.json` twice a second until the run ends (discovery complete, training done, a trainer reported
no learning signal, `duration` passed, a node crashed, or SIGINT/SIGTERM); then it stops every node and
writes `summary.json`.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from typing import Any

import trio
from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarmnode.node.devnet.network import Devnet
from swarmnode.node.status_view import started_state, work_cell


def status_table(devnet: Devnet, elapsed: float) -> Table:
    table = Table(title=f"devnet {devnet.plan.run} · {devnet.folder} · {elapsed:.0f}s", expand=False)
    columns = ["node", "pid", "state", "peers", "dht", "providers found", "in", "out", "rej", "ban"]
    if devnet.plan.steps:
        columns = ["node", "state", "peers", "providers found", "in", "out", "rej", "work"]
    for column in columns:
        table.add_column(column, no_wrap=column in ("node", "providers found"))
    for node in devnet.nodes.values():
        status = node.status() or {}
        code = node.exit_code
        state = started_state(status)
        if code is not None:
            state = f"[red]exit {code}[/]" if code else "stopped"
        found = status.get("providers_found", {})
        found_text = (
            " ".join(
                f"{role}:{len(found.get(role, []))}" if found.get(role) else f"[red]{role}:0[/]"
                for role in status.get("needs", [])
            )
            or "-"
        )
        gossip = {k: v for k, v in status.get("gossip", {}).items() if isinstance(v, dict)}
        received = sum(s["delivered"] for s in gossip.values())
        sent = sum(s["published"] for s in gossip.values())
        rejected = sum(sum(s["rejected"].values()) for s in gossip.values())
        peers = str(len(status.get("connected_peers", [])))
        if devnet.plan.steps:
            work = work_cell(node.role, status.get("work") or {}, devnet.plan.steps)
            name = f"{node.name} ({node.role})" if node.cheat else node.name
            table.add_row(name, state, peers, found_text, str(received), str(sent), str(rejected), work)
            continue
        table.add_row(
            node.name,
            str(status.get("pid", "-")),
            state,
            peers,
            str(status.get("dht", {}).get("routing_table_size", "-")),
            found_text,
            str(received),
            str(sent),
            str(rejected),
            str(status.get("guard", {}).get("banned_peers", 0)),
        )
    return table


async def run_devnet(
    devnet: Devnet,
    *,
    duration: float,
    until_discovered: bool,
    live: bool,
    console: Console,
    probe_rate: float = 0.0,
) -> dict[str, Any]:
    """Start every node, show status until done or signalled, stop everything; returns the summary."""
    started = time.monotonic()
    reason = "interrupted"
    discovered = False
    async with trio.open_nursery() as nursery:

        async def watch_signals() -> None:
            nonlocal reason
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    reason = "interrupted"
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(watch_signals)
        try:
            devnet.start("bootstrap")
            with trio.fail_after(60):
                await devnet.await_ready(["bootstrap"])
            devnet.start_others()
            with (
                Live(status_table(devnet, 0), console=console, refresh_per_second=2, transient=False)
                if live
                else _NullLive() as view
            ):
                while True:
                    elapsed = time.monotonic() - started
                    view.update(status_table(devnet, elapsed))
                    if devnet.ledger is not None:
                        with contextlib.suppress(OSError):  # a chain that is gone shows in the nodes' errors
                            await trio.to_thread.run_sync(devnet.ledger.keep_time)
                    if probe_rate and "probe" not in devnet.nodes and devnet.discovered():
                        devnet.add_node("probe", "probe")
                        count = str(int(probe_rate * 86_400))
                        devnet.start("probe", "--rate", str(probe_rate), "--count", count, command="probe")
                    if until_discovered and devnet.discovered():
                        reason = "discovered"
                        break
                    if devnet.plan.steps and devnet.trainer_done():
                        reason = "trained"
                        break
                    if devnet.plan.steps and (starved := devnet.without_signal()):
                        reason = f"no learning signal ({starved})"
                        break
                    if duration and elapsed >= duration:
                        reason = "duration"
                        break
                    crashed = [n.name for n in devnet.nodes.values() if n.exit_code not in (None, 0)]
                    if crashed:
                        reason = f"crashed: {', '.join(crashed)}"
                        break
                    await trio.sleep(0.5)
        finally:
            discovered = devnet.discovered()
            with trio.CancelScope(shield=True):
                codes = await devnet.stop_all_async()
        nursery.cancel_scope.cancel()
    summary = {
        "folder": str(devnet.folder),
        "reason": reason,
        "elapsed_s": round(time.monotonic() - started, 1),
        "discovered": discovered,
        "exit_codes": codes,
        "nodes": devnet.statuses(),
    }
    (devnet.folder / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


class _NullLive:
    def __enter__(self) -> _NullLive:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, renderable: object) -> None:
        return None
