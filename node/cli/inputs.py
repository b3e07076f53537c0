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
DEFAULT_PROMPTS_PER_STEP = 32  # node.rl.run.devnet_grpo's prompts_per_step, without importing torch
DEFAULT_GROUP_SIZE = 8  # node.rl.run.devnet_grpo's group_size

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

prompts_per_step_option = click.option(
    "--prompts-per-step",
    type=click.IntRange(1, 65536),
    default=DEFAULT_PROMPTS_PER_STEP,
    show_default=True,
    help="Prompts per GRPO step: distinct tasks drawn each step, so the task file needs at least this many.",
)
group_size_option = click.option(
    "--group-size",
    type=click.IntRange(2, 1024),
    default=DEFAULT_GROUP_SIZE,
    show_default=True,
    help="Completions sampled per prompt: the GRPO group whose rewards are compared with each other.",
)


def run_model_options(fn: Any) -> Any:
    """--model, --tasks and --max-new-tokens."""
    for option in (max_new_tokens_option, tasks_option, model_option):
        fn = option(fn)
    return fn


def load_run_inputs(
    model: Path | None,
    tasks: Path | None,
    eval_tasks: Path | None,
    *,
    prompts_per_step: int = DEFAULT_PROMPTS_PER_STEP,
    prompts_option: str | None = None,
) -> tuple[Path, list[Task], list[Task]]:
    """(model folder, training tasks, evaluation tasks) from the options, with clear errors.

    The training tasks must hold `prompts_per_step` distinct tasks (a step draws that many): checked here,
    before any model loads or node starts; `prompts_option` is the option that set it, if one did.
    """
    from swarmnode.node.devnet.rl import eval_tasks_of
    from swarmnode.node.rl.run import DEVNET_MODEL, devnet_dataset
    from swarmnode.node.rl.tasks.files import TaskFileError, read_tasks

    folder = model or DEVNET_MODEL
    try:
        train_tasks = read_tasks(tasks) if tasks else devnet_dataset()
        held_out = eval_tasks_of(str(tasks or ""), str(eval_tasks or ""))
    except (TaskFileError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if not (folder / "config.json").is_file():
        raise click.ClickException(f"{folder} is not a model folder (no config.json): see `model init`")
    require_model_folder(folder)
    require_sandbox(train_tasks + held_out)
    require_enough_tasks(len(train_tasks), prompts_per_step, tasks, prompts_option)
    return folder, train_tasks, held_out


def require_model_folder(folder: Path) -> None:
    """Stop with the folder's one-line fault (`model show`'s checks: a supported config, tokenizer and
    weights files) before any node starts, not in a traceback once nodes were set up."""
    from swarmnode.node.rl.model import ModelFolderError, read_config, tokenizer_files, weight_files

    try:
        read_config(folder)
        tokenizer_files(folder)
        weight_files(folder)
    except ModelFolderError as exc:
        raise click.ClickException(f"{exc}: see `swarmnode model show`, `swarmnode model init`") from None


def require_sandbox(tasks: Sequence[Task]) -> None:
    """Stop with one line naming what to install when some task's grader executes code and this machine
    cannot run the sandbox (before any model loads or node starts)."""
    from swarmnode.node.rl.tasks import require_sandbox_for
    from swarmnode.node.sandbox import SandboxUnavailable

    try:
        require_sandbox_for(tasks)
    except SandboxUnavailable as exc:
        raise click.ClickException(f"code tasks need the sandbox: {exc}") from None


def require_enough_tasks(
    count: int, prompts_per_step: int, tasks: Path | None, option: str | None = None
) -> None:
    """Stop with one line when a step's `prompts_per_step` distinct tasks cannot be drawn from `count` tasks
    (otherwise the first step dies deep in task assignment, after the model has loaded)."""
    if count >= prompts_per_step:
        return
    source = str(tasks) if tasks is not None else "the built-in task set"
    have = f"{source} has {count} task{'' if count == 1 else 's'}"
    if option is None:
        raise click.ClickException(
            f"{have}; the run takes {prompts_per_step} prompts per step and needs at least "
            f"{prompts_per_step} distinct tasks: add tasks"
        )
    raise click.ClickException(
        f"{have}; {option} {prompts_per_step} needs at least {prompts_per_step} distinct tasks: "
        f"lower {option} or add tasks"
    )
