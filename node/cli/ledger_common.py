"""What every ledger command shares: which ledger, which key, how to print (`stake`, `register`, `ledger`).

Both backends behind one set of commands: `--ledger signed:PATH` (a signed-log file) or `--ledger evm:URL`
with `--contract ADDR` (also from SWARMNODE_LEDGER / SWARMNODE_CONTRACT). Writes sign with the node key
from `--key PATH` (a keystore; the password comes from SWARMNODE_PASSWORD, taken out of the environment once,
or a prompt: `node.cli.password`). Every query takes `--json` for one machine-readable document; otherwise
it prints a rich table. A refused operation exits with status 1 and the ledger's typed error on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal, InvalidOperation
from functools import wraps
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from swarmnode.crypto.identity import NodeIdentity, format_address, parse_address
from swarmnode.crypto.keystore import KeystoreError, load_keystore
from swarmnode.ledger import Ledger, LedgerError, open_ledger
from swarmnode.ledger.types import GWEI_PER_NATIVE
from swarmnode.node.cli.password import key_password

LEDGER_ENV = "SWARMNODE_LEDGER"
CONTRACT_ENV = "SWARMNODE_CONTRACT"
KEY_ENV = "SWARMNODE_KEY"
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gwei|eth|ether)?\s*$", re.IGNORECASE)


def parse_amount(text: str) -> int:
    """`1500` or `1500gwei` → gwei; `0.5eth` → 500000000 gwei. Must be a whole, positive number of gwei."""
    match = _AMOUNT.match(text)
    if not match:
        raise click.BadParameter(f"{text!r}: expected an amount like 1500, 1500gwei or 0.5eth")
    number, unit = match.group(1), (match.group(2) or "gwei").lower()
    try:
        gwei = Decimal(number) * (GWEI_PER_NATIVE if unit in ("eth", "ether") else 1)
    except InvalidOperation as exc:
        raise click.BadParameter(f"{text!r} is not a number") from exc
    if gwei != gwei.to_integral_value() or gwei <= 0:
        raise click.BadParameter(f"{text!r} is not a positive whole number of gwei")
    return int(gwei)


def to_jsonable(value: Any) -> Any:
    """Dataclasses to dicts; 20-byte values as checksummed addresses, other bytes as 0x hex."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return format_address(value) if len(value) == 20 else "0x" + value.hex()
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def emit_json(document: Any) -> None:
    click.echo(json.dumps(to_jsonable(document), sort_keys=True))


def short_hex(data: bytes) -> str:
    return "0x" + data.hex()[:12] + "…"


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")  # addresses and digests wrap, never cut
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    Console().print(table)


def load_identity(key: str | None) -> NodeIdentity:
    if not key:
        raise click.UsageError(f"this command signs: pass --key PATH (or set {KEY_ENV})")
    password = key_password(prompt=f"password for {key}", tty_only=False)
    try:
        return load_keystore(Path(key), password)
    except KeystoreError as exc:
        raise click.ClickException(str(exc)) from exc


@contextmanager
def opened(spec: str, contract: str | None) -> Iterator[Ledger]:
    try:
        ledger = open_ledger(spec, contract=contract)
    except (ValueError, FileNotFoundError, LedgerError) as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        yield ledger
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        ledger.close()


def ledger_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--ledger and --contract, shared by every command."""

    @click.option(
        "--ledger",
        "ledger_spec",
        envvar=LEDGER_ENV,
        required=True,
        metavar="signed:PATH|evm:URL",
        help=f"which ledger (env {LEDGER_ENV})",
    )
    @click.option(
        "--contract",
        envvar=CONTRACT_ENV,
        default=None,
        metavar="ADDR",
        help=f"the ledger contract on an evm: ledger (env {CONTRACT_ENV})",
    )
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


def key_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--key",
        envvar=KEY_ENV,
        default=None,
        metavar="PATH",
        help=f"node keystore that signs (env {KEY_ENV})",
    )(func)


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="print one JSON document")(func)


def address_arg(text: str | None) -> bytes | None:
    if text is None:
        return None
    try:
        return parse_address(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def report_receipt(what: str, receipt: Any, as_json: bool) -> None:
    if as_json:
        emit_json({"operation": what, "receipt": receipt})
    else:
        click.echo(
            f"{what}: accepted at position {receipt.position} (epoch {receipt.epoch}), "
            f"ref 0x{receipt.ref.hex()}"
        )
