"""`swarmnode run`, `swarmnode devnet` and `swarmnode probe`: the networked commands.

`register_commands(group)` adds them to the main CLI group; `python -m swarmnode.node.cli.run ...` runs them
standalone (the devnet starts its nodes that way, so it does not depend on the installed entry point).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.keystore import KeystoreError, load_keystore
from swarmnode.ledger.errors import LedgerError
from swarmnode.node.cli.password import key_password, password_for_children, take_env_password
from swarmnode.node.config import CHEATS, ROLE_NAMES, ConfigError, NodeConfig, load_config
from swarmnode.node.errors import OperatorError
from swarmnode.node.p2p.host import apply_yamux_tuning
from swarmnode.node.runtime import NodeRuntime, cancel_on_signal, configure_logging, run_until_signalled


def _identity(config: NodeConfig) -> NodeIdentity:
    try:
        return load_keystore(config.identity, key_password())
    except KeystoreError as exc:
        raise click.ClickException(str(exc)) from None


def _config(path: Path | None, overrides: dict[str, Any]) -> NodeConfig:
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        raise click.ClickException(f"config: {exc}") from None


def operator_error(exc: BaseException) -> OperatorError | LedgerError | None:
    """The first error an operator can fix inside `exc` (a trio node raises exception groups), if any."""
    if isinstance(exc, OperatorError | LedgerError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := operator_error(inner)) is not None:
                return found
    for linked in (exc.__cause__, exc.__context__):
        if linked is not None and (found := operator_error(linked)) is not None:
            return found
    return None


def serve_node(runtime: NodeRuntime, role: str, log_level: str) -> None:
    """Run the node; an error the operator can fix ends it with one line (its traceback with DEBUG)."""
    try:
        trio.run(run_until_signalled, runtime)
    except BaseException as exc:
        fault = operator_error(exc)
        if fault is None or log_level.upper() == "DEBUG":
            raise
        raise click.ClickException(f"the {role} stopped: {fault}") from None


def _node_options(fn: Any) -> Any:
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="Node TOML file (flags override it).",
        ),
        click.option("--identity", type=click.Path(path_type=Path), help="Keystore v3 file of the node key."),
        click.option("--listen", help="Listen multiaddr, e.g. /ip4/0.0.0.0/tcp/4001."),
        click.option("--bootstrap", multiple=True, help="Bootstrap peer multiaddr …/p2p/<id> (repeatable)."),
        click.option("--run", "run_id", help="Run id."),
        click.option("--data-dir", type=click.Path(path_type=Path), help="Data directory."),
        click.option("--http-port", type=int, help="Data-plane HTTP port announced in Hello."),
        click.option("--metrics-port", type=int, help="Prometheus port on 127.0.0.1 (0: off)."),
        click.option("--ledger-url", help="Ledger URL."),
        click.option("--log-level", help="Log level (DEBUG, INFO, WARNING, ...)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "identity": kwargs["identity"],
        "listen": kwargs["listen"],
        "bootstrap": kwargs["bootstrap"],
        "run": kwargs["run_id"],
        "data_dir": kwargs["data_dir"],
        "http_port": kwargs["http_port"],
        "metrics_port": kwargs["metrics_port"],
        "ledger_url": kwargs["ledger_url"],
        "log_level": kwargs["log_level"],
        "work": kwargs.get("work"),
    }


@click.command("run")
@click.option("--role", type=click.Choice(ROLE_NAMES), help="Role of this node (overrides the config).")
@_node_options
@click.option("--steps", type=int, help="Trainer: stop training after this many GRPO steps (0: never).")
@click.option("--threads", type=int, help="Torch threads of this process (default 1).")
@click.option(
    "--nproc",
    type=click.IntRange(1, 64),
    help="Trainer: ranks of its FSDP2 process group on this host (default 1, one process).",
)
@click.option(
    "--cheat", type=click.Choice([c for c in CHEATS if c]), help="Worker, devnets only: cheat this way."
)
def run_command(
    role: str | None,
    config_path: Path | None,
    steps: int | None,
    threads: int | None,
    nproc: int | None,
    cheat: str | None,
    **kwargs: Any,
) -> None:
    """Run a node until SIGINT/SIGTERM: host, DHT, gossip, request/response and the role's work.

    \b
    trainer    owns the run: GRPO steps on accepted rollouts, checkpoints out as the shard origin
    relay      re-serves checkpoint shards, announces them (DHT providers, ShardHave gossip)
    worker     generates rollouts with TOPLOC proofs on the newest checkpoint (must be staked)
    validator  re-checks rollouts by prefill, gossips verdicts, credits or slashes in the ledger
    bootstrap  only routes (DHT, gossip) for the others to meet

    \b
    A trainer with --nproc N (or [work] nproc) runs as N ranks of one FSDP2 group on this host: rank 0
    is the node, the others hold their shard of the model and optimizer. Under `torchrun` across hosts,
    each host runs this same command; a rank that dies ends the group, which restarts and resumes.
    """
    overrides = (("steps", steps), ("threads", threads), ("nproc", nproc), ("cheat", cheat))
    work = {k: v for k, v in overrides if v is not None}
    if work:
        kwargs["work"] = work
    from swarmnode.node.trainer.group import launched_rank

    config = _config(config_path, {"role": role, **_overrides(kwargs)})
    rank = launched_rank()
    if rank is not None:
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <rank pid>`: its stacks
        _write_rank_pid(config, rank)
    if rank is not None and rank > 0:  # a trainer rank: no network, only rank 0's commands
        _serve_rank(config)
        return
    if config.role == "trainer" and config.work.nproc > 1 and rank is None:
        _launch_trainer_group(config)
        return
    from swarmnode.node.assemble import make_role

    identity = _identity(config)
    configure_logging(config)
    if rank == 0:  # join the group before the node starts, so every rank of a restarted group meets
        from swarmnode.node.trainer.sharded import lead_group

        lead_group()
    apply_yamux_tuning()
    try:
        service = make_role(config, identity)
    except (OperatorError, LedgerError, ValueError, OSError, RuntimeError) as exc:  # NotEligible: stake how
        raise click.ClickException(f"cannot start the {config.role}: {exc}") from None
    runtime = NodeRuntime(config, identity, service)
    serve_node(runtime, config.role, config.log_level)
    skip_final_collection()
    if rank == 0:  # rank 0 of a trainer group: stopped cleanly; skip torch's racy C++ teardown
        from swarmnode.node.trainer.group import exit_rank

        exit_rank(0)


def skip_final_collection() -> None:
    """After a clean stop, let the interpreter exit without tracing every object it ever made.

    The interpreter's final collections walked the whole heap (torch, transformers, the model): 4-8 s
    per node, while a devnet waited for the SIGTERMed nodes. `gc.freeze()` leaves those objects out of
    every later collection; exit still runs atexit handlers (logging flushes its files) and clears
    modules by reference count. Nothing is lost: by now the runtime's `finally` blocks have closed the
    trainer inbox and written the final status, and every store commits durably (SQLite WAL,
    synchronous=FULL) as it goes, so only unreachable cycles are left for the OS to reclaim.
    """
    gc.freeze()


def _write_rank_pid(config: NodeConfig, rank: int) -> None:
    """<data_dir>/ranks/rank-N.pid: which process is which rank, for an operator (and the tests)."""
    ranks = config.data_dir / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    (ranks / f"rank-{rank}.pid").write_text(f"{os.getpid()}\n")


def _serve_rank(config: NodeConfig) -> None:
    from swarmnode.node.assemble import trainer_rank_families
    from swarmnode.node.roles.common import set_threads
    from swarmnode.node.trainer.commands import serve_rank

    configure_logging(config)
    set_threads(config.work.threads)
    serve_rank(trainer_rank_families())


def _launch_trainer_group(config: NodeConfig) -> None:
    """Start this same command as [work] nproc ranks (the key password checked once, here)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from swarmnode.node.trainer.launch import launch_group

    _identity(config)  # a wrong password fails here, not in rank 0 after the group formed
    try:
        with password_for_children(key_password()):  # rank 0 opens the key; every rank takes it out at start
            launch_group(sys.argv[1:], config.work.nproc, config.work.max_restarts)
    except SignalException:  # SIGINT/SIGTERM: the agent stopped every rank; a requested stop
        return
    except ChildFailedError as exc:
        raise click.ClickException(
            f"the trainer group failed after {config.work.max_restarts} restarts: {exc}"
        ) from None


