"""`swarmnode status`: what a running node is doing, from the status file it rewrites every second.

Every node writes `data_dir/status.json` (node.runtime: identity, readiness, peers, the roles it found,
gossip and request counters, its work); this command reads it and prints it as a few lines
(node.status_view) followed by the dashboard's figures, labelled as on the page the metrics port serves
(node.dashboard); --figures prints those figures as JSON, --json the whole document. It reads a file, so it
needs no key, no port and no network: point it at the node's data directory or at its config file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from rich.console import Console

from swarmnode.node.dashboard import figures
from swarmnode.node.status_view import STATUS_FILE, describe, figure_lines


def status_path(target: Path) -> Path:
    """The status file of the node whose data directory or config file `target` is."""
    if target.is_dir():
        return target / STATUS_FILE
    from swarmnode.node.config import ConfigError, load_config

    try:
        document = load_config(target)
    except ConfigError as exc:
        raise click.ClickException(f"{target}: {exc}") from None
    return document.data_dir / STATUS_FILE


@click.command("status")
@click.argument(
    "target", metavar="[DATA_DIR|CONFIG]", default=".", type=click.Path(exists=True, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True, help="the whole status document, as the node wrote it")
@click.option("--figures", "as_figures", is_flag=True, help="the dashboard's figures, as JSON")
def status_command(target: Path, as_json: bool, as_figures: bool) -> None:
    """What a node on this machine is doing: its role, peers, what it waits for, its work, its figures.

    TARGET is the node's data directory (data_dir in its node.toml) or its node.toml (default: the current
    directory). A node not updating its status for 10 s is shown as stopped, hung or killed. The figures
    are the ones the node's dashboard shows (http://127.0.0.1:METRICS_PORT/).
    """
    path = status_path(target)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise click.ClickException(
            f"{path} does not exist: no node has run with this data directory (`swarmnode run` starts one)"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from None
    if as_json:
        click.echo(json.dumps(document, indent=1, sort_keys=True))
        return
    if as_figures:
        click.echo(json.dumps(figures(document), indent=1))
        return
    console = Console(highlight=False, soft_wrap=True)
    for line in describe(document, time.time()):
        console.print(line)
    for line in figure_lines(document):
        console.print(line, markup=False)  # reason names and versions read as written, never as markup
