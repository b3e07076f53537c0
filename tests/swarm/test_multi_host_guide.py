"""docs/multi-host.md, followed literally: three hosts (network namespaces on one bridge), a chain ledger.

The guide's command blocks marked `<!-- host: ... -->` run in order, each on its host(s) as the host's own
shell would run it: `sh -e` in the host's namespace, from `~/swarm` of a home folder of its own, with the
exports of the host's earlier blocks (a reader types them once per host). A `<NAME>` placeholder is
replaced by what the guide's table says prints it, read from that command's output, as a reader copies it
by hand. `terminal` blocks are long-running (the chain, each `swarmnode run`): started in the background,
and the next block waits until that node says `ready` in its status file (the chain: `Listening on`).
Before the `check` blocks the test waits until the trainer has stepped and the chain holds credits.

What cannot be literal: the hosts share this machine's disk, so `scp HOST:PATH` is a small stand-in that
copies PATH from that host's home folder (no ssh between namespaces), and the install step is this
checkout (`~/swarmnode` links to it). Slow; root only (skipped with the reason without namespaces, `ip`,
anvil or curl). About 2 minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from swarmnode.node.config import load_config
from swarmnode.node.wan import WanUnavailable, check_available
from swarmnode.node.wan.netns import destroy, destroy_stale, run_ip
from swarmnode.testing.ledger import find_anvil

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "multi-host.md"
TRAINER_STEPS = 2  # the run trains: at least this many GRPO steps
BLOCK_TIMEOUT_S = 180.0
READY_TIMEOUT_S = 120.0
TRAIN_TIMEOUT_S = 240.0
CREDIT_TIMEOUT_S = 90.0
STOP_GRACE_S = 10.0
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_BLOCK = re.compile(r"<!-- host: ([^>]*?) -->\s*\n```sh\n(.*?)\n```", re.DOTALL)
_PLACEHOLDER = re.compile(r"<([A-Z][A-Z_]*)>")
_RUN_CONFIG = re.compile(r"swarmnode run --config (\S+)")


@dataclass(frozen=True)
class Capture:
    """Where a placeholder's value is printed: on `host`, by a block running `command`, matching `pattern`."""

    host: str
    command: str
    pattern: str


# What the guide's table (step 3) tells a reader to copy, and from where.
CAPTURES = {
    "CONTRACT": Capture("A", "swarmnode ledger deploy", r"deployed evm ledger at (0x[0-9a-fA-F]{40})"),
    "BOOTSTRAP": Capture("A", "swarmnode init bootstrap", r"give the other nodes this address: (/ip4/\S+)"),
    "VALIDATOR": Capture(
        "B", "swarmnode keys show --key validator/node.key", r"address\s+(0x[0-9a-fA-F]{40})"
    ),
}


@dataclass(frozen=True)
class Block:
    hosts: tuple[str, ...]
    kind: str  # "" (run it and wait), "terminal" (start it, wait for ready) or "check" (after training)
    text: str


def guide_blocks(text: str) -> list[Block]:
    """The marked ```sh blocks, in order: `<!-- host: A B C -->`, `<!-- host: A, terminal -->`."""
    blocks = []
    for marker, body in _BLOCK.findall(text):
        hosts, _, kind = marker.partition(",")
        blocks.append(Block(tuple(hosts.split()), kind.strip(), body))
    return blocks


def host_addresses(blocks: list[Block]) -> dict[str, str]:
    """HOST_X=ADDRESS, as the guide's first block exports them on every host."""
    return dict(re.findall(r"HOST_([A-Z])=(\S+)", blocks[0].text))


def test_the_guide_marks_its_blocks_and_names_every_placeholder() -> None:
    """Fast: the structure the slow test follows, and the guide's placeholder table is the test's."""
    text = GUIDE.read_text()
    blocks = guide_blocks(text)
    hosts = host_addresses(blocks)
    assert set(hosts) == {"A", "B", "C"} and blocks[0].hosts == ("A", "B", "C")
    assert all(set(b.hosts) <= set(hosts) and b.kind in ("", "terminal", "check") for b in blocks)
    used = {name for b in blocks for name in _PLACEHOLDER.findall(b.text)}
    assert used == set(CAPTURES), used
    for name, capture in CAPTURES.items():
        assert f"| `<{name}>` | {capture.host} |" in text, name  # the table a reader follows
        assert any(capture.command in b.text and capture.host in b.hosts for b in blocks), name
    roles = [load_role(b.text) for b in blocks if b.kind == "terminal" and _RUN_CONFIG.search(b.text)]
    assert roles == ["bootstrap", "trainer", "relay", "validator", "worker"]
    assert "docs/multi-host.md" in (ROOT / "README.md").read_text()


def load_role(text: str) -> str:
    match = _RUN_CONFIG.search(text)
    assert match is not None
    return Path(match.group(1)).parent.name


# --- the three hosts ---------------------------------------------------------------------------------


