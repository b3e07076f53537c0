"""`swarmnode devnet`: a whole swarm of separate processes, with a live status view.

On 127.0.0.1 by default; with `--wan PROFILE` each node runs in its own network namespace on a WAN of
that profile (`node.wan`), listens and announces its WAN address, and `--home-workers K` puts the first
K workers behind NAT (the `home` profile: they dial out, nobody dials them).

One bootstrap node starts first; every other node (trainer, relays, workers, validators) is given only
the bootstrap address and finds the rest through the DHT. Each node gets its own key, config, data
directory and log under one folder (`devnet-runs/<time>/` unless `--out` names another), which stays
after the run. Nodes write `status.json` every second; the view reads those. Ctrl-C, SIGTERM, or the end
of `--duration` / `--until-discovered` stops every node with SIGTERM (SIGKILL after a grace period).

`Devnet` is also the harness the multi-process tests and the network benchmark drive directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import tomli_w
import trio
from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.keystore import PASSWORD_ENV, save_keystore
from swarmnode.node.cli.inputs import eval_tasks_option, run_model_options
from swarmnode.node.config import NodeConfig, render_config
from swarmnode.node.devnet.rl import DEVNET_STAKE_GWEI, STAKED_ROLES, DevnetLedger, work_cell
from swarmnode.node.wan import PROFILES, Wan, WanError, WanUnavailable, destroy_stale, draw_links

KDF_ITERATIONS = 2  # devnet keys only: fast to open, useless to protect anything
# SIGTERM to SIGKILL. A node's clean exit ends with the interpreter's final garbage collection over torch's
# objects: measured 7.6-8.1 s for every role, on loopback and on a WAN alike, on a loaded 2-core machine.
STOP_GRACE = 30.0
LOOPBACK = "127.0.0.1"
WAN_P2P_PORT = 4001  # on a WAN every node has its own address, so every node uses the same ports
WAN_HTTP_PORT = 8080
HOME_PROFILE = "home"
DILOCO_PLAN_FILE = "diloco-plan.bin"


@dataclass(frozen=True)
class DevnetPlan:
    trainers: int = 1
    relays: int = 2
    workers: int = 2
    validators: int = 1
    run: str = "devnet"
    record_deliveries: bool = False
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # extra [discovery]/[liveness]...
    steps: int = 0  # > 0: a training run of this many trainer steps (the nodes do real work)
    cheaters: tuple[str, ...] = ()  # one extra worker per entry, cheating that way
    ledger: str = ""  # "signed" | "evm" | "" (no ledger: discovery-only runs)
    threads: int = 1
    shard_mb: float = 1.0
    # Signal groups per trainer step: 24 of a submission's 32 prompts (about 31 have signal) make a step
    # take one submission, as the synchronous baseline does, so the two compare at equal data per step.
    min_batch_groups: int = 24
    # Several trainers (DiLoCo, spec/diloco.md): H GRPO steps per round, then an fp16 all-reduce; `steps`
    # counts each trainer's GRPO steps, so the run is ceil(steps / H) rounds.
    inner_steps: int = 3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    round_timeout_ms: int = 60_000
    # The run's model folder and task file, and the held-out tasks the report measures on ("": the
    # devnet's built-in model, generated additions and their held-out set).
    model: str = ""
    tasks: str = ""
    eval_tasks: str = ""
    engine: str = "auto"
    max_new_tokens: int = 6
    trainer_nproc: int = 1  # ranks of each trainer's FSDP2 group
    wan: str = ""  # a node.wan profile name: every node in its own namespace on a WAN of that kind
    home_workers: int = 0  # with `wan`: the first K workers are behind NAT (the home profile)
    wan_seed: int = 0

    @property
    def rounds(self) -> int:
        return -(-self.steps // self.inner_steps)

    def roles(self) -> list[tuple[str, str]]:
        """(name, role) of every node, bootstrap first."""
        nodes = [("bootstrap", "bootstrap")]
        for role, count in (
            ("trainer", self.trainers),
            ("relay", self.relays),
            ("worker", self.workers),
            ("validator", self.validators),
        ):
            nodes += [(f"{role}-{i}", role) for i in range(1, count + 1)]
        nodes += [(f"cheater-{i}", "worker") for i in range(1, len(self.cheaters) + 1)]
        return nodes

    def wan_profiles(self) -> dict[str, str]:
        """Each node's WAN profile, bootstrap first: the plan's, the first `home_workers` workers home."""
        homes = {f"worker-{i}" for i in range(1, self.home_workers + 1)}
        return {name: HOME_PROFILE if name in homes else self.wan for name, _ in self.roles()}

    def cheat_of(self, name: str) -> str:
        if name.startswith("cheater-"):
            return self.cheaters[int(name.split("-")[1]) - 1]
        return ""

    def work_section(
        self, name: str, role: str, *, plan_path: Path | None = None, lead: str = ""
    ) -> dict[str, Any]:
        """The [work] table of a node in a training run (`plan_path`, `lead`: its DiLoCo plan, if any)."""
        work: dict[str, Any] = {"threads": self.threads, "engine": self.engine}
        work |= {key: value for key, value in (("model", self.model), ("tasks", self.tasks)) if value}
        if role == "trainer":
            work |= {
                "steps": self.steps,
                "shard_mb": self.shard_mb,
                "min_batch_groups": self.min_batch_groups,
                "max_new_tokens": self.max_new_tokens,
                "nproc": self.trainer_nproc,
            }
            if self.trainers > 1:
                work |= {"diloco_plan": str(plan_path), "diloco_lead": lead}
        if role == "worker" and self.trainers > 1:
            # A version lasts a round of H steps on every trainer, so workers may send H times more on it.
            work["submissions_per_version"] = 4 * self.inner_steps
        if self.cheat_of(name):
            work["cheat"] = self.cheat_of(name)
        return work


@dataclass
class DevnetNode:
    name: str
    role: str
    directory: Path
    port: int
    peer_id: str
    address: str = ""
    http_port: int = 0
    cheat: str = ""
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    host: str = LOOPBACK  # the address it listens on and announces
    dialable: bool = True  # False behind NAT: it announces no address at all

    @property
    def config_path(self) -> Path:
        return self.directory / "node.toml"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def addr(self) -> str:
        return f"/ip4/{self.host}/tcp/{self.port}/p2p/{self.peer_id}"

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.data_dir / "status.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_folder() -> Path:
    return Path("devnet-runs") / time.strftime("%Y%m%d-%H%M%S")


class Devnet:
    """Creates the folder, keys and configs, and starts/stops/kills node processes."""

    def __init__(self, plan: DevnetPlan, folder: Path) -> None:
        self.plan = plan
        self.folder = folder.resolve()
        self.password = secrets.token_hex(16)
        self.nodes: dict[str, DevnetNode] = {}
        self.identities: dict[str, NodeIdentity] = {}
        self.ledger: DevnetLedger | None = None
        self.wan: Wan | None = None

    def register_run(self) -> None:
        """The lead trainer's key puts the run on the ledger with every validator of the devnet in its set,
        as an operator would (`swarmnode ledger run register`) before starting the roles."""
        assert self.ledger is not None
        trainers = [n for n in self.nodes.values() if n.role == "trainer"]
        if not trainers:
            return
        self.ledger.register_run(
            self.identities[trainers[0].name],
            self.plan.run,
            [self.identities[n.name] for n in self.nodes.values() if n.role == "validator"],
            model=self.plan.model,
            max_new_tokens=self.plan.max_new_tokens,
        )

    def prepare(self) -> list[DevnetNode]:
        if self.folder.exists():
            raise click.ClickException(
                f"{self.folder} already exists; pass a new --out (runs are never overwritten)"
            )
        if self.plan.wan:
            self.open_wan()  # first: where namespaces cannot be made, nothing is left behind
        self.folder.mkdir(parents=True)
        if self.wan is not None:
            (self.folder / "wan.json").write_text(json.dumps(self.wan_facts(), indent=1))
        identities = {}
        for name, role in self.plan.roles():
            directory = self.folder / name
            identity = NodeIdentity(secrets.token_bytes(32))
            save_keystore(identity, directory / "node.key", self.password, kdf_iterations=KDF_ITERATIONS)
            identities[name] = identity
            wan = self.wan
            self.nodes[name] = DevnetNode(
                name,
                role,
                directory,
                free_port() if wan is None else WAN_P2P_PORT,
                identity.peer_id,
                identity.checksum_address,
                0 if not self.plan.steps else free_port() if wan is None else WAN_HTTP_PORT,
                self.plan.cheat_of(name),
                host=LOOPBACK if wan is None else wan.address(name),
                dialable=wan is None or not wan.links[name].nat,
            )
        self.identities = identities
        if self.plan.ledger:
            host = LOOPBACK if self.wan is None else self.wan.host_address
            self.ledger = DevnetLedger(self.plan.ledger, self.folder, host=host)
            self.ledger.create()
            staked = [(n.role, identities[n.name]) for n in self.nodes.values() if n.role in STAKED_ROLES]
            self.ledger.enroll(staked, {n.address: n.peer_id for n in self.nodes.values()})
            self.register_run()
        if self.plan.steps and self.plan.trainers > 1:
            self.write_diloco_plan()
        bootstrap = self.nodes["bootstrap"].addr
        for node in self.nodes.values():
            self.write_config(node, bootstrap=() if node.role == "bootstrap" else (bootstrap,))
        (self.folder / "devnet.json").write_text(
            json.dumps(
                {
                    "run": self.plan.run,
                    "bootstrap": bootstrap,
                    "ledger": self.ledger.url if self.ledger is not None else "",
                    "wan": self.wan_facts(),
                    "nodes": {
                        n.name: {
                            "role": n.role,
                            "host": n.host,
                            "dialable": n.dialable,
                            "peer_id": n.peer_id,
                            "addr": n.addr,
                            "address": n.address,
                            "http_port": n.http_port,
                            "cheat": n.cheat,
                        }
                        for n in self.nodes.values()
                    },
                },
                indent=1,
            )
        )
        return list(self.nodes.values())

    def open_wan(self) -> None:
        """Build the WAN every node runs on (what crashed runs left behind is removed first).

        Raises `WanUnavailable` where namespaces cannot be made; `close()` takes it down again.
        """
        destroy_stale()
        links = draw_links(self.plan.wan_profiles(), self.plan.wan_seed)
        self.wan = Wan.create(links, seed=self.plan.wan_seed)

    def wan_facts(self) -> dict[str, Any]:
        """The WAN of the run (profile, each node's address and link), or {} on loopback."""
        wan = self.wan
        if wan is None:
            return {}
        return {
            "profile": self.plan.wan,
            "prefix": wan.prefix,
            "home_workers": self.plan.home_workers,
            "host_address": wan.host_address,
            "links": {
                name: {"address": wan.address(name), **dataclasses.asdict(link)}
                for name, link in wan.links.items()
            },
        }

    def close(self) -> None:
        """Stop every node still running, the ledger's chain, and take the WAN down. Idempotent."""
        self.stop_all()
        if self.ledger is not None:
            self.ledger.stop()
        if self.wan is not None and not self.wan.closed:
            # the emulator's counters (drops by reason: `dropped_nat` counts dials at a home worker)
            (self.folder / "wan-stats.json").write_text(json.dumps(self.wan.statistics(), indent=1))
            self.wan.close()

    @property
    def diloco_plan_path(self) -> Path:
        return self.folder / DILOCO_PLAN_FILE

    def write_diloco_plan(self) -> None:
        """The run's DilocoRun, signed by the lead (trainer-1), naming every trainer (spec/diloco.md)."""
        from swarmnode.node.diloco.plan import build_plan, checkpoint_digest, sign_plan
        from swarmnode.node.rl.run import DEVNET_MODEL, devnet_grpo
        from swarmnode.node.rl.tokenizer import load_tokenizer

        plan = self.plan
        model_dir = Path(plan.model) if plan.model else DEVNET_MODEL
        initial = checkpoint_digest(model_dir)
        trainers = [self.identities[n.name] for n in self.nodes.values() if n.role == "trainer"]
        signed = build_plan(
            plan.run,
            [t.address for t in trainers],
            model=model_dir,
            model_seed=0,
            initial=initial,
            rounds=plan.rounds,
            inner_steps=plan.inner_steps,
            inner_lr=devnet_grpo(load_tokenizer(model_dir)[1], plan.max_new_tokens).learning_rate,
            outer_lr=plan.outer_lr,
            outer_momentum=plan.outer_momentum,
            collect_timeout_ms=plan.round_timeout_ms,
            vote_timeout_ms=plan.round_timeout_ms,
        )
        self.diloco_plan_path.write_bytes(sign_plan(self.identities["trainer-1"], signed))

    def write_config(
        self,
        node: DevnetNode,
        *,
        bootstrap: tuple[str, ...],
        sections: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        config = NodeConfig(
            identity=node.directory / "node.key",
            run=self.plan.run,
            role=node.role,
            data_dir=node.data_dir,
            listen=f"/ip4/{node.host}/tcp/{node.port}",
            dialable=node.dialable,
            bootstrap=bootstrap,
            http_host=node.host,
            http_port=node.http_port,
            # every node, the bootstrap included: gossip authority (verdicts from eligible validators,
            # ledger entries from registered nodes) needs the ledger, or the bootstrap forwards forgeries
            ledger_url=self.ledger.url if self.ledger is not None else "",
            record_deliveries=self.plan.record_deliveries,
        )
        document = render_config(config, node.directory)
        if self.plan.steps and node.role in STAKED_ROLES:
            document["work"] = self.plan.work_section(
                node.name,
                node.role,
                plan_path=self.diloco_plan_path,
                lead=self.nodes["trainer-1"].address if "trainer-1" in self.nodes else "",
            )
        else:
            document.pop("work", None)
        for section, values in (self.plan.sections if sections is None else sections).items():
            document[section] = dict(values)
        node.config_path.write_text(tomli_w.dumps(document))

    def add_node(
        self, name: str, role: str, *, config_sections: Mapping[str, Mapping[str, Any]] | None = None
    ) -> DevnetNode:
        """An extra node (a probe, a late joiner) given only the bootstrap address."""
        directory = self.folder / name
        identity = NodeIdentity(secrets.token_bytes(32))
        save_keystore(identity, directory / "node.key", self.password, kdf_iterations=KDF_ITERATIONS)
        node = DevnetNode(name, role, directory, free_port(), identity.peer_id)
        self.nodes[name] = node
        self.write_config(node, bootstrap=(self.nodes["bootstrap"].addr,), sections=config_sections)
        return node

    def env(self) -> dict[str, str]:
        return {**os.environ, PASSWORD_ENV: self.password, "PYTHONUNBUFFERED": "1"}

    def start(self, name: str, *args: str, command: str = "run") -> DevnetNode:
        """Start a node process (non-blocking); its output goes to <node>/stdout.log."""
        node = self.nodes[name]
        module = "swarmnode.node.cli.run"
        argv = [sys.executable, "-m", module, command, "--config", str(node.config_path), *args]
        options: dict[str, Any] = {"env": self.env(), "cwd": str(node.directory), "start_new_session": True}
        with (node.directory / "stdout.log").open("ab") as log:
            if self.wan is not None and name in self.wan.links:
                node.process = self.wan.spawn(name, argv, stdout=log, stderr=subprocess.STDOUT, **options)
            else:
                node.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **options)
        return node

    def start_others(self) -> None:
        for name, node in self.nodes.items():
            if name != "bootstrap" and node.process is None:
                self.start(name)

    def not_ready(self, names: list[str]) -> list[str]:
        """Names not yet ready; raises if one of them exited."""
        waiting = []
        for name in names:
            node = self.nodes[name]
            if node.exit_code is not None:
                raise RuntimeError(f"{name} exited with {node.exit_code}; see {node.directory}/stdout.log")
            status = node.status()
            pid = node.process.pid if node.process is not None else None
            if status is None or not status.get("ready") or status.get("pid") != pid:
                waiting.append(name)
        return waiting

    def wait_ready(self, names: list[str], *, timeout: float) -> None:
        """Blocking wait (tests); `await_ready` is the trio flavour."""
        deadline = time.monotonic() + timeout
        while self.not_ready(names):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout}s: {self.not_ready(names)}")
            time.sleep(0.2)

    async def await_ready(self, names: list[str]) -> None:
        """Wait until `names` are ready (callers bound it with trio.fail_after)."""
        while self.not_ready(names):  # noqa: ASYNC110 - polls status files written by other processes
            await trio.sleep(0.2)

    def kill(self, name: str) -> None:
        """SIGKILL: no clean shutdown, no goodbye to peers."""
        node = self.nodes[name]
        if node.process is not None and node.process.poll() is None:
            node.process.kill()
            node.process.wait()

    def terminate(self, names: list[str] | None = None) -> None:
        for name in names or list(self.nodes):
            process = self.nodes[name].process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)

    def running(self) -> list[str]:
        return [
            n for n, node in self.nodes.items() if node.process is not None and node.process.poll() is None
        ]

    def stop_all(self, grace: float = STOP_GRACE) -> dict[str, int | None]:
        """SIGTERM every node, SIGKILL what is left after `grace` seconds; returns exit codes (blocking)."""
        self.terminate()
        deadline = time.monotonic() + grace
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self._kill_rest()

    async def stop_all_async(self, grace: float = STOP_GRACE) -> dict[str, int | None]:
        self.terminate()
        with trio.move_on_after(grace):
            while self.running():  # noqa: ASYNC110 - polls child processes, which signal nothing to trio
                await trio.sleep(0.1)
        return self._kill_rest()

    def _kill_rest(self) -> dict[str, int | None]:
        for name in self.running():
            self.kill(name)
        return {name: node.exit_code for name, node in self.nodes.items()}

    def statuses(self) -> dict[str, dict[str, Any] | None]:
        return {name: node.status() for name, node in self.nodes.items()}

    def trainer_done(self) -> bool:
        """Every trainer finished its steps (training runs)."""
        trainers = [n for n in self.nodes.values() if n.role == "trainer"]
        for node in trainers:
            work = (node.status() or {}).get("work") or {}
            if not work.get("done"):
                return False
        return bool(trainers)

    def discovered(self) -> bool:
        """Every role node is ready and has found a verified provider of each role it needs."""
        for node in self.nodes.values():
            if node.role not in ("trainer", "relay", "worker", "validator"):
                continue
            status = node.status()
            if status is None or not status.get("ready"):
                return False
            found = status.get("providers_found", {})
            if not all(found.get(role) for role in status.get("needs", [])):
                return False
        return True


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
        state = "ready" if status.get("ready") else "starting"
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


