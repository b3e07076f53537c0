"""CLI: `swarmnode plan-memory --model DIR --nproc N`: per-rank memory of an FSDP2 trainer for a model folder.

Reads only the folder's config.json (the architecture is built on the meta device, no weights are read) and
prints node.rl.memory_plan's plan: a table by default, one JSON object with --json. A folder that is not a
supported model, or a config that does not build one, is a usage error (exit status 2) naming the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from swarmnode.node.rl.recipes import PARAM_DTYPES

if TYPE_CHECKING:  # torch and transformers load when the command runs, not with the CLI
    from swarmnode.node.rl.memory_plan import MemoryPlan, ParameterCounts, RankMemory

DEFAULT_MICRO_BATCH_TOKENS = 4096
DEFAULT_DEVICE_GIB = 80.0
GIB = 1 << 30
_ROWS = (
    ("weights", "weights"),
    ("gradients", "gradients"),
    ("optimizer", "AdamW state"),
    ("gathered", "gathered params"),
    ("grad_buffer", "unsharded gradient"),
    ("activations", "activations"),
    ("logits", "fp32 log-softmax"),
)


def folder_counts(folder: Path) -> ParameterCounts:
    """Parameter counts of the folder's config; a folder that cannot give them is a usage error."""
    from swarmnode.node.rl.memory_plan import count_parameters
    from swarmnode.node.rl.model import ModelFolderError, read_config

    try:
        config = read_config(folder)
    except ModelFolderError as exc:
        raise click.BadParameter(str(exc), param_hint="--model") from None
    try:
        return count_parameters(config)
    except ValueError as exc:
        raise click.BadParameter(f"{folder / 'config.json'}: {exc}", param_hint="--model") from None


def _memory_doc(memory: RankMemory) -> dict[str, int]:
    doc = {f"{field}_bytes": getattr(memory, field) for field, _ in _ROWS}
    doc["state_bytes"] = memory.state
    doc["total_bytes"] = memory.total
    return doc


def plan_doc(folder: Path, counts: ParameterCounts, plan: MemoryPlan, budget: int) -> dict[str, Any]:
    """What --json prints: the model's counts, the plan per rank and unsharded, and whether it fits."""
    from swarmnode.node.rl.memory_plan import min_ranks

    return {
        "model": str(folder),
        "parameters": counts.total,
        "largest_layer_parameters": counts.largest_layer,
        "root_parameters": counts.root,
        "tied_embeddings": counts.tied_embeddings,
        "nproc": plan.nproc,
        "micro_batch_tokens": plan.tokens,
        "param_dtype": plan.param_dtype,
        "activation_bytes_per_token_layer": plan.activation_bytes_per_token_layer,
        "activation_c": plan.activation_bytes_per_token_layer / counts.shape.hidden,
        "per_rank": _memory_doc(plan.per_rank),
        "single_process": _memory_doc(plan.single_process),
        "device_memory_bytes": budget,
        "fits": plan.fits(budget),
        "min_nproc": min_ranks(counts, plan.tokens, plan.param_dtype, budget),
    }


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f}"


def _print_plan(doc: dict[str, Any]) -> None:
    console = Console()
    n = doc["nproc"]
    tied = "tied" if doc["tied_embeddings"] else "untied"
    console.print(f"{doc['model']}: {doc['parameters']:,} parameters ({tied} embeddings; largest layer "
                  f"{doc['largest_layer_parameters']:,}, root {doc['root_parameters']:,})")
    table = Table(title=f"GiB, {doc['param_dtype']} parameters, {doc['micro_batch_tokens']:,} tokens per "
                        "micro-batch, no activation checkpointing")
    table.add_column("")
    table.add_column(f"per rank (N={n})", justify="right")
    table.add_column("one process", justify="right")
    rank, single = doc["per_rank"], doc["single_process"]
    for field, label in _ROWS:
        table.add_row(label, _gib(rank[f"{field}_bytes"]), _gib(single[f"{field}_bytes"]))
    table.add_row("weights+grads+optimizer", _gib(rank["state_bytes"]), _gib(single["state_bytes"]))
    table.add_row("total", _gib(rank["total_bytes"]), _gib(single["total_bytes"]), style="bold")
    console.print(table)
    master = " + fp32 master copy" if doc["param_dtype"] == "bf16" else ""
    console.print(f"AdamW state: fp32 exp_avg + exp_avg_sq{master}; gathered: 2 layers + the root group "
                  "(embeddings, norm, lm_head)")
    console.print(f"activations per layer ~ T x hidden x c bytes, c = {doc['activation_c']:.1f}")
    budget = _gib(doc["device_memory_bytes"])
    verdict = "[green]fits[/]" if doc["fits"] else "[red]does not fit[/]"
    console.print(f"N={n}: {verdict} one {budget} GiB device")
    if doc["min_nproc"] is None:
        console.print(f"no N fits {budget} GiB: the unsharded part (activations, gathered layers) exceeds "
                      "it; use fewer tokens per micro-batch")
    else:
        console.print(f"fewest ranks that fit {budget} GiB: {doc['min_nproc']}")


@click.command("plan-memory")
@click.option("--model", "folder", required=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Hugging Face model folder (only config.json is read)")
@click.option("--nproc", required=True, type=click.IntRange(min=1), help="FSDP2 ranks the trainer runs")
@click.option("--micro-batch-tokens", "tokens", type=click.IntRange(min=1),
              default=DEFAULT_MICRO_BATCH_TOKENS, show_default=True,
              help="tokens one rank runs forward and backward at a time")
@click.option("--param-dtype", type=click.Choice(list(PARAM_DTYPES)), default="bf16", show_default=True)
@click.option("--device-gib", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_DEVICE_GIB,
              show_default=True, help="memory of one device, to say whether the plan fits")
@click.option("--json", "as_json", is_flag=True, help="one JSON object on stdout")
def plan_memory(folder: Path, nproc: int, tokens: int, param_dtype: str, device_gib: float,
                as_json: bool) -> None:
    """Weights, gradients, AdamW state and activations per rank of an N-rank FSDP2 trainer for DIR."""
    from swarmnode.node.rl import memory_plan

    counts = folder_counts(folder)
    budget = int(device_gib * GIB)
    doc = plan_doc(folder, counts, memory_plan.plan_memory(counts, nproc, tokens, param_dtype), budget)
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
    else:
        _print_plan(doc)