class Hosts:
    """Three namespaces on one bridge, each with a home folder, its shell's exports and its terminals."""

    def __init__(self, folder: Path, addresses: dict[str, str]) -> None:
        self.prefix = f"swan{os.getpid()}-0"  # netns.destroy/destroy_stale know this form: crash-safe
        self.folder = folder
        self.addresses = addresses
        self.values: dict[str, str] = {}
        self.terminals: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.transcript = folder / "transcript.txt"

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def home(self, host: str) -> Path:
        return self.folder / f"host-{host}"

    def workdir(self, host: str) -> Path:
        return self.home(host) / "swarm"

    def env_file(self, host: str) -> Path:
        return self.folder / f"env-{host}.sh"

    def build(self) -> None:
        """The bridge in a namespace of its own, then each host on it (nothing in the root namespace)."""
        lan = self.namespace("lan")
        run_ip(["netns", "add", lan])
        bridge = "link set lo up\nlink add br0 type bridge\nlink set br0 up\n"
        run_ip(["-batch", "-"], namespace=lan, stdin=bridge)
        for host, address in self.addresses.items():
            self._connect(host, address, lan)
            self._install(host)

    def _connect(self, host: str, address: str, lan: str) -> None:
        """The host's namespace, its eth0 (ADDRESS/24) a veth whose other end is a port of the bridge."""
        ns, port = self.namespace(host), f"v{host}"
        run_ip(["netns", "add", ns])
        run_ip(["link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns], namespace=lan)
        run_ip(["link", "set", port, "master", "br0", "up"], namespace=lan)
        commands = f"link set lo up\naddr add {address}/24 dev eth0\nlink set eth0 up\n"
        run_ip(["-batch", "-"], namespace=ns, stdin=commands)

    def _install(self, host: str) -> None:
        """What step 1 leaves on a host: the checkout at ~/swarmnode, its commands (anvil on A) on PATH."""
        self.workdir(host).mkdir(parents=True)
        (self.home(host) / "swarmnode").symlink_to(ROOT)
        anvil = find_anvil()
        assert anvil is not None
        path = [str(self.folder / "bin"), str(ROOT / ".venv" / "bin")]
        path += [str(Path(anvil).parent)] if host == "A" else []
        exports = {"PATH": ":".join([*path, SYSTEM_PATH]), "HOME": str(self.home(host)), "LANG": "C.UTF-8"}
        self.env_file(host).write_text("".join(f"export {k}='{v}'\n" for k, v in exports.items()))

    def write_scp(self) -> None:
        """`scp [-r] HOST:PATH... DEST` between these hosts: PATH under that host's home (no ssh here)."""
        homes = {address: str(self.home(host)) for host, address in self.addresses.items()}
        script = self.folder / "bin" / "scp"
        script.parent.mkdir()
        script.write_text(SCP_STAND_IN.format(python=sys.executable, homes=json.dumps(homes)))
        script.chmod(0o755)

    def substitute(self, text: str) -> str:
        """Each `<NAME>` replaced by the value the guide says prints it, as a reader types it."""
        missing = sorted(set(_PLACEHOLDER.findall(text)) - set(self.values))
        assert not missing, f"{missing} used before the guide's steps printed them:\n{text}"
        return _PLACEHOLDER.sub(lambda m: self.values[m.group(1)], text)

    def shell(self, host: str, script: str) -> list[str]:
        """`sh -e` in the host's namespace, with the exports its earlier blocks left."""
        script = f". {self.env_file(host)}\n{script}"
        return ["ip", "netns", "exec", self.namespace(host), "sh", "-ec", script]

    def run(self, host: str, text: str) -> str:
        """A block on one host, keeping its exports for the host's next blocks; its output."""
        script = f"{text}\nexport -p > {self.env_file(host)}"
        done = subprocess.run(
            self.shell(host, script), cwd=self.workdir(host), env={"PATH": SYSTEM_PATH},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT_S,
        )  # fmt: skip
        with self.transcript.open("a") as log:
            log.write(f"\n=== host {host} (exit {done.returncode})\n{text}\n--- output\n{done.stdout}")
        assert done.returncode == 0, f"host {host}: the guide's block failed:\n{text}\n{done.stdout[-4000:]}"
        return done.stdout

    def capture(self, host: str, text: str, output: str) -> None:
        for name, where in CAPTURES.items():
            if name not in self.values and where.host == host and where.command in text:
                match = re.search(where.pattern, output)
                assert match, f"{where.command} printed no {name} on host {host}:\n{output[-2000:]}"
                self.values[name] = match.group(1)

    def start(self, host: str, text: str) -> Path:
        """A terminal: the block in the background (its own process group), its output in a log."""
        log = self.folder / f"terminal-{host}-{len(self.terminals)}.log"
        with log.open("wb") as out:  # the terminal keeps its own descriptor
            process = subprocess.Popen(
                self.shell(host, text), cwd=self.workdir(host), env={"PATH": SYSTEM_PATH},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.terminals.append((text, process, log))
        return log

    def check_terminals(self) -> None:
        for text, process, log in self.terminals:
            if process.poll() is not None:
                raise AssertionError(f"`{text}` exited ({process.returncode}):\n{log.read_text()[-4000:]}")

    def stop(self) -> None:
        """Every terminal (SIGTERM, as Ctrl-C), then what is left in the namespaces, then the namespaces."""
        for _, process, _ in self.terminals:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for _, process, _ in self.terminals:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        destroy(self.prefix)


SCP_STAND_IN = '''#!{python}
"""scp between the test's hosts: HOST:PATH is PATH under that host's home folder."""
import shutil, sys
from pathlib import Path
HOMES = {homes}
*sources, dest = [a for a in sys.argv[1:] if not a.startswith("-")]
for source in sources:
    host, _, path = source.partition(":")
    src = Path(HOMES[host]) / path
    target = Path(dest) / src.name if Path(dest).is_dir() else Path(dest)
    (shutil.copytree if src.is_dir() else shutil.copy2)(src, target)
'''


# --- waiting -----------------------------------------------------------------------------------------


def wait_for(condition: Callable[[], Any], timeout: float, what: str, hosts: Hosts) -> Any:
    """Poll `condition` until it returns something truthy; fail naming `what` (and any node that died)."""
    deadline = time.monotonic() + timeout
    while True:
        hosts.check_terminals()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s; transcript and logs in {hosts.folder}")
        time.sleep(0.5)


def status(path: Path) -> dict[str, Any]:
    """A node's status.json, or {} while it is not (completely) written."""
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return document if isinstance(document, dict) else {}


def step(path: Path) -> int:
    """The trainer's GRPO step, from its status file."""
    return int((status(path).get("work") or {}).get("step", 0))


def wait_ready(hosts: Hosts, host: str, text: str, log: Path) -> None:
    """What the guide has the reader wait for: `ready` in the node's status (the chain: `Listening on`)."""
    match = _RUN_CONFIG.search(text)
    if match is None:
        wait_for(lambda: b"Listening on" in log.read_bytes(), READY_TIMEOUT_S, f"`{text}` listening", hosts)
        return
    data_dir = load_config(hosts.workdir(host) / match.group(1)).data_dir
    wait_for(lambda: status(data_dir / "status.json").get("ready"), READY_TIMEOUT_S, f"{text} ready", hosts)


def wait_trained(hosts: Hosts) -> list[dict[str, Any]]:
    """The trainer's steps, then the chain's credits for the worker (what the guide's checks show)."""
    trainer = load_config(hosts.workdir("A") / "trainer" / "node.toml")
    worker = load_config(hosts.workdir("C") / "worker" / "node.toml")
    steps = trainer.data_dir / "status.json"
    wait_for(lambda: step(steps) >= TRAINER_STEPS, TRAIN_TIMEOUT_S, f"trainer step {TRAINER_STEPS}", hosts)
    address = status(worker.data_dir / "status.json")["address"]

    def credits() -> list[dict[str, Any]]:
        output = hosts.run("C", f"swarmnode ledger contributions --run {trainer.run} --json")
        records = json.loads(output.strip().splitlines()[-1])["contributions"]
        return [r for r in records if r["worker"] == address]

    return wait_for(credits, CREDIT_TIMEOUT_S, "credits for the worker on the chain", hosts)


# --- the walk-through --------------------------------------------------------------------------------


def require_hosts() -> None:
    if os.geteuid() != 0:
        pytest.skip("three network namespaces need root")
    try:
        check_available()
    except WanUnavailable as err:
        pytest.skip(str(err))
    if find_anvil() is None:
        pytest.skip("no anvil binary: scripts/install_anvil.sh installs it")
    if shutil.which("curl") is None:
        pytest.skip("the guide funds keys with curl, which is not installed")


def follow(hosts: Hosts, blocks: list[Block]) -> list[dict[str, Any]]:
    """Every block in order on its hosts; the worker's credits once the checks may run."""
    credited: list[dict[str, Any]] = []
    for block in blocks:
        if block.kind == "check" and not credited:
            credited = wait_trained(hosts)
        for host in block.hosts:
            text = hosts.substitute(block.text)
            if block.kind == "terminal":
                wait_ready(hosts, host, text, hosts.start(host, text))
                continue
            output = hosts.run(host, text)
            hosts.capture(host, block.text, output)
            if block.kind == "check":
                hosts.check_terminals()
    return credited


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_a_run_trains_across_three_hosts_following_the_guide(tmp_path: Path) -> None:
    require_hosts()
    destroy_stale()  # what a crashed run of this test (its pid gone) left behind
    blocks = guide_blocks(GUIDE.read_text())
    hosts = Hosts(tmp_path, host_addresses(blocks))
    started = time.monotonic()
    try:
        hosts.build()
        hosts.write_scp()
        credited = follow(hosts, blocks)
    finally:
        hosts.stop()
    assert credited and all(r["run"] == "demo" for r in credited), credited
    assert sum(r["tokens"] for r in credited) > 0
    print(f"followed {len(blocks)} blocks in {time.monotonic() - started:.0f} s; see {hosts.transcript}")