CHEAT_ORDER = ("perturbed-model", "tampered-prompt", "forged-reward")


@click.command("devnet")
@click.option(
    "--steps",
    type=int,
    default=0,
    show_default=True,
    help="Train for this many GRPO steps on the swarm, then stop and report (0: only run the network). "
    "With several --trainers, each trainer's GRPO steps: ceil(N / --inner-steps) DiLoCo rounds.",
)
@click.option(
    "--inner-steps",
    type=int,
    default=3,
    show_default=True,
    help="With several --trainers: GRPO steps each trainer takes between two DiLoCo syncs (H).",
)
@click.option(
    "--outer-lr", type=float, default=0.7, show_default=True, help="With several --trainers: DiLoCo outer lr."
)
@click.option(
    "--outer-momentum",
    type=float,
    default=0.9,
    show_default=True,
    help="With several --trainers: DiLoCo outer Nesterov momentum (0 and --outer-lr 1: plain averaging).",
)
@click.option(
    "--cheaters",
    type=int,
    default=0,
    show_default=True,
    help="Extra dishonest workers, cycling through: " + ", ".join(CHEAT_ORDER) + ".",
)
@click.option(
    "--ledger",
    "ledger_kind",
    type=click.Choice(["signed", "evm"]),
    default="signed",
    show_default=True,
    help="signed: a signed log in the devnet folder; evm: a local anvil chain started for the run.",
)
@click.option(
    "--summary", "summary_path", type=click.Path(path_type=Path), help="Also write the summary JSON here."
)
@click.option("--threads", type=int, default=1, show_default=True, help="Torch threads per node process.")
@click.option(
    "--trainers",
    type=int,
    default=1,
    show_default=True,
    help="Trainers of the run; more than one train together with DiLoCo (trainer-1 leads).",
)
@click.option("--relays", type=int, default=2, show_default=True)
@click.option("--workers", type=int, default=3, show_default=True, help="Honest workers.")
@click.option("--validators", type=int, default=1, show_default=True)
@click.option("--run", "run_id", default="devnet", show_default=True, help="Run id.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Folder for keys, configs, data and logs (default devnet-runs/<time>).",
)
@click.option(
    "--duration", type=float, default=0.0, help="Stop after this many seconds (0: run until Ctrl-C)."
)
@click.option("--until-discovered", is_flag=True, help="Stop once every node found every role it needs.")
@click.option("--record-deliveries", is_flag=True, help="Nodes log every delivered gossip message.")
@click.option(
    "--probe-rate",
    type=float,
    default=0.0,
    help="Once discovery completes, a probe node publishes test messages on `shards` at this rate.",
)
@click.option(
    "--no-live", is_flag=True, help="No live table (for logs and CI); prints the summary at the end."
)
@run_model_options
@eval_tasks_option
@click.option(
    "--engine",
    type=click.Choice(["auto", "transformers", "vllm"]),
    default="auto",
    show_default=True,
    help="Inference engine of workers and validators: vllm needs CUDA and `pip install swarmnode[vllm]`.",
)
@click.option(
    "--trainer-nproc",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Ranks of each trainer's FSDP2 process group (gloo on CPU, NCCL on GPUs).",
)
@click.option(
    "--wan",
    "wan_profile",
    type=click.Choice(sorted(PROFILES)),
    default=None,
    help="Run every node in its own network namespace on an emulated WAN (needs root): "
    "lan = 1 ms RTT, 1 Gbit/s; continental = 50 ms RTT, 1 Gbit/s; global = 150-300 ms RTT, "
    "20-200 Mbit/s per node, 0.5% loss; home = 40 ms RTT, 10 Mbit/s up / 50 down, behind NAT.",
)
@click.option(
    "--home-workers",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="With --wan: the first K honest workers are home workers behind NAT (dial out, never dialed).",
)
def devnet_command(
    steps: int,
    inner_steps: int,
    outer_lr: float,
    outer_momentum: float,
    cheaters: int,
    ledger_kind: str,
    summary_path: Path | None,
    threads: int,
    trainers: int,
    relays: int,
    workers: int,
    validators: int,
    run_id: str,
    out: Path | None,
    duration: float,
    until_discovered: bool,
    record_deliveries: bool,
    probe_rate: float,
    no_live: bool,
    model: Path | None,
    tasks: Path | None,
    eval_tasks: Path | None,
    max_new_tokens: int,
    engine: str,
    trainer_nproc: int,
    wan_profile: str | None,
    home_workers: int,
) -> None:
    """Run a swarm of separate node processes on 127.0.0.1 (or an emulated WAN) and show live status.

    With --steps N it is the whole training run of DESIGN.md on loopback: bootstrap, trainer, relays,
    workers (--cheaters more that cheat), validators, a ledger every role is staked and registered in.
    It ends with a summary table, a PNG plot and the final ledger, in the devnet folder.
    """
    cheats = tuple(CHEAT_ORDER[i % len(CHEAT_ORDER)] for i in range(cheaters))
    plan = DevnetPlan(
        trainers,
        relays,
        workers,
        validators,
        run_id,
        record_deliveries,
        steps=steps,
        cheaters=cheats,
        ledger=ledger_kind if steps else "",
        threads=threads,
        inner_steps=inner_steps,
        outer_lr=outer_lr,
        outer_momentum=outer_momentum,
        model=str(model.resolve()) if model else "",
        tasks=str(tasks.resolve()) if tasks else "",
        eval_tasks=str(eval_tasks.resolve()) if eval_tasks else "",
        engine=engine,
        max_new_tokens=max_new_tokens,
        trainer_nproc=trainer_nproc,
        wan=wan_profile or "",
        home_workers=home_workers,
    )
    if home_workers and not wan_profile:
        raise click.UsageError("--home-workers needs --wan (home workers are behind NAT on a WAN)")
    if home_workers > workers:
        raise click.UsageError(f"--home-workers {home_workers} exceeds --workers {workers}")
    if steps and not (1 <= trainers <= 16 and validators >= 1 and relays >= 1 and workers + cheaters >= 1):
        raise click.UsageError(
            "a training run needs 1 to 16 trainers, and at least 1 relay, worker and validator"
        )
    if inner_steps < 1:
        raise click.UsageError("--inner-steps must be at least 1")
    devnet = Devnet(plan, out or default_folder())
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)  # logs and CI: the tables are wider than the 80-column default
    previous = signal.signal(signal.SIGTERM, _interrupt)  # set-up and teardown too end in `close()`
    try:
        try:
            devnet.prepare()
        except WanUnavailable as exc:
            raise click.ClickException(f"--wan needs network namespaces: {exc}") from None
        except (RuntimeError, OSError, WanError) as exc:
            raise click.ClickException(f"cannot set the devnet up: {exc}") from None
        console.print(f"devnet folder: [bold]{devnet.folder}[/]  ({len(devnet.nodes)} nodes)")
        if devnet.wan is not None:
            homes = f", {home_workers} home worker(s) behind NAT" if home_workers else ""
            console.print(f"WAN: {wan_profile} profile, subnet {devnet.wan.subnet}{homes}")
        if devnet.ledger is not None:
            console.print(f"ledger: {devnet.ledger.url} (every role node registered and staked)")
        summary = _run(devnet, console, duration, until_discovered, no_live, probe_rate)
        if steps:
            _report(devnet, summary, console, summary_path)
    finally:
        devnet.close()
        signal.signal(signal.SIGTERM, previous)
    failed = {n: c for n, c in summary["exit_codes"].items() if c not in (0, None)}
    if failed:
        raise click.ClickException(f"nodes did not stop cleanly: {failed}")
    if until_discovered and summary["reason"] != "discovered":
        raise click.ClickException(f"discovery did not complete ({summary['reason']})")
    if steps and summary["reason"] != "trained":
        raise click.ClickException(f"the run did not finish its {steps} steps ({summary['reason']})")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run(
    devnet: Devnet,
    console: Console,
    duration: float,
    until_discovered: bool,
    no_live: bool,
    probe_rate: float,
) -> dict[str, Any]:
    summary = trio.run(
        lambda: run_devnet(
            devnet,
            duration=duration,
            until_discovered=until_discovered,
            live=not no_live,
            console=console,
            probe_rate=probe_rate,
        )
    )
    if no_live:
        console.print(status_table(devnet, summary["elapsed_s"]))
    console.print()
    console.print(f"stopped ({summary['reason']}); data dirs and logs in [bold]{devnet.folder}[/]")
    return summary


