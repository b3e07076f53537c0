"""CLI for the ledger: `swarmnode stake …`, `swarmnode register`, `swarmnode ledger …`.

Both backends behind one set of commands: `--ledger signed:PATH` (a signed-log file) or `--ledger evm:URL`
with `--contract ADDR` (also from SWARMNODE_LEDGER / SWARMNODE_CONTRACT). Writes sign with the node key
from `--key PATH` (a keystore; the password comes from SWARMNODE_PASSWORD or a prompt). Every query takes
`--json` for one machine-readable document; otherwise it prints a rich table. A refused operation exits
with status 1 and the ledger's typed error on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import os
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

from crypto.identity import NodeIdentity, format_address, parse_address
from crypto.keystore import PASSWORD_ENV, KeystoreError, load_keystore
from ledger import Ledger, LedgerError, Params, SignedLog, open_ledger, parse_ledger_url, verify_log
from ledger.types import GWEI_PER_NATIVE, ROLES

LEDGER_ENV = "SWARMNODE_LEDGER"
CONTRACT_ENV = "SWARMNODE_CONTRACT"
KEY_ENV = "SWARMNODE_KEY"
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gwei|eth|ether)?\s*$", re.IGNORECASE)


# --- helpers -----------------------------------------------------------------------------------


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


def _short(data: bytes) -> str:
    return "0x" + data.hex()[:12] + "…"


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    Console().print(table)


def load_identity(key: str | None) -> NodeIdentity:
    if not key:
        raise click.UsageError(f"this command signs: pass --key PATH (or set {KEY_ENV})")
    password = os.environ.get(PASSWORD_ENV)
    if password is None:
        password = click.prompt(f"password for {key}", hide_input=True)
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


# --- stake ---------------------------------------------------------------------------------------


@click.group("stake")
def stake_group() -> None:
    """Deposit, unbond and withdraw stake; show a node's stake."""


@stake_group.command("deposit")
@click.argument("amount")
@ledger_options
@key_option
@json_option
def stake_deposit(
    amount: str, ledger_spec: str, contract: str | None, key: str | None, as_json: bool
) -> None:
    """Bond AMOUNT (1500, 1500gwei, 0.5eth). On evm: real native currency; on a signed log: declared."""
    gwei = parse_amount(amount)
    identity = load_identity(key)
    with opened(ledger_spec, contract) as ledger:
        report_receipt("stake_deposit", ledger.deposit(identity, gwei), as_json)


@stake_group.command("unbond")
@click.argument("amount")
@ledger_options
@key_option
@json_option
def stake_unbond(amount: str, ledger_spec: str, contract: str | None, key: str | None, as_json: bool) -> None:
    """Start unbonding AMOUNT; it stays slashable for the unbonding delay."""
    gwei = parse_amount(amount)
    identity = load_identity(key)
    with opened(ledger_spec, contract) as ledger:
        report_receipt("stake_unbond", ledger.unbond(identity, gwei), as_json)


@stake_group.command("withdraw")
@ledger_options
@key_option
@json_option
def stake_withdraw(ledger_spec: str, contract: str | None, key: str | None, as_json: bool) -> None:
    """Withdraw all unbonded stake whose release epoch has come."""
    identity = load_identity(key)
    with opened(ledger_spec, contract) as ledger:
        report_receipt("stake_withdraw", ledger.withdraw(identity), as_json)


@stake_group.command("status")
@click.option("--node", "node_text", default=None, metavar="ADDR", help="default: the --key's address")
@ledger_options
@key_option
@json_option
def stake_status(
    node_text: str | None, ledger_spec: str, contract: str | None, key: str | None, as_json: bool
) -> None:
    """A node's stake, its requirement and whether it gets work."""
    address = address_arg(node_text) if node_text else load_identity(key).address
    assert address is not None
    with opened(ledger_spec, contract) as ledger:
        stake = ledger.stake(address)
        epoch = ledger.current_epoch()
    if stake is None:
        raise click.ClickException(f"{format_address(address)} is not registered")
    if as_json:
        emit_json({"epoch": epoch, "stake": stake})
        return
    _table(
        f"stake of {format_address(address)} (epoch {epoch})",
        ["bonded gwei", "unbonding gwei", "release epoch", "required gwei", "eligible"],
        [[stake.bonded_gwei, stake.unbonding_gwei, stake.release_epoch, stake.required_gwei, stake.eligible]],
    )


# --- register ------------------------------------------------------------------------------------


