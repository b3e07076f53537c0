"""The options that name a run's model and tasks, shared by `devnet`, `train --sync` and `calibrate`.

`swarmnode devnet --model DIR --tasks FILE` and `swarmnode train --sync` take the same arguments, so they are
declared once here. Light imports only: the devnet's CLI loads this before any torch work.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from swarmnode.node.rl.tasks import Task

DEFAULT_MAX_NEW_TOKENS = 6  # node.rl.run.DEVNET_MAX_NEW_TOKENS, without importing torch

model_option = click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="The run's model: a Hugging Face causal-LM folder (Qwen2/2.5/3, Llama; default: the built-in tiny "
    "Qwen2). `swarmnode model init` writes one.",
)
tasks_option = click.option(
    "--tasks",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The run's tasks: a JSONL or Parquet file (prompt, kind, answer or tests; default: generated "
    "two-digit additions). `swarmnode tasks show FILE` checks one.",
)
max_new_tokens_option = click.option(
    "--max-new-tokens",
    type=click.IntRange(1),
    default=DEFAULT_MAX_NEW_TOKENS,
    show_default=True,
    help="The longest completion of the run (6 fits the additions' answers; math and code need more).",
)
eval_tasks_option = click.option(
    "--eval-tasks",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Held-out tasks the reward is measured on, before and after (default with --tasks: its first 128 "
    "tasks, which are not held out).",
)


def run_model_options(fn: Any) -> Any:
    """--model, --tasks and --max-new-tokens."""
    for option in (max_new_tokens_option, tasks_option, model_option):
        fn = option(fn)
    return fn


def load_run_inputs(
    model: Path | None, tasks: Path | None, eval_tasks: Path | None
) -> tuple[Path, list[Task], list[Task]]:
    """(model folder, training tasks, evaluation tasks) from the options, with clear errors."""
    from swarmnode.node.devnet.rl import eval_tasks_of
    from swarmnode.node.rl.run import DEVNET_MODEL, devnet_dataset
    from swarmnode.node.rl.tasks.files import TaskFileError, read_tasks

    folder = model or DEVNET_MODEL
    try:
        train_tasks = read_tasks(tasks) if tasks else devnet_dataset()
        held_out = eval_tasks_of(str(tasks or ""), str(eval_tasks or ""))
    except (TaskFileError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if not (folder / "config.json").is_file():  # the engine then names what else is missing
        raise click.ClickException(f"{folder} is not a model folder (no config.json): see `model init`")
    require_sandbox(train_tasks + held_out)
    return folder, train_tasks, held_out


def require_sandbox(tasks: Sequence[Task]) -> None:
    """Stop with one line naming what to install when some task's grader executes code and this machine
    cannot run the sandbox (before any model loads or node starts)."""
    from swarmnode.node.rl.tasks import require_sandbox_for
    from swarmnode.node.sandbox import SandboxUnavailable

    try:
        require_sandbox_for(tasks)
    except SandboxUnavailable as exc:
        raise click.ClickException(f"code tasks need the sandbox: {exc}") from None
