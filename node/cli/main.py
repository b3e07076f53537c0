"""`swarmnode`: one binary for every role. Sub-commands group by what an operator does.

The CLI is the edge: it reads files, prompts and environment variables, then calls pure code.
"""

from __future__ import annotations

import json
import os
import secrets
from importlib.metadata import version as package_version
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.keystore import KeystoreError, load_keystore, save_keystore
from swarmnode.node.cli.inputs import eval_tasks_option, load_run_inputs, run_model_options
from swarmnode.node.cli.password import key_password, take_env_password

DEFAULT_KEY = Path(os.environ.get("SWARMNODE_KEY", Path.home() / ".swarmnode" / "node.key"))
console = Console()


def open_identity(key: Path) -> NodeIdentity:
    """Load the node key or exit with an error that says what to do."""
    try:
        return load_keystore(key, key_password())
    except KeystoreError as exc:
        raise click.ClickException(str(exc)) from None


key_option = click.option(
    "--key", type=click.Path(path_type=Path), default=DEFAULT_KEY, show_default=True,
    help="Keystore v3 file of the node key (env SWARMNODE_KEY).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
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
    from swarmnode.protocol.ids import PROTOCOL_VERSION

    click.echo(f"swarmnode {package_version('swarmnode')} (protocol {PROTOCOL_VERSION})")


@main.group()
def keys() -> None:
    """Create and inspect the node key (one secp256k1 key: peer id and Ethereum address)."""


@keys.command("new")
@key_option
def keys_new(key: Path) -> None:
    """Create a new node key, encrypted with a password (keystore v3, mode 0600)."""
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
              help="Directory of *.json vector files (default: this tree's spec/vectors).")
@click.option("--verbose", "-v", is_flag=True, help="List every case, not only the failing ones.")
def conformance(vectors: Path | None, verbose: bool) -> None:
    """Replay protocol conformance vectors through the real decoder and verifiers."""
    from swarmnode.node.conformance import load_suites, run_suites

    directory = vectors or default_vectors_dir()
    if not directory.is_dir():
        raise click.ClickException(f"no vectors at {directory}; pass --vectors DIR")
    results = run_suites(load_suites(directory))
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
@eval_tasks_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the final checkpoint and optimizer state.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per step.")
def train(sync_mode: bool, steps: int, model: Path | None, tasks: Path | None, max_new_tokens: int,
          eval_tasks: Path | None, out: Path | None, as_json: bool) -> None:
    """Train a model with GRPO in one process (the baseline the swarm is compared with)."""
    import time
    from dataclasses import asdict

    from swarmnode.crypto.hashing import sha256
    from swarmnode.node.rl.engine import TransformersEngine
    from swarmnode.node.rl.model import ModelFolderError
    from swarmnode.node.rl.run import devnet_run
    from swarmnode.node.rl.sync import SyncStep, eval_reward, run_sync

    folder, train_tasks, held_out = load_run_inputs(model, tasks, eval_tasks)
    trainer = NodeIdentity(sha256(b"swarmnode-sync-trainer"))
    worker = NodeIdentity(sha256(b"swarmnode-sync-worker"))
    try:
        engine = TransformersEngine.from_folder(folder)
    except (ModelFolderError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    setup = devnet_run(trainer.address, folder, int(time.time() * 1000), tasks=train_tasks, info=engine.info,
                       max_new_tokens=max_new_tokens)

    def report(record: SyncStep) -> None:
        s = record.stats
        if as_json:
            click.echo(json.dumps({**asdict(s), "generate_s": record.generate_s, "train_s": record.train_s}))
        else:
            console.print(f"step {s.step:4d}  reward {s.mean_reward:5.3f}  groups {s.groups_used}/"
                          f"{s.groups_used + s.groups_dropped}  loss {s.loss:+.4f}  grad {s.grad_norm:6.3f}  "
                          f"gen {record.generate_s:5.2f}s  train {record.train_s:5.2f}s")

    grpo = setup.descriptor.grpo
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
    from swarmnode.node.diloco.__main__ import main as diloco_main

    diloco_main(list(args))


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


def _register_groups() -> None:
    """Command groups that live beside their subsystems, added explicitly (no import-time registration)."""
    from swarmnode.node.cli import init, ledger, model, plan, run, status, tasks

    ledger.register_commands(main)
    model.register_commands(main)
    run.register_commands(main)
    tasks.register_commands(main)
    main.add_command(plan.plan_memory)
    main.add_command(status.status_command)
    main.add_command(init.init_command)
    main.add_command(diloco)


_register_groups()

if __name__ == "__main__":
    main()
