"""`swarmnode`: one binary for every role. Sub-commands group by what an operator does.

The CLI is the edge: it reads files, prompts and environment variables, then calls pure code.

Start-up stays under a second for the commands that load no model: this module imports only click, rich and
the light CLI helpers at the top; each command imports what it uses (torch, transformers, trio, libp2p,
eth_account, web3 ...) inside its function, and the command groups of the other CLI modules are imported
only when one of them runs or `--help` lists them (`LazyGroup`). `benchmarks/bench_cli.py` measures it.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from swarmnode.node.cli.inputs import (
    eval_tasks_option,
    group_size_option,
    load_run_inputs,
    prompts_per_step_option,
    run_model_options,
)
from swarmnode.node.cli.password import key_password, take_env_password

if TYPE_CHECKING:
    from swarmnode.crypto.identity import NodeIdentity

DEFAULT_KEY = Path(os.environ.get("SWARMNODE_KEY", Path.home() / ".swarmnode" / "node.key"))
console = Console()

# Commands defined in other modules, imported when one of them runs: name -> (module:attribute, help line).
# `swarmnode --help` prints the help line without importing the module (the devnet's and the node's pull in
# libp2p and the RL stack: seconds); tests/test_cli.py keeps each line equal to its command's own.
LAZY_COMMANDS = {
    "devnet": (
        "swarmnode.node.cli.devnet:devnet_command",
        "Run a swarm of separate node processes on 127.0.0.1 (or an emulated WAN) and show live status.",
    ),
    "init": (
        "swarmnode.node.cli.init:init_command",
        "Write DIR/node.toml for ROLE (default DIR: ./ROLE), with a new key and free ports, and print what "
        "to run next: register and stake (not a bootstrap), then `swarmnode run --config DIR/node.toml`.",
    ),
    "ledger": ("swarmnode.node.cli.ledger:ledger_group", "Query, audit and deploy the ledger."),
    "model": (
        "swarmnode.node.cli.model:model_group",
        "Create and inspect model folders (Hugging Face layout: config.json, safetensors, tokenizer).",
    ),
    "plan-memory": (
        "swarmnode.node.cli.plan:plan_memory",
        "Weights, gradients, AdamW state and activations per rank of an N-rank FSDP2 trainer for DIR.",
    ),
    "probe": (
        "swarmnode.node.cli.run:probe_command",
        "Join the swarm as a role-less node, publish numbered probes and time DHT lookups, then leave.",
    ),
    "register": (
        "swarmnode.node.cli.stake:register_command",
        "Register this node's role and compute in the ledger.",
    ),
    "run": (
        "swarmnode.node.cli.run:run_command",
        "Run a node until SIGINT/SIGTERM: host, DHT, gossip, request/response and the role's work.",
    ),
    "stake": (
        "swarmnode.node.cli.stake:stake_group",
        "Deposit, unbond and withdraw stake; show a node's stake.",
    ),
    "status": (
        "swarmnode.node.cli.status:status_command",
        "What a node on this machine is doing: its role, peers, what it waits for, its work, its figures.",
    ),
    "tasks": (
        "swarmnode.node.cli.tasks:tasks_group",
        "Inspect and filter task files (JSONL, Parquet, or a family file of reasoning-gym families).",
    ),
    "wan": (
        "swarmnode.node.cli.wan:wan_group",
        "The WAN harness's tools: the link emulator and a path measurement probe (run inside namespaces).",
    ),
}


class LazyGroup(click.Group):
    """A click group whose commands of `lazy` (name -> (module:attribute, help line)) are imported only when
    one is asked for: `swarmnode version` never imports the ledger, the node runtime or the RL stack, and
    `--help` lists them by their help lines."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.add_command(load_lazy_command(cmd_name, self.lazy[cmd_name][0]))
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's list of commands, with a stand-in carrying the help line for each one not imported yet."""
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name) or click.Command(name, help=self.lazy[name][1])
            if not command.hidden:
                rows.append((name, command))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in rows])


def load_lazy_command(name: str, target: str) -> click.Command:
    """Import the command `target` ("module:attribute") names; it must be the click command `name`."""
    module, attribute = target.split(":")
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command) or command.name != name:
        raise RuntimeError(f"{target} is not the click command {name!r}")
    return command