@click.command("register")
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--accelerator", required=True, help="kind, e.g. h100, a100, cpu")
@click.option("--count", type=int, required=True, help="number of accelerators (compute units)")
@click.option("--memory-gb", type=int, required=True)
@click.option("--benchmark-gflops", type=int, default=0, show_default=True, help="measured throughput")
@click.option("--peer-id", default=None, help="default: derived from the key")
@ledger_options
@key_option
@json_option
def register_command(
    role: str,
    accelerator: str,
    count: int,
    memory_gb: int,
    benchmark_gflops: int,
    peer_id: str | None,
    ledger_spec: str,
    contract: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Register this node's role and compute in the ledger."""
    from protocol.ledger_messages import ComputeSpec

    identity = load_identity(key)
    spec = ComputeSpec(
        accelerator=accelerator, count=count, memory_gb=memory_gb, benchmark_gflops=benchmark_gflops
    )
    with opened(ledger_spec, contract) as ledger:
        report_receipt("register_node", ledger.register(identity, role, spec, peer_id), as_json)


# --- ledger --------------------------------------------------------------------------------------


@click.group("ledger")
def ledger_group() -> None:
    """Query, audit and deploy the ledger."""


@ledger_group.command("nodes")
@ledger_options
@json_option
def ledger_nodes(ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Registered nodes, in registration order."""
    with opened(ledger_spec, contract) as ledger:
        nodes = ledger.nodes()
    if as_json:
        emit_json({"nodes": nodes})
        return
    _table(
        "nodes",
        ["address", "role", "compute", "peer id", "since epoch", "slashes", "ejected"],
        [
            [
                format_address(n.address),
                n.role,
                f"{n.compute.count}x {n.compute.accelerator} {n.compute.memory_gb} GB",
                n.peer_id,
                n.registered_epoch,
                n.slash_count,
                n.ejected,
            ]
            for n in nodes
        ],
    )


@ledger_group.command("stakes")
@ledger_options
@json_option
def ledger_stakes(ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Every registered node's stake."""
    with opened(ledger_spec, contract) as ledger:
        stakes = ledger.stakes()
        epoch = ledger.current_epoch()
    if as_json:
        emit_json({"epoch": epoch, "stakes": stakes})
        return
    _table(
        f"stakes (epoch {epoch})",
        ["address", "bonded", "unbonding", "release", "required", "eligible"],
        [
            [
                format_address(s.address),
                s.bonded_gwei,
                s.unbonding_gwei,
                s.release_epoch,
                s.required_gwei,
                s.eligible,
            ]
            for s in stakes
        ],
    )


@ledger_group.command("contributions")
@click.option("--node", "node_text", default=None, metavar="ADDR", help="worker or validator")
@click.option("--run", default=None)
@ledger_options
@json_option
def ledger_contributions(
    node_text: str | None, run: str | None, ledger_spec: str, contract: str | None, as_json: bool
) -> None:
    """Credited contributions, optionally for one node or run."""
    node = address_arg(node_text)
    with opened(ledger_spec, contract) as ledger:
        records = ledger.contributions(node=node, run=run)
    if as_json:
        emit_json({"contributions": records, "total_tokens": sum(r.tokens for r in records)})
        return
    _table(
        "contributions",
        ["#", "run", "step", "worker", "validator", "tokens", "flops", "rollout", "epoch"],
        [
            [
                r.index,
                r.run,
                r.step,
                format_address(r.worker),
                format_address(r.validator),
                r.tokens,
                r.flops,
                _short(r.rollout_digest),
                r.epoch,
            ]
            for r in records
        ],
    )


@ledger_group.command("slashes")
@click.option("--node", "node_text", default=None, metavar="ADDR")
@ledger_options
@json_option
def ledger_slashes(node_text: str | None, ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Slashes with their evidence digests."""
    node = address_arg(node_text)
    with opened(ledger_spec, contract) as ledger:
        records = ledger.slashes(node=node)
    if as_json:
        emit_json({"slashes": records})
        return
    _table(
        "slashes",
        ["#", "run", "worker", "validator", "taken", "reason", "chunks", "submission", "epoch", "ejected"],
        [
            [
                r.index,
                r.run,
                format_address(r.worker),
                format_address(r.validator),
                r.taken_gwei,
                r.reason_code,
                ",".join(map(str, r.failing_chunks)),
                _short(r.submission_digest),
                r.epoch,
                r.ejected,
            ]
            for r in records
        ],
    )


@ledger_group.command("verify")
@ledger_options
@json_option
def ledger_verify(ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Audit a signed log end to end (exit 1 naming the first bad entry); on evm, check the deployed code."""
    try:
        kind, target = parse_ledger_url(ledger_spec)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if kind == "evm":
        _verify_contract(target, contract, as_json)
        return
    if not Path(target).exists():
        raise click.ClickException(f"no signed log at {target}")
    report = verify_log(Path(target))
    head = report.signed_head
    document = {
        "ok": report.ok,
        "entries": report.entries,
        "head": report.head,
        "merkle_root": report.root,
        "checkpoints": report.checkpoints,
        "first_bad_entry": report.first_bad,
        "truncated": report.truncated,
        "signed_head": None if head is None else {"entries": head.size, "head": head.head, "signer": head.signer},
        "error": None if report.error is None else str(report.error),
    }
    if as_json:
        emit_json(document)
    elif report.ok:
        signer = "" if head is None else f", head signed by {format_address(head.signer)}"
        click.echo(
            f"ok: {report.entries} entries, head 0x{report.head.hex()}, merkle root 0x{report.root.hex()}, "
            f"{report.checkpoints} epoch checkpoints{signer}"
        )
    if report.truncated:
        raise click.ClickException(f"log is truncated: {report.error}")
    if not report.ok:
        raise click.ClickException(f"log is corrupt: {report.error}")


def _verify_contract(url: str, contract: str | None, as_json: bool) -> None:
    from ledger.artifact import load_artifact
    from ledger.evm import EvmLedger

    if contract is None:
        raise click.ClickException(f"pass --contract (or set {CONTRACT_ENV})")
    try:
        evm = EvmLedger.connect(url, contract)
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc
    code = bytes(evm.w3.eth.get_code(evm.address))
    expected = bytes.fromhex(load_artifact()["bytecode_runtime"].removeprefix("0x"))
    ok = code[: len(expected)] == expected  # immutables are appended after the runtime code
    if as_json:
        emit_json({"ok": ok, "contract": evm.address, "code_size": len(code)})
    elif ok:
        click.echo(f"ok: {evm.address} runs the committed SwarmLedger artifact")
    if not ok:
        raise click.ClickException(f"{evm.address} does not run the committed SwarmLedger bytecode")


@ledger_group.command("deploy")
@click.option(
    "--min-stake-per-unit",
    "min_stake",
    default=str(Params().min_stake_per_unit_gwei),
    show_default=True,
    help="gwei per compute unit (or e.g. 0.1eth)",
)
@click.option(
    "--unbonding-delay", type=int, default=Params().unbonding_delay_epochs, show_default=True, help="epochs"
)
@click.option("--slash-amount", default=str(Params().slash_gwei), show_default=True, help="gwei")
@click.option("--ejection-threshold", type=int, default=Params().ejection_threshold, show_default=True)
@click.option("--epoch-seconds", type=int, default=Params().epoch_seconds, show_default=True)
@click.option("--ledger-id", default="default", show_default=True, help="signed log only: its id")
@ledger_options
@key_option
@json_option
def ledger_deploy(
    min_stake: str,
    unbonding_delay: int,
    slash_amount: str,
    ejection_threshold: int,
    epoch_seconds: int,
    ledger_id: str,
    ledger_spec: str,
    contract: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Create a signed log file, or deploy the contract to an EVM URL (signed with --key)."""
    try:
        params = Params(
            min_stake_per_unit_gwei=parse_amount(min_stake),
            unbonding_delay_epochs=unbonding_delay,
            slash_gwei=parse_amount(slash_amount),
            ejection_threshold=ejection_threshold,
            epoch_seconds=epoch_seconds,
        )
        kind, target = parse_ledger_url(ledger_spec)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if kind == "signed":
        try:
            SignedLog.create(Path(target), params, ledger_id=ledger_id).close()
        except (FileExistsError, LedgerError) as exc:
            raise click.ClickException(str(exc)) from exc
        document: dict[str, Any] = {"ledger": ledger_spec, "ledger_id": ledger_id, "params": params}
    else:
        address = _deploy_contract(target, load_identity(key), params)
        document = {"ledger": ledger_spec, "contract": address, "params": params}
    if as_json:
        emit_json(document)
    else:
        where = document.get("contract") or target
        click.echo(f"deployed {kind} ledger at {where} with {to_jsonable(params)}")


def _deploy_contract(url: str, deployer: NodeIdentity, params: Params) -> str:
    from web3 import Web3

    from ledger.evm import deploy_contract

    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 60}))
    if not w3.is_connected():
        raise click.ClickException(f"cannot reach a JSON-RPC node at {url}")
    try:
        return deploy_contract(w3, deployer, params)
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc


def register_commands(group: click.Group) -> None:
    """Add `stake`, `register` and `ledger` to the main CLI group."""
    group.add_command(stake_group)
    group.add_command(register_command)
    group.add_command(ledger_group)


@click.group()
def standalone() -> None:
    """swarmnode ledger commands (standalone entry point: python -m node.cli_ledger)."""


register_commands(standalone)

if __name__ == "__main__":
    standalone()
