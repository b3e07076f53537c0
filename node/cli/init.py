"""`swarmnode init ROLE [DIR]`: a node's folder to start from: a commented node.toml, a key, free ports,
and the commands that come next.

What a new operator otherwise learns by trial: every node on a host needs its own listen, HTTP and metrics
ports; the bootstrap address carries the bootstrap's peer id; the trainer registers its run itself (with
`[work] run_validators`) while the others register their role and stake; a signed-log ledger is one file
every node opens (one host, or a shared mount), so nodes on several hosts use a chain (`evm:`). The file
`init` writes says so where it matters, and loads (`load_config`) before it is kept. `render_node_toml` is
pure: the committed examples (examples/*.toml) are its output, and a test keeps them so.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

import click

from swarmnode.node.config import ROLE_NAMES, ConfigError, load_config
from swarmnode.node.p2p.ports import free_ports
from swarmnode.node.worker.eligibility import ledger_cli_args

CONFIG_FILE = "node.toml"
LEDGER_ENV, CONTRACT_ENV = "SWARMNODE_LEDGER", "SWARMNODE_CONTRACT"  # what the other ledger commands read
KEY_FILE = "node.key"
STAKED_ROLES = ("trainer", "relay", "worker", "validator")


@dataclass(frozen=True)
class NodePlan:
    """Everything `init` puts in a node.toml."""

    role: str
    run: str
    ledger: str
    listen_host: str
    p2p_port: int
    http_host: str
    http_port: int
    metrics_port: int
    bootstrap: tuple[str, ...] = ()
    announce: tuple[str, ...] = ()
    model: str = ""
    tasks: str = ""
    run_validators: tuple[str, ...] = ()


def _toml_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def render_node_toml(plan: NodePlan) -> str:
    """The commented node.toml of `plan` (paths relative to the file)."""
    bootstrap = (
        f"bootstrap = {_toml_list(plan.bootstrap)}"
        if plan.bootstrap
        else '# bootstrap = ["/ip4/HOST/tcp/PORT/p2p/PEER_ID"]   # what `swarmnode init bootstrap` printed'
    )
    if plan.role == "bootstrap":
        bootstrap = "# a bootstrap needs no bootstrap: the other nodes dial this one"
    lines = [
        f"# swarmnode {plan.role} of run {plan.run!r}, from `swarmnode init` (every key: node/config.py)",
        "",
        "[node]",
        f'role = "{plan.role}"',
        f'run = "{plan.run}"',
        f'identity = "{KEY_FILE}"                    # this node\'s key, relative to this file',
        'data_dir = "data"                      # its state, logs and status.json (`swarmnode status`)',
        f'listen = "/ip4/{plan.listen_host}/tcp/{plan.p2p_port}"   # each node on a host needs its own port',
        *(
            [f"announce = {_toml_list(plan.announce)}   # what peers dial (0.0.0.0 names no address)"]
            if plan.announce
            else []
        ),
        bootstrap,
        "# ledger: signed:PATH is one SQLite file every node of the run opens (one host, or a shared mount);",
        "# nodes on several hosts share a chain: evm:http://HOST:8545#0xCONTRACT (the ledger contract on it)",
        f'ledger_url = "{plan.ledger}"',
        f'http_host = "{plan.http_host}"             # the data plane (checkpoint shards), as peers reach it',
        f"http_port = {plan.http_port}",
        f"metrics_port = {plan.metrics_port}                   # Prometheus /metrics on 127.0.0.1 (0: off)",
        'log_level = "INFO"                     # DEBUG also prints the traceback of an error',
        "",
        "[work]",
    ]
    if plan.role in ("trainer", "worker", "validator"):
        lines += [
            "# the run's model folder and task file: the same files on every trainer, worker and validator",
            "# (relative to this file; empty: the devnet's built-in model and tasks)",
            f'model = "{plan.model}"',
            f'tasks = "{plan.tasks}"',
        ]
    if plan.role == "trainer":
        lines += [
            "# the trainer registers the run on the ledger as it starts, naming the validators it trusts",
            f"run_validators = {_toml_list(plan.run_validators)}",
            "challenge_window_epochs = 24          # epochs a slash waits, voidable, before it takes stake",
            "steps = 0                             # GRPO steps, then stop (0: train until stopped)",
        ]
    if plan.role in ("worker", "validator"):
        lines.append("max_challenge_window_epochs = 168     # refuse runs whose slashes pend longer")
    if plan.role == "worker":
        lines.append("submissions_per_version = 4           # rollouts sent per checkpoint version at most")
    if plan.role == "bootstrap":
        lines.append("# a bootstrap only routes: no work to configure")
    if plan.role == "relay":
        lines.append("# a relay re-serves the trainer's checkpoint shards: nothing to configure")
    return "".join(_aligned(line) + "\n" for line in lines)


COMMENT_COLUMN = 40


def _aligned(line: str) -> str:
    """A `key = value   # why` line with its comment at COMMENT_COLUMN (values hold no '  #')."""
    code, sep, comment = line.partition("  # ")
    if not sep or line.startswith("#"):
        return line
    return f"{code.rstrip():<{COMMENT_COLUMN - 1}} # {comment.strip()}"


def next_steps(plan: NodePlan, folder: Path, peer_id: str, announce_host: str) -> list[str]:
    """The commands after `init`, in order, for this role."""
    config, key = folder / CONFIG_FILE, folder / KEY_FILE
    ledger = f"{ledger_cli_args(plan.ledger)} --key {key}"
    steps = []
    if plan.role == "bootstrap":
        address = f"/ip4/{announce_host}/tcp/{plan.p2p_port}/p2p/{peer_id}"
        steps.append(f"give the other nodes this address: {address}")
    else:
        steps += [
            f"swarmnode register --role {plan.role} --accelerator cpu --count 1 --memory-gb 16 {ledger}",
            f"swarmnode stake status {ledger}   # then: swarmnode stake deposit AMOUNT {ledger}",
        ]
    if plan.role == "trainer" and not plan.run_validators:
        steps.append(f"put your validators' addresses in run_validators of {config}")
    if plan.role != "bootstrap" and not plan.bootstrap:
        steps.append(f"put the bootstrap's address in bootstrap of {config}")
    steps += [f"swarmnode run --config {config}", f"swarmnode status {config}   # from another terminal"]
    return steps


def example_plan(role: str) -> NodePlan:
    """The plan of examples/ROLE.toml: one host, the bootstrap on 4001, each role its own ports."""
    index = ROLE_NAMES.index(role) if role != "bootstrap" else -1
    return NodePlan(
        role=role, run="my-run", ledger="signed:/srv/swarm/ledger.db", listen_host="127.0.0.1",
        p2p_port=4002 + index, http_host="127.0.0.1", http_port=8081 + index, metrics_port=9101 + index,
        bootstrap=() if role == "bootstrap" else (EXAMPLE_BOOTSTRAP,),
        model="../models/my-model" if role in ("trainer", "worker", "validator") else "",
        tasks="../tasks/train.jsonl" if role in ("trainer", "worker", "validator") else "",
        run_validators=(EXAMPLE_VALIDATOR,) if role == "trainer" else (),
    )  # fmt: skip


def listen_and_announce(listen_host: str, announce_host: str) -> tuple[str, bool]:
    """Where the node listens, and whether its config must announce `announce_host`.

    A node listening on 0.0.0.0 announces none of its addresses (`node.p2p.host.announced_addrs`: nobody
    can dial the unspecified address), so peers that find it in the DHT cannot dial it: it names the
    address other hosts reach it at. A node reached on loopback only (one host) listens there instead,
    since a loopback address may not be announced."""
    try:
        loopback = ipaddress.IPv4Address(announce_host).is_loopback
    except ValueError:
        message = f"{announce_host!r} is not an IPv4 address"
        raise click.BadParameter(message, param_hint="--announce-host") from None
    if listen_host == "0.0.0.0":
        return (announce_host, False) if loopback else (listen_host, True)
    return listen_host, not loopback and listen_host != announce_host


def node_ledger_url(ledger: str, contract: str | None) -> str:
    """`[node] ledger_url` from the options the other ledger commands take: a signed log's absolute path
    (every node must open the same file, wherever it is started from), or `evm:URL#CONTRACT` (a node needs
    the contract's address, which `--ledger evm:URL` alone does not carry)."""
    if ledger.startswith("signed:"):
        return "signed:" + str(Path(ledger.removeprefix("signed:")).resolve())
    if not ledger.startswith("evm:") or "#" in ledger:
        return ledger
    if not contract:
        raise click.UsageError(
            f"an evm: ledger needs its contract: pass --contract 0xADDRESS (or set {CONTRACT_ENV}), "
            "the address `swarmnode ledger deploy` printed"
        )
    return f"{ledger}#{contract}"


EXAMPLE_BOOTSTRAP = "/ip4/127.0.0.1/tcp/4001/p2p/16Uiu2HAmMzhXFfZvscvA3Zui6tY4BCagzoNSQ26H8YjyEtmwSxgS"
EXAMPLE_VALIDATOR = "0x8223818D5a51c3236958758Fb716b3573898E3E1"


@click.command("init")
@click.argument("role", type=click.Choice(ROLE_NAMES))
@click.argument("folder", metavar="[DIR]", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--run", "run_id", required=True, help="The run id (lowercase letters, digits, - and _).")
@click.option("--ledger", "ledger", default="signed:ledger.db", show_default=True, envvar=LEDGER_ENV,
              help=f"signed:PATH (one file every node opens) or evm:URL (several hosts). Env {LEDGER_ENV}.")
@click.option("--contract", envvar=CONTRACT_ENV, metavar="0xADDRESS",
              help=f"The contract of an evm: ledger, as `ledger deploy` printed it. Env {CONTRACT_ENV}.")
@click.option("--bootstrap", multiple=True, help="The bootstrap's multiaddr …/p2p/<id> (repeatable).")
@click.option("--host", "listen_host", default="0.0.0.0", show_default=True,
              help="Address to listen on (0.0.0.0 announces --announce-host; a loopback one listens there).")
@click.option("--announce-host", default="127.0.0.1", show_default=True,
              help="The address other hosts reach this one at (its HTTP endpoint, a bootstrap's address).")
@click.option("--model", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The run's model folder (trainer, worker, validator).")
@click.option("--tasks", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The run's task file (trainer, worker, validator).")
@click.option("--run-validator", "run_validators", multiple=True, metavar="0xADDRESS",
              help="Trainer: a validator the run trusts (repeatable).")
@click.option("--force", is_flag=True, help="Replace an existing node.toml (the key is kept).")
def init_command(role: str, folder: Path | None, run_id: str, ledger: str, contract: str | None,
                 bootstrap: tuple[str, ...], listen_host: str, announce_host: str, model: Path | None,
                 tasks: Path | None, run_validators: tuple[str, ...], force: bool) -> None:
    """Write DIR/node.toml for ROLE (default DIR: ./ROLE), with a new key and free ports, and print what to
    run next: register and stake (not a bootstrap), then `swarmnode run --config DIR/node.toml`.

    The key's password comes from SWARMNODE_PASSWORD or a prompt, as for `keys new`. An existing key is
    kept; an existing node.toml only with --force.
    """
    from swarmnode.crypto.identity import NodeIdentity
    from swarmnode.crypto.keystore import KeystoreError, load_keystore, save_keystore
    from swarmnode.node.cli.password import key_password

    folder = (folder or Path(role)).resolve()
    config = folder / CONFIG_FILE
    ledger = node_ledger_url(ledger, contract)
    if config.exists() and not force:
        raise click.ClickException(f"{config} exists: pass --force to replace it (its key is kept)")
    listen_host, announced = listen_and_announce(listen_host, announce_host)
    p2p, http, metrics = free_ports("127.0.0.1" if listen_host == "0.0.0.0" else listen_host, 3)
    plan = NodePlan(
        role=role, run=run_id, ledger=ledger, listen_host=listen_host, p2p_port=p2p, http_host=announce_host,
        http_port=http, metrics_port=metrics, bootstrap=bootstrap,
        announce=(f"/ip4/{announce_host}/tcp/{p2p}",) if announced else (),
        model=str(model.resolve()) if model else "", tasks=str(tasks.resolve()) if tasks else "",
        run_validators=run_validators,
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    scratch = config.with_name(f".{CONFIG_FILE}.new")
    scratch.write_text(render_node_toml(plan))
    try:
        load_config(scratch)
    except ConfigError as exc:
        scratch.unlink()
        raise click.ClickException(f"these options make a config the node refuses: {exc}") from None
    key = folder / KEY_FILE
    try:
        if key.exists():
            identity = load_keystore(key, key_password())
        else:
            identity = NodeIdentity(secrets.token_bytes(32))
            save_keystore(identity, key, key_password(confirm=True))
    except KeystoreError as exc:
        raise click.ClickException(str(exc)) from None
    scratch.replace(config)
    click.echo(f"wrote {config} ({role} of run {run_id}; ports {p2p} p2p, {http} http, {metrics} metrics)")
    click.echo(f"key {key}: address {identity.checksum_address}, peer id {identity.peer_id}")
    click.echo("next:")
    for step in next_steps(plan, folder, identity.peer_id, announce_host):
        click.echo(f"  {step}")
