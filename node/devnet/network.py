"""`Devnet`: a whole swarm of separate node processes on this machine, and the harness that runs them.

One bootstrap node starts first; every other node (trainer, relays, workers, validators) is given only
the bootstrap address and finds the rest through the DHT. Each node gets its own key, config, data
directory and log under one folder, which stays after the run; nodes write `status.json` every second.
On a WAN (`node.wan`) each node runs in its own network namespace and listens on its WAN address.
Stopping is SIGTERM to every node, SIGKILL after a grace period.

`Devnet` is also the harness the multi-process tests and the network benchmark drive directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import click
import tomli_w
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.keystore import PASSWORD_ENV, save_keystore
from swarmnode.node.config import NodeConfig, render_config
from swarmnode.node.devnet.plan import LOOPBACK, DevnetNode, DevnetPlan
from swarmnode.node.devnet.rl import STAKED_ROLES, DevnetLedger, write_games, write_products
from swarmnode.node.p2p.ports import free_port
from swarmnode.node.wan import Wan, destroy_stale, draw_links

KDF_ITERATIONS = 2  # devnet keys only: fast to open, useless to protect anything
# SIGTERM to SIGKILL. A node's clean exit ends with the interpreter's final garbage collection over torch's
# objects: measured 7.6-8.1 s for every role, on loopback and on a WAN alike, on a loaded 2-core machine.
STOP_GRACE = 30.0
WAN_P2P_PORT = 4001  # on a WAN every node has its own address, so every node uses the same ports
WAN_HTTP_PORT = 8080
DILOCO_PLAN_FILE = "diloco-plan.bin"


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
            tasks=self.plan.tasks,
            environment=self.plan.environment,
        )

    def prepare(self) -> list[DevnetNode]:
        if self.folder.exists():
            raise click.ClickException(
                f"{self.folder} already exists; pass a new --out (runs are never overwritten)"
            )
        if self.plan.wan:
            self.open_wan()  # first: where namespaces cannot be made, nothing is left behind
        self.folder.mkdir(parents=True)
        if self.plan.environment == "guess" and not self.plan.tasks:  # the additions are no games
            train, held_out = write_games(self.folder)
            held = self.plan.eval_tasks or str(held_out)
            self.plan = dataclasses.replace(self.plan, tasks=str(train), eval_tasks=held)
        if self.plan.environment == "calculator" and not self.plan.model:  # its prompt needs its own model
            from swarmnode.node.rl.run import DEVNET_CALC_MODEL

            train, held_out = write_products(self.folder)
            self.plan = dataclasses.replace(self.plan, model=str(DEVNET_CALC_MODEL), tasks=self.plan.tasks or
                                            str(train), eval_tasks=self.plan.eval_tasks or str(held_out))
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
                metrics_port=free_port() if wan is None else 0,  # a namespace's 127.0.0.1 is its own
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
                            "metrics_port": n.metrics_port,
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
            metrics_port=node.metrics_port,
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

    def wait_until(
        self, predicate: Callable[[], bool], timeout: float, what: str, *, down: Collection[str] = ()
    ) -> None:
        """Blocking poll (tests) until `predicate`; fails at once when a node exited that is not among those
        `down` on purpose, and names `what` it waited for on a timeout."""
        deadline = time.monotonic() + timeout
        while not predicate():
            crashed = {
                name: node.exit_code
                for name, node in self.nodes.items()
                if name not in down and node.exit_code not in (None, 0)
            }
            if crashed:
                raise AssertionError(f"{crashed} exited while waiting for {what}; logs in {self.folder}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout} s; logs in {self.folder}")
            time.sleep(0.25)

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

    def without_signal(self) -> str | None:
        """A trainer's report that the run has no learning signal (spec/rollouts.md), if any."""
        for node in self.nodes.values():
            if node.role == "trainer":
                signal = ((node.status() or {}).get("work") or {}).get("signal") or {}
                if signal.get("starved"):
                    return f"{node.name}: {signal.get('message', 'no learning signal')}"
        return None

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
