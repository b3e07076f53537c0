"""CLI for model folders: `swarmnode model init DIR`, `swarmnode model show DIR`.

`init` writes a small test model folder in the Hugging Face layout (a byte-level BPE tokenizer trained on
task text, a tiny or small Qwen2 / Qwen3 / Llama model from a seed, optionally warm-started on the tasks
until a target pass rate) — the same kind of folder the devnet's built-in model is. `show` prints what a
node reads from a folder: its ModelInfo, the digests a RunDescriptor would carry for it, the parameter
count and the weights files. A folder or task file that cannot be used exits with status 1 and the typed
error on stderr; nothing is written then.

The ML stack (torch, transformers, tokenizers) is imported by the commands that need it, not at import:
the options come from `node.rl.recipes`, so the rest of the CLI starts in a second.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from swarmnode.node.rl.recipes import (
    DEFAULT_VOCAB_SIZE,
    SIZES,
    SPECIAL_TOKENS,
    SUPPORTED_MODEL_TYPES,
    WarmStartRecipe,
)
from swarmnode.node.rl.tasks import Task, TaskFileError, read_tasks

if TYPE_CHECKING:
    from swarmnode.node.rl.warmstart import EvalPoint

MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # the byte alphabet and the special tokens: no merges at all
WARM_EVAL_TASKS = 128  # tasks held out of warm-start training to judge when to stop (at most a quarter)
WARM_EVAL_EVERY = 25  # warm-start steps between two evaluations
SPARE_NEW_TOKENS = 2  # sampled beyond the longest target + EOS, so a wrong unterminated answer shows as such


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


def default_tasks() -> list[Task]:
    """The devnet's arithmetic dataset: what `init` trains the tokenizer on without --tasks."""
    from swarmnode.node.rl.run import devnet_dataset

    return devnet_dataset()


def _read(path: Path | None) -> list[Task]:
    if path is None:
        return default_tasks()
    try:
        tasks = read_tasks(path)
    except TaskFileError as exc:
        raise _fail(exc) from None
    if not tasks:
        raise click.ClickException(f"{path}: no tasks")
    return tasks