def open_identity(key: Path) -> NodeIdentity:
    """Load the node key or exit with an error that says what to do."""
    from swarmnode.crypto.keystore import KeystoreError, load_keystore

    try:
        return load_keystore(key, key_password())
    except KeystoreError as exc:
        raise click.ClickException(str(exc)) from None


key_option = click.option(
    "--key", type=click.Path(path_type=Path), default=DEFAULT_KEY, show_default=True,
    help="Keystore v3 file of the node key (env SWARMNODE_KEY).",
)


@click.group(cls=LazyGroup, lazy=LAZY_COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.pass_context
def main(ctx: click.Context) -> None:
    """swarmnode: a node of a permissionless swarm that trains language models with RL.

    One binary, four roles (trainer, relay, worker, validator). Start with `swarmnode keys new`,
    stake and register (`swarmnode stake`, `swarmnode register`), then `swarmnode run --role ...`.
    `swarmnode devnet` runs a whole swarm on this machine.
    """
    take_env_password(ctx)  # SWARMNODE_PASSWORD out of the environment before any command starts a process


@main.command()
def version() -> None:
    """Print the swarmnode version and the protocol version it speaks."""
    from importlib.metadata import version as package_version

    from swarmnode.protocol.ids import PROTOCOL_VERSION

    click.echo(f"swarmnode {package_version('swarmnode')} (protocol {PROTOCOL_VERSION})")


@main.group()
def keys() -> None:
    """Create and inspect the node key (one secp256k1 key: peer id and Ethereum address)."""


@keys.command("new")
@key_option
def keys_new(key: Path) -> None:
    """Create a new node key, encrypted with a password (keystore v3, mode 0600)."""
    import secrets

    from swarmnode.crypto.identity import NodeIdentity
    from swarmnode.crypto.keystore import KeystoreError, save_keystore

    if key.exists():
        raise click.ClickException(f"{key} already exists; refusing to overwrite a key (move it away first)")
    identity = NodeIdentity(secrets.token_bytes(32))
    try:
        save_keystore(identity, key, key_password(confirm=True))
    except KeystoreError as exc:
        raise click.ClickException(str(exc)) from None
    console.print(f"[green]created[/] {key}")
    console.print(f"address  {identity.checksum_address}")
    console.print(f"peer id  {identity.peer_id}")


@keys.command("show")
@key_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def keys_show(key: Path, as_json: bool) -> None:
    """Show the address and libp2p peer id of the node key."""
    identity = open_identity(key)
    info = {"address": identity.checksum_address, "peer_id": identity.peer_id,
            "public_key": "0x" + identity.public_key.hex(), "keystore": str(key)}
    if as_json:
        click.echo(json.dumps(info))
        return
    for name, value in info.items():
        console.print(f"{name:<10} {value}")


def default_vectors_dir() -> Path:
    """spec/vectors of the source tree this package was installed from."""
    return Path(__file__).resolve().parents[2] / "spec" / "vectors"


@main.command()
@click.option("--vectors", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Vectors root laid out as spec/vectors: *.json, rollouts/, diloco/, ... "
                   "(default: this tree's spec/vectors).")
@click.option("--suite", "suite_name", default=None, metavar="NAME",
              help="Replay one suite (see --list) instead of all.")
@click.option("--list", "list_suites", is_flag=True, help="List the suites and their directories, then exit.")
@click.option("--verbose", "-v", is_flag=True, help="List every case, not only the failing ones.")
def conformance(vectors: Path | None, suite_name: str | None, list_suites: bool, verbose: bool) -> None:
    """Replay protocol conformance vectors, every suite or one, through the real decoder and verifiers."""
    from rich.table import Table

    from swarmnode.node.conformance import SUITES, replay, suite_named

    directory = vectors or default_vectors_dir()
    if list_suites:
        listing = Table(title="conformance suites")
        for column in ("suite", "directory", "covers"):
            listing.add_column(column)
        for row in SUITES:
            listing.add_row(row.name, str(row.folder(directory)), row.about)
        console.print(listing)
        return
    if not directory.is_dir():
        raise click.ClickException(f"no vectors at {directory}; pass --vectors DIR")
    try:
        chosen = SUITES if suite_name is None else (suite_named(suite_name),)
    except KeyError as exc:
        raise click.ClickException(str(exc.args[0])) from None
    results = replay(chosen, directory)
    if not results:
        raise click.ClickException(f"no vector cases found in {directory}")
    table = Table(title=f"conformance: {directory}")
    for column in ("suite", "passed", "failed"):
        table.add_column(column)
    for suite in dict.fromkeys(r.suite for r in results):
        mine = [r for r in results if r.suite == suite]
        failed = sum(not r.passed for r in mine)
        table.add_row(suite, str(len(mine) - failed), f"[red]{failed}[/]" if failed else "0")
    console.print(table)
    for result in results:
        if verbose or not result.passed:
            mark = "[green]pass[/]" if result.passed else "[red]FAIL[/]"
            console.print(f"{mark} {result.suite} {result.name}: {result.detail}")
    failures = sum(not r.passed for r in results)
    if failures:
        raise click.ClickException(f"{failures} of {len(results)} cases failed")
    console.print(f"[green]all {len(results)} cases passed[/]")


@main.command()
@click.option("--sync", "sync_mode", is_flag=True, required=True,
              help="Single-process baseline: generate and train in one loop, no network "
                   "(the distributed run is `swarmnode devnet --steps N`).")
@click.option("--steps", type=click.IntRange(1), default=30, show_default=True, help="GRPO steps to take.")
@run_model_options
@prompts_per_step_option
@group_size_option
@eval_tasks_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the final checkpoint and optimizer state.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per step.")
def train(sync_mode: bool, steps: int, model: Path | None, tasks: Path | None, max_new_tokens: int,
          prompts_per_step: int, group_size: int, eval_tasks: Path | None, out: Path | None,
          as_json: bool) -> None:
    """Train a model with GRPO in one process (the baseline the swarm is compared with).

    Each step samples --group-size completions for each of --prompts-per-step distinct tasks of --tasks
    (so the task file needs at least --prompts-per-step tasks), then takes one GRPO step on their groups.
    """
    import time
    from dataclasses import asdict, replace

    from swarmnode.crypto.hashing import sha256
    from swarmnode.crypto.identity import NodeIdentity
    from swarmnode.node.rl.engine import TransformersEngine
    from swarmnode.node.rl.model import ModelFolderError
    from swarmnode.node.rl.run import devnet_grpo, devnet_run
    from swarmnode.node.rl.sync import SyncStep, eval_reward, run_sync

    folder, train_tasks, held_out = load_run_inputs(
        model, tasks, eval_tasks, prompts_per_step=prompts_per_step, prompts_option="--prompts-per-step"
    )
    trainer = NodeIdentity(sha256(b"swarmnode-sync-trainer"))
    worker = NodeIdentity(sha256(b"swarmnode-sync-worker"))
    try:
        engine = TransformersEngine.from_folder(folder)
    except (ModelFolderError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    grpo = replace(devnet_grpo(engine.info, max_new_tokens), prompts_per_step=prompts_per_step,
                   group_size=group_size, token_budget=group_size * prompts_per_step * max_new_tokens)
    setup = devnet_run(trainer.address, folder, int(time.time() * 1000), grpo=grpo, tasks=train_tasks,
                       info=engine.info, max_new_tokens=max_new_tokens)

    def report(record: SyncStep) -> None:
        s = record.stats
        if as_json:
            click.echo(json.dumps({**asdict(s), "generate_s": record.generate_s, "train_s": record.train_s}))
        else:
            console.print(f"step {s.step:4d}  reward {s.mean_reward:5.3f}  groups {s.groups_used}/"
                          f"{s.groups_used + s.groups_dropped}  loss {s.loss:+.4f}  grad {s.grad_norm:6.3f}  "
                          f"gen {record.generate_s:5.2f}s  train {record.train_s:5.2f}s")

    base_reward = eval_reward(engine, held_out, samples=8, max_new_tokens=grpo.max_new_tokens,
                              temperature=grpo.temperature)
    del engine
    if not as_json:
        console.print(f"held-out reward of the base: {base_reward:.3f} ({len(held_out)} tasks x 8 samples)")
    history = run_sync(setup, folder, steps, worker.address, out_dir=out, on_step=report,
                       eval_tasks=held_out, eval_samples=8)
    first = sum(h.stats.mean_reward for h in history[:5]) / min(5, len(history))
    last = sum(h.stats.mean_reward for h in history[-5:]) / min(5, len(history))
    final = history[-1].eval_reward
    if as_json:
        click.echo(json.dumps({"base_eval_reward": base_reward, "final_eval_reward": final}))
    else:
        console.print(
            f"mean reward of the trained groups: first 5 steps {first:.3f} -> last 5 steps {last:.3f}"
        )
        console.print(f"held-out reward: base {base_reward:.3f} -> final {final:.3f}")


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def diloco(args: tuple[str, ...]) -> None:
    """DiLoCo between trainers: `diloco plan ...` signs a run, `diloco trainer ...` runs one trainer.

    Several trainers take H inner AdamW steps alone, then average their fp16 (or int8) pseudo-gradients
    over the data plane and apply an outer Nesterov step (spec/diloco.md). `swarmnode diloco --help` and
    `swarmnode diloco trainer --help` list the options.
    """
    from swarmnode.node.cli.diloco import main as diloco_main

    diloco_main(list(args))


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def dataplane(args: tuple[str, ...]) -> None:
    """One data-plane role alone as a process (origin, relay, worker, bad-relay), without libp2p.

    The weight broadcast of spec/shards.md over HTTP on synthetic checkpoints: the multi-process tests and
    the broadcast benchmark run it, and it is a way to watch a broadcast by hand. JSON lines on stdout;
    `swarmnode dataplane --help` lists the roles and options.
    """
    from swarmnode.node.cli.dataplane import main as dataplane_main

    dataplane_main(list(args))


@main.command()
@run_model_options
@click.option("--workers", type=click.IntRange(1), default=4, show_default=True,
              help="Simulated honest workers.")
@click.option("--submissions", type=click.IntRange(1), default=4, show_default=True,
              help="Submissions per worker.")
@click.option("--margin", type=click.FloatRange(1.0), default=3.0, show_default=True,
              help="Bound = honest maximum x margin (never below the float-noise floor).")
@click.option("--worker-engine", type=click.Choice(["auto", "transformers", "vllm"]), default="auto",
              show_default=True, help="The engine honest workers run (auto: vLLM with CUDA and the extra).")
@click.option("--json", "as_json", is_flag=True, help="Print the bounds as JSON for a run descriptor.")
def calibrate(model: Path | None, tasks: Path | None, max_new_tokens: int, workers: int, submissions: int,
              margin: float, worker_engine: str, as_json: bool) -> None:
    """Measure honest TOPLOC statistics on a model and print the run's calibrated bounds.

    Honest workers generate on the model with the worker engine, and a validator prefills the same tokens
    with its engine (transformers; both in the dtype each role runs on this machine: bf16 on CUDA, fp32 on
    the CPU), so the bounds hold for that (model, dtype, worker engine, validator engine) pair: the worst
    honest submission times --margin.
    """
    import time

    from swarmnode.crypto.hashing import sha256
    from swarmnode.crypto.identity import NodeIdentity
    from swarmnode.node.rl.calibration import calibrate_run
    from swarmnode.node.rl.engines import EngineUnavailable, choose_engine, open_engine
    from swarmnode.node.rl.run import devnet_run

    folder, train_tasks, _ = load_run_inputs(model, tasks, None)
    try:
        prover = open_engine(choose_engine(worker_engine), folder, role="worker")
    except EngineUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    validator = open_engine("transformers", folder, role="validator")
    setup = devnet_run(b"\0" * 20, folder, int(time.time() * 1000), tasks=train_tasks, info=validator.info,
                       max_new_tokens=max_new_tokens)
    addresses = [NodeIdentity(sha256(f"calibration-worker-{i}".encode())).address for i in range(workers)]
    with console.status("generating honest submissions") as status:
        def progress(done: int, total: int) -> None:
            status.update(f"honest submissions {done}/{total}")

        result = calibrate_run(setup, prover, validator, addresses, submissions, margin, on_progress=progress)
    worst_exp = max(a.mean_exp_mismatches for a in result.honest)
    worst_mant = max(a.mean_mant_err for a in result.honest)
    bounds = {"max_mean_exp_mismatches": result.policy.max_mean_exp_mismatches,
              "max_mean_mant_err": result.policy.max_mean_mant_err, "margin": margin,
              "honest_submissions": len(result.honest), "honest_max_mean_exp_mismatches": worst_exp,
              "honest_max_mean_mant_err": worst_mant}
    if as_json:
        click.echo(json.dumps(bounds))
        return
    for name, value in bounds.items():
        console.print(f"{name:<32} {value}")


main.add_command(diloco)
main.add_command(dataplane)

if __name__ == "__main__":
    main()