def _report(devnet: Devnet, run_summary: dict[str, Any], console: Console, path: Path | None) -> None:
    """Held-out reward before and after, the final ledger, the tables, the plot and the JSON."""
    from swarmnode.node.devnet.report import (
        NodeFacts,
        ReportInputs,
        build_summary,
        plot_summary,
        summary_tables,
    )
    from swarmnode.node.devnet.rl import (
        eval_tasks_of,
        final_checkpoint,
        held_out_rewards,
        ledger_facts,
        write_json,
    )

    assert devnet.ledger is not None
    console.print("measuring the held-out reward of the base and the final checkpoint ...")
    trainer = next(n for n in devnet.nodes.values() if n.role == "trainer")
    final = final_checkpoint(trainer.data_dir, devnet.plan.run)
    plan = devnet.plan
    eval_tasks = eval_tasks_of(plan.tasks, plan.eval_tasks)
    base_reward, final_reward = held_out_rewards(
        final[1] if final is not None else None, plan.model, eval_tasks, plan.max_new_tokens
    )
    facts = ledger_facts(devnet.ledger)
    stakes_before = {
        n.address.lower(): DEVNET_STAKE_GWEI for n in devnet.nodes.values() if n.role in STAKED_ROLES
    }
    inputs = ReportInputs(
        run=devnet.plan.run,
        steps=devnet.plan.steps,
        elapsed_s=run_summary["elapsed_s"],
        ledger_kind=devnet.ledger.kind,
        ledger_url=devnet.ledger.url,
        ledger_verified=facts.verified,
        base_reward=base_reward,
        final_reward=final_reward if final_reward is not None else base_reward,
        nodes=[
            NodeFacts(
                name=n.name,
                role=n.role,
                address=n.address,
                cheat=n.cheat,
                stake_before_gwei=stakes_before.get(n.address.lower()),
                stake_after_gwei=facts.stakes.get(n.address.lower()),
            )
            for n in devnet.nodes.values()
            if n.role in STAKED_ROLES
        ],
        statuses={name: status for name, status in run_summary["nodes"].items() if status is not None},
        ledger_slashes=facts.slashes,
        ledger_contributions=facts.contributions,
        ledger_batches=facts.batches,
        wan=devnet.wan_facts() or None,
    )
    summary = build_summary(inputs)
    write_json(devnet.folder / "devnet-summary.json", summary)
    if path is not None:
        write_json(path, summary)
    plot = plot_summary(summary, devnet.folder / "devnet.png")
    for table in summary_tables(summary):
        console.print(table)
    console.print(f"plot: [bold]{plot}[/]  summary: [bold]{devnet.folder / 'devnet-summary.json'}[/]")