def split_for_warm_start(tasks: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """(training tasks, stop-eval tasks): the last WARM_EVAL_TASKS tasks (at most a quarter) held out."""
    held = min(WARM_EVAL_TASKS, len(tasks) // 4)
    if held < 1:
        raise click.ClickException(f"{len(tasks)} tasks are too few to warm-start on (at least 4)")
    return list(tasks[:-held]), list(tasks[-held:])


def _replace_dir(built: Path, out: Path) -> None:
    """Move the finished folder `built` to `out`, replacing what is there (the caller checked --force)."""
    if out.is_dir() and any(out.iterdir()):
        shutil.rmtree(out)
    os.replace(built, out)


def describe_folder(folder: Path) -> dict[str, Any]:
    """What `model show` prints: ModelInfo, the run's digests of the folder, parameters, weights files."""
    from safetensors import safe_open

    from swarmnode.node.rl.model import model_commitment, weight_files
    from swarmnode.node.rl.tokenizer import load_tokenizer

    tokenizer, info = load_tokenizer(folder)
    commitment = model_commitment(folder)
    weights = []
    parameters = 0
    for name in weight_files(folder):
        with safe_open(str(folder / name), framework="pt", device="cpu") as f:  # reads the header only
            shapes = [f.get_slice(k).get_shape() for k in f.keys()]
        count = sum(_numel(s) for s in shapes)
        parameters += count
        weights.append({"name": name, "size_bytes": (folder / name).stat().st_size, "tensors": len(shapes),
                        "parameters": count})
    return {
        "folder": str(folder),
        "model": {
            "model_type": info.model_type,
            "vocab_size": info.vocab_size,
            "hidden_size": info.hidden_size,
            "num_layers": info.num_layers,
            "max_positions": info.max_positions,
            "eos_token_ids": list(info.eos_token_ids),
            "pad_token_id": info.pad_token_id,
            "tokenizer_class": type(tokenizer.tokenizer).__name__,
        },
        "commitment": {
            "model_config_hash": "0x" + commitment.config_hash.hex(),
            "tokenizer_files": [
                {"name": f.name, "sha256": "0x" + f.sha256.hex()} for f in commitment.tokenizer_files
            ],
            "base_checkpoint_hash": "0x" + commitment.weights_root.hex(),
        },
        "parameters": parameters,
        "weights_files": weights,
    }


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _print_description(doc: dict[str, Any]) -> None:
    model, digests = doc["model"], doc["commitment"]
    click.echo(f"{doc['folder']}: {model['model_type']}, {doc['parameters']:,} parameters")
    click.echo(f"  vocab {model['vocab_size']}, hidden {model['hidden_size']}, {model['num_layers']} layers, "
               f"{model['max_positions']} positions, EOS {model['eos_token_ids']}, "
               f"pad {model['pad_token_id']} ({model['tokenizer_class']})")
    click.echo(f"  model_config_hash     {digests['model_config_hash']}")
    click.echo(f"  base_checkpoint_hash  {digests['base_checkpoint_hash']}")
    for f in digests["tokenizer_files"]:
        click.echo(f"  tokenizer {f['name']:<24} {f['sha256']}")
    for w in doc["weights_files"]:
        click.echo(f"  weights   {w['name']:<24} {w['size_bytes']:,} bytes, {w['tensors']} tensors")


@click.group("model")
def model_group() -> None:
    """Create and inspect model folders (Hugging Face layout: config.json, safetensors, tokenizer)."""


@model_group.command("init")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--arch", type=click.Choice(SUPPORTED_MODEL_TYPES), default="qwen2", show_default=True)
@click.option("--size", type=click.Choice(list(SIZES)), default="tiny", show_default=True)
@click.option("--tasks", "tasks_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="task file (JSONL or Parquet) whose chats train the tokenizer and the warm "
              "start [default: the devnet's arithmetic]")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="weights init seed")
@click.option("--vocab-size", type=click.IntRange(min=MIN_VOCAB_SIZE), default=DEFAULT_VOCAB_SIZE,
              show_default=True, help="BPE vocabulary (at most; small task sets give fewer)")
@click.option("--warm-start-pass", "warm_pass", type=click.FloatRange(0.0, 1.0), default=0.0,
              show_default=True, help="train on the tasks until this pass rate at temperature 1 (0: random "
              "weights)")
@click.option("--max-steps", type=click.IntRange(min=1), default=WarmStartRecipe.max_steps, show_default=True,
              help="warm-start steps before giving up")
@click.option("--keep-best", is_flag=True, help="if the warm start misses --warm-start-pass, write the "
              "model of its best evaluation anyway (and say so) instead of nothing")
@click.option("--force", is_flag=True, help="replace DIR if it is not empty")
@click.option("--json", "as_json", is_flag=True, help="print the new folder's description as JSON")
def init_command(directory: Path, arch: str, size: str, tasks_file: Path | None, seed: int, vocab_size: int,
                 warm_pass: float, max_steps: int, keep_best: bool, force: bool, as_json: bool) -> None:
    """Write a test model folder to DIR: a tokenizer trained on the tasks, a model from SEED."""
    directory = directory.resolve()
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise click.ClickException(f"{directory} is not empty: pass --force to replace it")
    tasks = _read(tasks_file)
    from swarmnode.node.rl.modelinit import chat_texts, init_model_folder
    from swarmnode.node.rl.tasks.graders import reference_completion

    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory.parent, prefix=f".{directory.name}.") as scratch:
        try:
            texts = chat_texts((t.prompt, reference_completion(t)) for t in tasks)
            built = init_model_folder(Path(scratch) / "init", texts,
                                      arch=arch, size=size, seed=seed, vocab_size=vocab_size)
            if warm_pass > 0:
                built = _warm(built, Path(scratch) / "warm", tasks, warm_pass, max_steps, keep_best)
        except ValueError as exc:
            raise _fail(exc) from None
        _replace_dir(built, directory)
    doc = describe_folder(directory)
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
    else:
        _print_description(doc)


def _warm(folder: Path, out: Path, tasks: Sequence[Task], target: float, max_steps: int,
          keep_best: bool) -> Path:
    from swarmnode.node.rl.tasks.graders import reference_completion
    from swarmnode.node.rl.tokenizer import load_tokenizer
    from swarmnode.node.rl.warmstart import warm_start

    train, held = split_for_warm_start(tasks)
    tokenizer, _ = load_tokenizer(folder)
    longest = max(len(tokenizer.encode(reference_completion(t))) for t in held)
    recipe = replace(WarmStartRecipe(), target_pass_rate=target, max_steps=max_steps,
                     eval_every=WARM_EVAL_EVERY, max_new_tokens=longest + 1 + SPARE_NEW_TOKENS)

    def report(point: EvalPoint) -> None:
        click.echo(f"warm start: step {point.step}, loss {point.loss:.3f}, pass rate {point.pass_rate:.3f}, "
                   f"{point.seconds:.0f}s", err=True)

    result = warm_start(folder, out, train, held, recipe, report, keep_best=keep_best)
    if result.reached_target:
        return result.folder
    best = f"pass rate {result.best_pass_rate:.3f} at best (step {result.best_step} of {result.steps})"
    if not keep_best:
        raise click.ClickException(f"warm start reached {best}, not {target}: nothing written; more "
                                   "--max-steps, a lower --warm-start-pass, or --keep-best to keep it")
    click.echo(f"warm start missed {target}: writing the model of its {best}", err=True)
    return result.folder


@model_group.command("show")
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
def show_command(directory: Path, as_json: bool) -> None:
    """ModelInfo, the digests a RunDescriptor carries for DIR, parameter count and weights files."""
    try:
        doc = describe_folder(directory)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
    else:
        _print_description(doc)


def register_commands(group: click.Group) -> None:
    """Add `model` to the main CLI group."""
    group.add_command(model_group)


@click.group()
def standalone() -> None:
    """swarmnode model commands (standalone entry point: python -m swarmnode.node.cli.model)."""


register_commands(standalone)

if __name__ == "__main__":
    standalone()
