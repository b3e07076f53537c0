"""`swarmnode devnet`: a whole swarm of separate processes, with a live status view.

On 127.0.0.1 by default; with `--wan PROFILE` each node runs in its own network namespace on a WAN of
that profile (`node.wan`), listens and announces its WAN address, and `--home-workers K` puts the first
K workers behind NAT (the `home` profile: they dial out, nobody dials them).

Each node's key, config, data directory and log go under one folder (`devnet-runs/<time>/` unless `--out`
names another), which stays after the run. Ctrl-C, SIGTERM, or the end of `--duration` /
`--until-discovered` stops every node with SIGTERM (SIGKILL after a grace period). With `--steps` the run
ends with the report (`devnet.report`): tables, a plot and the summary JSON.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click
import trio
from rich.console import Console

from swarmnode.node.cli.inputs import eval_tasks_option, load_run_inputs, run_model_options
from swarmnode.node.config import DEVNET_CHEATS, ENVIRONMENT_CHOICES
from swarmnode.node.devnet.live import run_devnet, status_table
from swarmnode.node.devnet.network import Devnet
from swarmnode.node.devnet.plan import DevnetPlan, default_folder
from swarmnode.node.devnet.rl import DEVNET_CALC_TURN_TOKENS, DEVNET_STAKE_GWEI, STAKED_ROLES
from swarmnode.node.wan import PROFILES, WanError, WanUnavailable

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
    "--no-signal-after",
    "no_signal_after_s",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="Stop the run, saying why, once the trainer's step waited this many seconds on a step's worth of "
    "groups too few of which had learning signal (a model that always or never solves its tasks; 0: never).",
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
    "--cheat",
    "cheat_kinds",
    type=click.Choice(DEVNET_CHEATS),
    multiple=True,
    help="One more dishonest worker of this kind (repeatable), after the --cheaters ones; code-injection "
    "needs code tasks and --max-new-tokens 32.",
)
@click.option(
    "--env",
    "environment",
    callback=lambda _ctx, _param, value: _environment(value),
    help="Multi-turn episodes in an environment (spec/environments.md): calculator (arithmetic with a "
    "<calc> tool; without --model the devnet runs its calculator model on two-digit products, "
    f"{DEVNET_CALC_TURN_TOKENS} tokens a turn), guess (guess-the-number; without --tasks the devnet "
    "writes its games), or verifiers.MODULE, a verifiers environment (--tasks from `swarmnode tasks "
    "verifiers MODULE`). --max-new-tokens is then per model turn; the cheat fabricated-env-turn needs it.",
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
    help="Workers' inference engine (validators and trainers run transformers): vllm needs CUDA and "
    "`pip install swarmnode[vllm]`, or vLLM's CPU build (scripts/install_vllm.sh).",
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
    no_signal_after_s: float,
    inner_steps: int,
    outer_lr: float,
    outer_momentum: float,
    cheaters: int,
    cheat_kinds: tuple[str, ...],
    environment: str | None,
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

    With --steps N it is a whole training run on loopback: bootstrap, trainer, relays,
    workers (--cheaters more that cheat), validators, a ledger every role is staked and registered in.
    It ends with a summary table, a PNG plot and the final ledger, in the devnet folder.
    """
    cheats = tuple(CHEAT_ORDER[i % len(CHEAT_ORDER)] for i in range(cheaters)) + cheat_kinds
    if environment == "calculator" and not model and not _given("max_new_tokens"):
        max_new_tokens = DEVNET_CALC_TURN_TOKENS  # the calculator model's call: `<calc>37*48</calc>` + EOS
    cheaters = len(cheats)
    if environment and not steps:
        raise click.UsageError("--env is for a training run: add --steps N")
    if environment and environment.startswith("verifiers.") and not tasks:
        raise click.UsageError(f"--env {environment} needs --tasks: export its rows first (swarmnode tasks "
                               f"verifiers {environment.removeprefix('verifiers.')} --out FILE)")
    if "fabricated-env-turn" in cheats and not environment:
        raise click.UsageError("--cheat fabricated-env-turn needs --env: a single-turn run has no "
                               "environment turn to fabricate")
    folder = out or default_folder()
    plan = DevnetPlan(
        trainers,
        relays,
        workers,
        validators,
        run_id,
        record_deliveries,
        steps=steps,
        no_signal_after_s=no_signal_after_s,
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
        environment=environment or "",
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
    if (model or tasks or eval_tasks) and not steps:
        raise click.UsageError("--model, --tasks and --eval-tasks are for a training run: add --steps N")
    if steps and (model or tasks or eval_tasks):  # the same clean errors as `train`, before any node starts
        load_run_inputs(model, tasks, eval_tasks)
    devnet = Devnet(plan, folder)
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
        nodes = devnet.nodes.values()
        dashboards = [f"{n.name} http://127.0.0.1:{n.metrics_port}/" for n in nodes if n.metrics_port]
        if dashboards:
            console.print("dashboards: " + "  ".join(dashboards))
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
    if steps and summary["reason"].startswith("no learning signal"):
        raise click.ClickException(f"the run stopped: {summary['reason']}")
    if steps and summary["reason"] != "trained":
        raise click.ClickException(f"the run did not finish its {steps} steps ({summary['reason']})")


def _environment(value: str | None) -> str | None:
    """--env: a built-in multi-turn environment or verifiers.MODULE."""
    if value is None or value in ENVIRONMENT_CHOICES or (value.startswith("verifiers.") and len(value) > 10):
        return value
    raise click.BadParameter(f"{value!r} is none of {', '.join(ENVIRONMENT_CHOICES)}, verifiers.MODULE")


def _given(name: str) -> bool:
    """Whether the command line set option `name` (not its default)."""
    source = click.get_current_context().get_parameter_source(name)
    return source is not None and source != click.core.ParameterSource.DEFAULT


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
        stored_rules,
        write_json,
    )

    assert devnet.ledger is not None
    console.print("measuring the held-out reward of the base and the final checkpoint ...")
    trainer = next(n for n in devnet.nodes.values() if n.role == "trainer")
    final = final_checkpoint(trainer.data_dir, devnet.plan.run)
    plan = devnet.plan
    eval_tasks = eval_tasks_of(plan.tasks, plan.eval_tasks)
    rules = stored_rules(trainer.data_dir) if plan.environment else None
    base_reward, final_reward = held_out_rewards(
        final[1] if final is not None else None, plan.model, eval_tasks, plan.max_new_tokens, rules
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
