"""CLI for task files: `swarmnode tasks show FILE`, `swarmnode tasks filter --model DIR --tasks IN --out OUT`.

`filter` is INTELLECT-2's offline data recipe (node.rl.tasks.filter): it measures each task's pass rate with
the base model and keeps the tasks in between too easy and too hard; progress goes to stderr, the summary
(and with `--json` one machine-readable document) to stdout. A bad task file or model folder exits with
status 1 and the typed error on stderr. Both take a family file (`.toml`, node.rl.tasks.family_file) as a
task file: its tasks are generated first.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from swarmnode.node.cli.inputs import require_sandbox
from swarmnode.node.rl.tasks import (
    ENVIRONMENT_KINDS,
    Task,
    TaskFileError,
    dataset_hash,
    read_tasks,
    write_tasks,
)
from swarmnode.node.rl.tasks.files import JSON_SUFFIXES, PARQUET_SUFFIXES

PROGRESS_LINES = 100  # at most this many progress lines per filter run (plus the last)
SHOW_CHARS = 60  # prompt and target characters `tasks show` prints per task
TASK_SUFFIXES = JSON_SUFFIXES + PARQUET_SUFFIXES


def _read(path: Path) -> list[Task]:
    try:
        return read_tasks(path)
    except TaskFileError as exc:
        raise click.ClickException(str(exc)) from None


def _clip(text: str, limit: int = SHOW_CHARS) -> str:
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def dataset_summary(tasks: Sequence[Task]) -> dict[str, Any]:
    """Count per kind, how many carry a length target, and the dataset hash."""
    return {
        "tasks": len(tasks),
        "kinds": dict(sorted(Counter(t.kind for t in tasks).items())),
        "with_target_length": sum(1 for t in tasks if t.target_length),
        "dataset_hash": "0x" + dataset_hash(tasks).hex(),
    }


@click.group("tasks")
def tasks_group() -> None:
    """Inspect and filter task files (JSONL, Parquet, or a family file of reasoning-gym families).

    A task file is JSONL or Parquet (prompt, kind, answer or tests, target_length), or a family file
    (.toml) naming reasoning-gym families that every node generates the same way:

    \b
        seed = 7
        [[family]]
        name = "chain_sum"
        count = 200
        config = { min_terms = 2, max_terms = 3 }
    """


@tasks_group.command("show")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--head", default=5, show_default=True, type=click.IntRange(min=0), help="tasks to print")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
def show_command(file: Path, head: int, as_json: bool) -> None:
    """Count per kind, the dataset hash a RunDescriptor names, and the first tasks of FILE (a task file, or
    a family file whose tasks it generates)."""
    tasks = _read(file)
    summary = dataset_summary(tasks)
    first: list[dict[str, Any]] = [
        {"task_id": "0x" + t.task_id.hex(), "kind": t.kind, "prompt": t.prompt, "target": t.target,
         "target_length": t.target_length}
        for t in tasks[:head]
    ]
    if as_json:
        click.echo(json.dumps({"file": str(file), **summary, "head": first}, ensure_ascii=False))
        return
    click.echo(f"{file}: {summary['tasks']} tasks, dataset hash {summary['dataset_hash']}")
    for kind, count in summary["kinds"].items():
        click.echo(f"  {kind}: {count}")
    if summary["with_target_length"]:
        click.echo(f"  with a target length: {summary['with_target_length']}")
    for t in first:
        length = f" [{t['target_length']} tokens]" if t["target_length"] else ""
        body = f"{_clip(t['prompt'])!r} -> {_clip(t['target'])!r}"
        click.echo(f"{t['task_id'][:14]}… {t['kind']}{length}: {body}")


@tasks_group.command("filter")
@click.option("--model", "model_dir", required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="base model folder (Hugging Face)")
@click.option("--tasks", "tasks_file", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="task file (or family file) to filter")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="where the kept tasks go (.jsonl or .parquet)")
@click.option("--samples", default=8, show_default=True, type=click.IntRange(min=1),
              help="completions per task")
@click.option("--min-pass", default=0.0, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="drop tasks whose pass rate is at or below this (too hard)")
@click.option("--max-pass", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="drop tasks whose pass rate is at or above this (too easy)")
@click.option("--max-new-tokens", default=1024, show_default=True, type=click.IntRange(min=1),
              help="completion budget (use the run's max_new_tokens)")
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0.0),
              help="sampling temperature (use the run's)")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**64 - 1),
              help="sampling seed: the same seed measures the same rates")
@click.option("--device", default="cpu", show_default=True, help="torch device of the model")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
def filter_command(model_dir: Path, tasks_file: Path, out: Path, samples: int, min_pass: float,
                   max_pass: float, max_new_tokens: int, temperature: float, seed: int, device: str,
                   as_json: bool) -> None:
    """Measure each task's pass rate with the base model and keep the informative ones (INTELLECT-2).

    A task is kept iff min-pass < pass rate < max-pass. The defaults drop the tasks the base model never
    solves (rate 0.0) and those it always solves (rate 1.0): their GRPO groups all get one reward, so zero
    advantages, and teach nothing. A task whose prompt leaves no room for --max-new-tokens in the model's
    context counts as never solved. The kept tasks keep their order; the new dataset hash is printed.
    """
    if min_pass >= max_pass:
        raise click.BadParameter(f"--min-pass {min_pass} must be below --max-pass {max_pass}")
    if out.resolve() == tasks_file.resolve():
        raise click.BadParameter("--out must not be the --tasks file")
    if out.suffix.lower() not in TASK_SUFFIXES:
        raise click.BadParameter(f"--out must end in {', '.join(TASK_SUFFIXES)}")
    tasks = _read(tasks_file)
    played = sorted({t.kind for t in tasks} & ENVIRONMENT_KINDS)
    if played:
        raise click.ClickException(f"{tasks_file}: tasks of kind {', '.join(played)} are played in an "
                                   "environment, not graded alone: the filter measures single-turn tasks")
    require_sandbox(tasks)
    from swarmnode.node.rl.engine import TransformersEngine
    from swarmnode.node.rl.model import ModelFolderError
    from swarmnode.node.rl.tasks.filter import filter_tasks, pass_rates

    try:
        engine = TransformersEngine.from_folder(model_dir, device=device)
    except (ModelFolderError, OSError, ValueError) as exc:
        raise click.ClickException(f"{model_dir}: {exc}") from None
    started = time.monotonic()
    every = max(1, len(tasks) // PROGRESS_LINES)

    def progress(done: int, total: int, rate: float) -> None:
        if done % every == 0 or done == total:
            click.echo(f"filter: {done}/{total} tasks, {time.monotonic() - started:.0f} s", err=True)

    rates = pass_rates(engine, tasks, samples=samples, max_new_tokens=max_new_tokens, temperature=temperature,
                       seed=seed, progress=progress)
    kept, easy, hard = filter_tasks(tasks, rates, min_pass, max_pass)
    histogram = Counter(round(r * samples) for r in rates)
    document: dict[str, Any] = {
        "tasks": len(tasks),
        "kept": len(kept),
        "dropped_easy": len(easy),
        "dropped_hard": len(hard),
        "pass_counts": {f"{k}/{samples}": histogram[k] for k in range(samples + 1)},
        "out": str(out) if kept else None,
        "dataset_hash": "0x" + dataset_hash(kept).hex() if kept else None,
        "seconds": round(time.monotonic() - started, 1),
    }
    if kept:
        try:
            write_tasks(kept, out)
        except (TaskFileError, OSError) as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(document))
    else:
        click.echo(f"{len(tasks)} tasks: kept {len(kept)}, dropped {len(easy)} too easy (rate >= {max_pass}) "
                   f"and {len(hard)} too hard (rate <= {min_pass})")
        counts = ", ".join(f"{k}: {n}" for k, n in document["pass_counts"].items() if n)
        click.echo(f"passes per task: {counts}")
        if kept:
            click.echo(f"wrote {out}: dataset hash {document['dataset_hash']}")
    if not kept:
        raise click.ClickException("no task kept: nothing written (a run needs at least one task)")


@tasks_group.command("verifiers")
@click.argument("module")
@click.option("--args", "args_json", default="{}", show_default=True,
              help="the environment's load_environment arguments, as a JSON object")
@click.option("--count", default=64, show_default=True, type=click.IntRange(min=1),
              help="rows of its dataset to export (its first ones)")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="the task file to write (.jsonl or .parquet)")
def verifiers_command(module: str, args_json: str, count: int, out: Path) -> None:
    """Export the dataset of the verifiers environment MODULE as a task file, after vetting that a swarm
    can verify it; a run on the file names the environment `verifiers.MODULE` (devnet --env).

    MODULE is a Python file MODULE.py exposing `load_environment` (verifiers 0.3.1's API) in
    $SWARMNODE_VERIFIERS_ENVS (default: the repository's examples/verifiers). verifiers runs from its own
    venv ($SWARMNODE_VERIFIERS_VENV, default build/verifiers-venv: scripts/install_verifiers.sh), in the
    sandbox. Refused, with why: a judge model, a remote sandbox or tool server, group rewards, wall-clock
    or token limits of its own, and anything that answers the same turns differently twice.
    """
    from swarmnode.node.rl.environments.verifiers_adapter import VerifiersRefused, export_rows

    if out.suffix.lower() not in TASK_SUFFIXES:
        raise click.BadParameter(f"--out must end in {', '.join(TASK_SUFFIXES)}")
    try:
        args = json.loads(args_json)
    except ValueError as exc:
        raise click.BadParameter(f"--args must be a JSON object: {exc}") from None
    if not isinstance(args, dict):
        raise click.BadParameter(f"--args must be a JSON object, got {args_json!r}")
    click.echo(f"loading {module} in the sandbox, then vetting it on its first rows (about 10 s)...",
               err=True)
    try:
        tasks = export_rows(module, args, count)
        write_tasks(tasks, out)
    except (VerifiersRefused, TaskFileError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {out}: {len(tasks)} tasks of kind verifiers, "
               f"dataset hash 0x{dataset_hash(tasks).hex()}")
    click.echo(f"a run on it names the environment verifiers.{module}")


def register_commands(group: click.Group) -> None:
    """Add `tasks` to the main CLI group."""
    group.add_command(tasks_group)


if __name__ == "__main__":
    tasks_group()
