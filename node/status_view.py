"""A node's status document (`data_dir/status.json`, rewritten every second) as lines a person reads.

Shared by `swarmnode status` and the devnet's live table: one wording for what a node does and waits for.
`figure_lines` prints the dashboard's figures (node.dashboard) with the page's labels, so the command and the
page never disagree. Pure: the document and the clock are arguments.
"""

from __future__ import annotations

from typing import Any

# started_state: one state word for this view, the devnet table and the dashboard (imported from here too)
from swarmnode.node.dashboard import LABELS, figure_text, figures, started_state

STATUS_FILE = "status.json"  # in the node's data_dir: written by node.runtime, read by `swarmnode status`
STALE_AFTER_S = 10.0  # a status not rewritten for this long: the node is stopped, hung or gone


def work_cell(role: str, work: dict[str, Any], steps: int) -> str:
    """One line of live progress for a node's work status (the devnet table's last column)."""
    if not isinstance(work, dict) or not work:
        return "-"
    if role == "trainer":
        rewards = work.get("rewards") or []
        reward = f" reward {rewards[-1]:.3f}" if rewards else ""
        total = f"/{steps}" if steps else ""
        done = " [green]done[/]" if work.get("done") else ""
        if (work.get("signal") or {}).get("starved"):
            done = " [red]no learning signal[/]"
        return (
            f"step {work.get('step', 0)}{total} v{_or_dash(work.get('version'))}{reward}"
            f" used {work.get('submissions_used', 0)} wait {work.get('wait_s', 0):.0f}s{done}"
        )
    if role == "worker":
        cheat = f" [red]{work['cheat']}[/]" if work.get("cheat") else ""
        return (
            f"v{_or_dash(work.get('version'))} sent {work.get('submitted', 0)}"
            f" ok {work.get('accepted', 0)} rej {work.get('rejected', 0)}{cheat}"
        )
    if role == "validator":
        credits = work.get("credits") or {}
        return (
            f"ok {work.get('accepted', 0)} rej {work.get('rejected', 0)} slash {work.get('slashes', 0)}"
            f" (final {work.get('slashes_finalized', 0)}) credited {credits.get('committed', 0)}"
            f" in {credits.get('batches', 0)} batches queue {work.get('queued', 0)}"
            f" cpu {work.get('cpu_s', 0):.0f}s"
        )
    if role == "relay":
        served = work.get("bytes_served", 0) / 1e6
        return f"holds {work.get('versions_held', [])} served {served:.1f} MB"
    return "-"


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def waiting_for(status: dict[str, Any]) -> list[str]:
    """The roles this node needs and has not found a verified provider of (empty: nothing missing)."""
    found = status.get("providers_found") or {}
    return [role for role in status.get("needs") or [] if not found.get(role)]


def waiting_line(status: dict[str, Any]) -> str | None:
    """What the node waits for before it can do its work, as the end of "waiting for …"; None: nothing.

    In the order a node gets going: a first peer, the roles it needs, the run's descriptor, then the
    role's first input (a worker's first checkpoint, a trainer's first rollouts, a validator's first
    submission). Only the first missing thing is named: the later ones follow from it.
    """
    if not status.get("connected_peers"):
        unreachable = status.get("bootstrap_unreachable") or {}
        if unreachable:
            return "a first peer: " + "; ".join(unreachable.values())
        return "a first peer (none answered yet: check the --bootstrap address, its port and its /p2p/ id)"
    missing = waiting_for(status)
    if missing:
        return f"a {', a '.join(missing)} of run {status.get('run', '?')} (looked up in the DHT)"
    role, work = status.get("role"), status.get("work") or {}
    if role in ("worker", "validator", "relay") and status.get("run_record") is False:
        return "the run's descriptor (the trainer publishes it in the DHT)"
    if role == "worker" and work and work.get("version") is None:
        newest = work.get("newest_known")
        return "the first checkpoint" + (f" (version {newest} is announced)" if newest is not None else "")
    if role == "trainer" and work and not work.get("submissions_received") and not work.get("step"):
        return "the first rollouts from workers (through the validators)"
    return None


WAIT_REPORT_S = 15.0  # a node that waits says so this often (the first line after this long a wait)


class WaitReport:
    """Turns the successive `waiting_line`s of a node into a log line every `every_s` while it waits.

    A wait shorter than `every_s` is never reported (start-up is quiet); a new thing to wait for restarts
    the clock, so each line says how long the node has waited for what it names.
    """

    def __init__(self, every_s: float = WAIT_REPORT_S) -> None:
        self.every_s = every_s
        self._what: str | None = None
        self._since = 0.0
        self._said_at = 0.0

    def observe(self, what: str | None, now: float) -> tuple[str, float] | None:
        """(what, seconds waited) when a line is due, else None."""
        if what != self._what:
            self._what, self._since, self._said_at = what, now, now
            return None
        if what is None or now - self._said_at < self.every_s:
            return None
        self._said_at = now
        return what, now - self._since


def describe(status: dict[str, Any], now: float) -> list[str]:
    """A node's status in a few plain lines: who, whether it runs, its peers, what it waits for, its work."""
    role = status.get("role", "?")
    age = now - float(status.get("updated") or 0)
    if status.get("stopped"):
        state = "stopped"
    elif age > STALE_AFTER_S:
        state = f"not updated for {age:.0f}s (stopped, hung or killed: pid {status.get('pid', '?')})"
    else:
        state = f"{started_state(status)}, up {status.get('uptime_s', 0):.0f}s"
    lines = [
        f"{role} of run {status.get('run', '?')}: {state}",
        f"  peer id {status.get('peer_id', '?')}",
        f"  address {status.get('address', '?')}",
        f"  listening on {', '.join(status.get('listen_addrs') or []) or '-'}",
    ]
    peers = status.get("connected_peers") or []
    waiting = waiting_line(status) if not status.get("stopped") else None
    lines.append(f"  {len(peers)} peers connected" + (f"; waiting for {waiting}" if waiting else ""))
    work = status.get("work") or {}
    if work:
        lines.append(f"  work: {work_cell(role, work, 0)}")
    signal = work.get("signal") or {}
    if signal.get("starved"):
        lines.append(f"  {signal.get('message', 'no learning signal')}")
    return lines


def figure_lines(status: dict[str, Any]) -> list[str]:
    """The dashboard's figures as "label: value" lines, worded as on the page the metrics port serves."""
    port = status.get("metrics_port")
    where = f" (live at http://127.0.0.1:{port}/)" if port and not status.get("stopped") else ""
    lines = [f"  figures{where}:"]
    for key, value in figures(status).items():
        lines.append(f"    {LABELS[key][1]}: {figure_text(key, value)}")
    return lines
