"""`swarmnode`: one binary for every role. Sub-commands group by what an operator does.

The CLI is the edge: it reads files, prompts and environment variables, then calls pure code.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from importlib.metadata import version as package_version
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from crypto.identity import NodeIdentity
from crypto.keystore import PASSWORD_ENV, KeystoreError, load_keystore, save_keystore

DEFAULT_KEY = Path(os.environ.get("SWARMNODE_KEY", Path.home() / ".swarmnode" / "node.key"))
console = Console()


def read_password(*, confirm: bool) -> str:
    """The keystore password: SWARMNODE_PASSWORD if set, else an interactive prompt."""
    from_env = os.environ.get(PASSWORD_ENV)
    if from_env is not None:
        return from_env
    if not sys.stdin.isatty():
        raise click.UsageError(f"no terminal to prompt for the key password; set {PASSWORD_ENV}")
    return click.prompt("Key password", hide_input=True, confirmation_prompt=confirm)


def open_identity(key: Path) -> NodeIdentity:
    """Load the node key or exit with an error that says what to do."""
    try:
        return load_keystore(key, read_password(confirm=False))
    except KeystoreError as exc:
        raise click.ClickException(str(exc)) from None


key_option = click.option(
    "--key", type=click.Path(path_type=Path), default=DEFAULT_KEY, show_default=True,
    help="Keystore v3 file of the node key (env SWARMNODE_KEY).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def main() -> None:
    """swarmnode: a node of a permissionless swarm that trains language models with RL.

    One binary, four roles (trainer, relay, worker, validator). Start with `swarmnode keys new`,
    stake and register (`swarmnode stake`, `swarmnode register`), then `swarmnode run --role ...`.
    `swarmnode devnet` runs a whole swarm on this machine.
    """


@main.command()
def version() -> None:
    """Print the swarmnode version and the protocol version it speaks."""
    from protocol.ids import PROTOCOL_VERSION

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
        save_keystore(identity, key, read_password(confirm=True))
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
    return Path(__file__).resolve().parent.parent / "spec" / "vectors"


@main.command()
@click.option("--vectors", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Directory of *.json vector files (default: this tree's spec/vectors).")
@click.option("--verbose", "-v", is_flag=True, help="List every case, not only the failing ones.")
def conformance(vectors: Path | None, verbose: bool) -> None:
    """Replay protocol conformance vectors through the real decoder and verifiers."""
    from node.conformance import load_suites, run_suites

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


if __name__ == "__main__":
    main()