@click.command("probe")
@_node_options
@click.option("--kind", default="shards", show_default=True, help="Topic kind to publish probes on.")
@click.option("--rate", type=float, default=1.0, show_default=True, help="Probes per second.")
@click.option("--count", type=int, default=0, show_default=True, help="Probes to publish.")
@click.option(
    "--wait-subscribers",
    type=int,
    default=1,
    show_default=True,
    help="Publish once this many peers subscribe to the topic.",
)
@click.option("--lookups", type=int, default=0, show_default=True, help="Timed provider lookups per role.")
@click.option(
    "--linger", type=float, default=2.0, show_default=True, help="Seconds to stay after publishing."
)
@click.option("--report", type=click.Path(path_type=Path), help="Write the probe report (JSON) here.")
def probe_command(
    config_path: Path | None,
    kind: str,
    rate: float,
    count: int,
    wait_subscribers: int,
    lookups: int,
    linger: float,
    report: Path | None,
    **kwargs: Any,
) -> None:
    """Join the swarm as a role-less node, publish numbered probes and time DHT lookups, then leave."""
    from swarmnode.node.roles.probe import Probe, ProbePlan

    config = _config(config_path, {"role": "bootstrap", **_overrides(kwargs)})
    config = dataclasses.replace(config, role="probe")
    identity = _identity(config)
    configure_logging(config)
    apply_yamux_tuning()
    plan = ProbePlan(
        kind=kind, rate=rate, count=count, wait_subscribers=wait_subscribers, lookups=lookups, linger=linger
    )
    probe = Probe(plan)
    runtime = NodeRuntime(config, identity, probe)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_signal, nursery.cancel_scope)
            await nursery.start(runtime.run)
            await probe.probe_work.done.wait()
            nursery.cancel_scope.cancel()

    trio.run(main)
    document = dataclasses.asdict(probe.probe_work.report) | {"peer_id": identity.peer_id}
    if report is not None:
        report.write_text(json.dumps(document))
    else:
        click.echo(json.dumps(document))


def register_commands(group: click.Group) -> None:
    """Add `run`, `devnet` and `probe` to the swarmnode CLI group."""
    from swarmnode.node.cli.devnet import devnet_command

    group.add_command(run_command)
    group.add_command(devnet_command)
    group.add_command(probe_command)


@click.group()
@click.pass_context
def standalone(ctx: click.Context) -> None:
    """swarmnode networked commands (standalone entry point)."""
    take_env_password(ctx)  # devnet nodes and trainer ranks find the password in their environment: out of it


if __name__ == "__main__":
    register_commands(standalone)
    standalone()
