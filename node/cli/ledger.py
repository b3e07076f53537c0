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

from swarmnode.crypto.identity import NodeIdentity, format_address, parse_address
from swarmnode.crypto.keystore import PASSWORD_ENV, KeystoreError, load_keystore
from swarmnode.ledger import (
    Ledger,
    LedgerError,
    Params,
    SignedLog,
    SlashRecord,
    open_ledger,
    parse_ledger_url,
    verify_log,
)
from swarmnode.ledger.proofs import ProofFormatError, dump_proof, load_proof, proof_to_json
from swarmnode.ledger.types import GWEI_PER_NATIVE, ROLES, SLASH_PENDING, SLASH_VOIDED
from swarmnode.protocol.codec import Pattern
from swarmnode.protocol.ledger_messages import FLOPS_PER_TOKEN_MAX, MAX_RUN_VALIDATORS, RUN_LIMIT_MAX, U32_MAX
from swarmnode.protocol.types import RunId

LEDGER_ENV = "SWARMNODE_LEDGER"
CONTRACT_ENV = "SWARMNODE_CONTRACT"
KEY_ENV = "SWARMNODE_KEY"
RUN_ID = re.compile(next(m.regex for m in RunId.__metadata__ if isinstance(m, Pattern)))
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
        table.add_column(column, overflow="fold")  # addresses and digests wrap, never cut
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
@ledger_options
@key_option
@json_option
def register_command(
    role: str,
    accelerator: str,
    count: int,
    memory_gb: int,
    benchmark_gflops: int,
    ledger_spec: str,
    contract: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Register this node's role and compute in the ledger.

    The node's libp2p peer id is derived from the --key, and the ledger binds it to that key: a node can
    only register its own peer id. Stake the required amount next (`swarmnode stake deposit`): the minimum
    per compute unit times --count.
    """
    from swarmnode.protocol.ledger_messages import ComputeSpec

    identity = load_identity(key)
    spec = ComputeSpec(
        accelerator=accelerator, count=count, memory_gb=memory_gb, benchmark_gflops=benchmark_gflops
    )
    with opened(ledger_spec, contract) as ledger:
        receipt = ledger.register(identity, role, spec)
    if as_json:
        emit_json({"operation": "register_node", "peer_id": identity.peer_id, "receipt": receipt})
    else:
        report_receipt("register_node", receipt, as_json)
        click.echo(f"{identity.checksum_address} is a {role} with peer id {identity.peer_id}")


# --- ledger --------------------------------------------------------------------------------------


@click.group("ledger")
def ledger_group() -> None:
    """Query, audit and deploy the ledger.

    \b
    The flow:
      ledger deploy                once: a signed-log file, or the contract on a chain
      register, stake deposit      every node: its role and compute, then its stake
      ledger run register          the trainer: its run, the validators it trusts, the bounds of a credit
      (the node)                   validators commit credit batches and file slashes as they validate
      contributions, batches,      read the credited work; totals is what a reward split reads
      totals
      prove                        prove one credit is in its batch; check a saved proof
      slashes, slash void|finalize see and settle slashes after their challenge window
      verify                       audit every record
    """


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
    """Credited contributions, optionally for one node or run, each with the batch that credited it.

    `swarmnode ledger prove --contribution N` proves one of them is in its batch's Merkle root.
    """
    node = address_arg(node_text)
    with opened(ledger_spec, contract) as ledger:
        records = ledger.contributions(node=node, run=run)
    if as_json:
        emit_json({"contributions": records, "total_tokens": sum(r.tokens for r in records)})
        return
    _table(
        "contributions",
        ["#", "batch", "run", "step", "worker", "validator", "tokens", "flops", "rollout", "epoch"],
        [
            [
                r.index,
                r.batch,
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


@ledger_group.command("batches")
@click.option("--run", default=None, help="only this run's batches")
@ledger_options
@json_option
def ledger_batches(run: str | None, ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Committed credit batches: one validator's credits of one run as one entry (one transaction on chain).

    The ledger stores each batch's Merkle root over its credits and the per-worker totals; its contributions
    are numbered first..first+count-1.
    """
    with opened(ledger_spec, contract) as ledger:
        records = ledger.batches(run=run)
    if as_json:
        emit_json({"batches": records})
        return
    _table(
        "batches",
        ["#", "run", "validator", "credits", "first contribution", "root", "epoch"],
        [
            [
                b.index,
                b.run,
                format_address(b.validator),
                b.count,
                b.first_contribution,
                _short(b.root),
                b.epoch,
            ]
            for b in records
        ],
    )


@ledger_group.command("totals")
@click.option("--run", default=None, help="only this run's workers")
@ledger_options
@json_option
def ledger_totals(run: str | None, ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Each worker's credited work per run: credits, tokens, flops. What a reward split reads."""
    with opened(ledger_spec, contract) as ledger:
        records = ledger.totals(run=run)
    if as_json:
        emit_json({"totals": records})
        return
    _table(
        "totals",
        ["run", "worker", "credits", "tokens", "flops"],
        [[t.run, format_address(t.worker), t.credits, t.tokens, t.flops] for t in records],
    )


@ledger_group.command("slashes")
@click.option(
    "--node", "node_text", default=None, metavar="ADDR", help="as the slashed worker or the slasher"
)
@click.option("--run", default=None, help="only this run's slashes")
@click.option(
    "--pending", is_flag=True, help="only slashes still in their challenge window (or awaiting finalize)"
)
@ledger_options
@json_option
def ledger_slashes(
    node_text: str | None,
    run: str | None,
    pending: bool,
    ledger_spec: str,
    contract: str | None,
    as_json: bool,
) -> None:
    """Slashes with the submission each cites and where each stands.

    A slash is filed pending: nothing is taken during its run's challenge window, while the run's owner (at
    once) or a majority of the run's other validators (by vote) may void it, which costs the slasher what it
    asked (`swarmnode ledger slash void`). From its final epoch anyone may finalize it, which takes the
    worker's stake (`swarmnode ledger slash finalize`).
    """
    node = address_arg(node_text)
    with opened(ledger_spec, contract) as ledger:
        epoch = ledger.current_epoch()
        records = [
            r
            for r in ledger.slashes(node=node)
            if (run is None or r.run == run) and (not pending or r.status == SLASH_PENDING)
        ]
    if as_json:
        emit_json({"epoch": epoch, "slashes": records})
        return
    _table(
        f"slashes (epoch {epoch})",
        [
            "#",
            "run",
            "worker",
            "validator",
            "status",
            "gwei asked/taken/penalty",
            "votes",
            "reason",
            "chunks",
        ],
        [
            [
                r.index,
                r.run,
                format_address(r.worker),
                format_address(r.validator),
                _slash_status(r),
                f"{r.requested_gwei}/{r.taken_gwei}/{r.penalty_gwei}",
                r.votes,
                r.reason_code,
                ",".join(map(str, r.failing_chunks)),
            ]
            for r in records
        ],
    )


def _slash_status(record: SlashRecord) -> str:
    ejected = ", ejected" if record.ejected else ""
    if record.status == SLASH_PENDING:
        return f"pending, final from epoch {record.final_epoch}"
    return f"{record.status}{ejected}"


@ledger_group.group("slash")
def slash_group() -> None:
    """Settle a pending slash: void it within its challenge window, or finalize it after.

    Validators file slashes as they validate (the node does it); these commands settle them. See
    `swarmnode ledger slashes --pending`.
    """


@slash_group.command("void")
@click.argument("index", type=click.IntRange(min=0))
@ledger_options
@key_option
@json_option
def slash_void(index: int, ledger_spec: str, contract: str | None, key: str | None, as_json: bool) -> None:
    """Void pending slash INDEX, or vote to.

    Signed by the run's owner, it voids the slash at once; signed by another of the run's validators, it is
    one vote, and the vote that reaches a majority of the run's validators other than the slasher voids it.
    A voided slash leaves the worker's stake alone and takes what the slash asked from the slasher.
    Refused once the challenge window has closed.
    """
    identity = load_identity(key)
    with opened(ledger_spec, contract) as ledger:
        receipt = ledger.void_slash(identity, index)
        record = ledger.slashes()[index]
    if as_json:
        emit_json({"operation": "void_slash", "receipt": receipt, "slash": record})
        return
    report_receipt("void_slash", receipt, as_json)
    if record.status == SLASH_VOIDED:
        click.echo(f"slash {index} is voided: the slasher paid {record.penalty_gwei} gwei")
    else:
        click.echo(
            f"slash {index} has {record.votes} void vote(s); still pending until epoch {record.final_epoch}"
        )


@slash_group.command("finalize")
@click.argument("index", type=click.IntRange(min=0))
@ledger_options
@key_option
@json_option
def slash_finalize(
    index: int, ledger_spec: str, contract: str | None, key: str | None, as_json: bool
) -> None:
    """Finalize pending slash INDEX once its challenge window has passed (anyone may; --key signs).

    Takes up to the requested amount from the worker's stake (bonded first, then unbonding); at the
    ledger's ejection threshold the worker is ejected.
    """
    identity = load_identity(key)
    with opened(ledger_spec, contract) as ledger:
        receipt = ledger.finalize_slash(identity, index)
        record = ledger.slashes()[index]
    if as_json:
        emit_json({"operation": "finalize_slash", "receipt": receipt, "slash": record})
        return
    report_receipt("finalize_slash", receipt, as_json)
    ejected = ", the worker is ejected" if record.ejected else ""
    click.echo(
        f"slash {index} is final: {record.taken_gwei} gwei taken from "
        f"{format_address(record.worker)}{ejected}"
    )


# --- runs ---------------------------------------------------------------------------------------


def parse_run_id(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    if value is not None and not RUN_ID.fullmatch(value):
        raise click.BadParameter(
            f"{value!r}: a run id is 1..64 of a-z, 0-9, '.', '_', '-', starting alphanumeric"
        )
    return value


def parse_validators(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[bytes, ...]:
    """The --validator addresses in the ledger's one canonical order (ascending), each once."""
    addresses = []
    for text in values:
        try:
            addresses.append(parse_address(text))
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    if len(set(addresses)) != len(addresses):
        raise click.BadParameter("a validator is named twice")
    if not 1 <= len(addresses) <= MAX_RUN_VALIDATORS:
        raise click.BadParameter(f"a run has 1..{MAX_RUN_VALIDATORS} validators, got {len(addresses)}")
    return tuple(sorted(addresses))


def validators_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--validator",
        "validators",
        multiple=True,
        required=True,
        metavar="ADDR",
        callback=parse_validators,
        help=f"a validator the run trusts to credit and slash (repeat: 1..{MAX_RUN_VALIDATORS})",
    )(func)


@ledger_group.group("run")
def run_group() -> None:
    """Put a run on the ledger and choose who may credit and slash in it.

    A run's owner is the trainer that signs its RunDescriptor; it registers the run with the validators it
    trusts and the bounds of a credit, and may change the validator set later. Only those validators may
    commit credits or file slashes in the run.
    """


@run_group.command("register")
@click.argument("run", callback=parse_run_id)
@validators_option
@click.option(
    "--challenge-window",
    "window",
    type=click.IntRange(0, U32_MAX),
    required=True,
    metavar="EPOCHS",
    help="epochs a slash waits, voidable, before it may take stake",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1, RUN_LIMIT_MAX),
    required=True,
    metavar="N",
    help="most tokens one credit may claim: the longest completion times the group size",
)
@click.option(
    "--max-flops-per-token",
    type=click.IntRange(0, FLOPS_PER_TOKEN_MAX),
    required=True,
    metavar="F",
    help="most flops a credit may claim per token (validators credit 2 x the model's parameters)",
)
@ledger_options
@key_option
@json_option
def run_register(
    run: str,
    validators: tuple[bytes, ...],
    window: int,
    max_tokens: int,
    max_flops_per_token: int,
    ledger_spec: str,
    contract: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Register RUN with the --key's trainer as its owner (first come; a run id is registered once)."""
    from swarmnode.protocol.ledger_messages import RegisterRun

    identity = load_identity(key)
    op = RegisterRun(run, validators, window, max_tokens, max_flops_per_token)
    with opened(ledger_spec, contract) as ledger:
        receipt = ledger.register_run(identity, op)
    report_receipt("register_run", receipt, as_json)


@run_group.command("set-validators")
@click.argument("run", callback=parse_run_id)
@validators_option
@ledger_options
@key_option
@json_option
def run_set_validators(
    run: str,
    validators: tuple[bytes, ...],
    ledger_spec: str,
    contract: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Replace RUN's validator set (the run's owner signs with --key). Pending slashes keep their votes."""
    from swarmnode.protocol.ledger_messages import SetRunValidators

    identity = load_identity(key)
    with opened(ledger_spec, contract) as ledger:
        receipt = ledger.set_run_validators(identity, SetRunValidators(run, validators))
    report_receipt("set_run_validators", receipt, as_json)


@run_group.command("show")
@click.argument("run", required=False, callback=parse_run_id)
@ledger_options
@json_option
def run_show(run: str | None, ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """RUN's owner, validators and bounds; every registered run without RUN."""
    with opened(ledger_spec, contract) as ledger:
        if run is None:
            runs = ledger.runs()
        else:
            info = ledger.run(run)
            if info is None:
                raise click.ClickException(f"run {run!r} is not registered on this ledger")
            runs = [info]
    if as_json:
        emit_json({"runs": runs})
        return
    _table(
        "runs",
        ["run", "owner", "validators", "challenge window", "max tokens", "max flops/token", "since epoch"],
        [
            [
                r.run,
                format_address(r.owner),
                "\n".join(format_address(v) for v in r.validators),
                r.challenge_window_epochs,
                r.max_tokens_per_credit,
                r.max_flops_per_token,
                r.registered_epoch,
            ]
            for r in runs
        ],
    )


# --- proofs --------------------------------------------------------------------------------------


@ledger_group.command("prove")
@click.option(
    "--contribution",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="make the proof of contribution N (see `ledger contributions`)",
)
@click.option(
    "--check",
    "check_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="check a saved proof against this ledger instead",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    metavar="FILE",
    help="write the proof here (default: stdout)",
)
@ledger_options
@json_option
def ledger_prove(
    contribution: int | None,
    check_path: Path | None,
    out: Path | None,
    ledger_spec: str,
    contract: str | None,
    as_json: bool,
) -> None:
    """Prove that a credited contribution is in its validator's committed batch, or check such a proof.

    A proof is the credit, its leaf index and the Merkle path to the batch's root (JSON, hex). It is checked
    twice: its path leads to its root, and the ledger holds that batch with that root, run, validator and
    count (on evm: the contract's own verify_credit view). Keep it: it shows your credit to anyone holding
    the ledger, without the validator's records. Exit status 1 when a proof does not verify.
    """
    if (contribution is None) == (check_path is None):
        raise click.UsageError("pass exactly one of --contribution N and --check FILE")
    if check_path is not None and out is not None:
        raise click.UsageError("--out writes a new proof; --check reads one")
    if check_path is not None:
        try:
            proof = load_proof(check_path.read_text())
        except (ProofFormatError, UnicodeDecodeError) as exc:
            raise click.ClickException(f"{check_path} is not a credit proof: {exc}") from None
    with opened(ledger_spec, contract) as ledger:
        if contribution is not None:
            try:
                proof = ledger.prove_credit(contribution)
            except IndexError:
                count = len(ledger.contributions())
                raise click.ClickException(
                    f"there is no contribution {contribution}; the ledger holds {count}"
                ) from None
        path_ok = proof.verify()
        on_ledger = ledger.check_credit_proof(proof)
    ok = path_ok and on_ledger
    if contribution is not None:
        if out is not None:
            out.write_text(dump_proof(proof))
        elif not as_json:
            click.echo(dump_proof(proof), nl=False)
    if as_json:
        emit_json(
            {"ok": ok, "path_leads_to_root": path_ok, "on_ledger": on_ledger, "proof": proof_to_json(proof)}
        )
    elif ok:
        where = f", written to {out}" if out is not None else ""
        click.echo(
            f"ok: contribution {proof.contribution} is leaf {proof.leaf_index} of batch {proof.batch} "
            f"(run {proof.run!r}, {proof.count} credits, root 0x{proof.root.hex()}){where}",
            err=contribution is not None and out is None,
        )
    if not path_ok:
        raise click.ClickException("the proof's path does not lead to its root")
    if not on_ledger:
        raise click.ClickException(
            f"this ledger holds no batch {proof.batch} with root 0x{proof.root.hex()}, run {proof.run!r}, "
            f"validator {format_address(proof.validator)} and {proof.count} credits"
        )


@ledger_group.command("verify")
@ledger_options
@json_option
def ledger_verify(ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Audit a ledger; exit status 1 naming the first failure.

    signed:PATH replays the log from genesis, re-checking every hash, signature and rule. evm:URL checks the
    contract runs the committed code, then re-derives its records from the transactions' calldata: every
    batch's root and count, credits within their run's bounds and never twice, the per-worker totals, every
    slash's cited signature recovering to the slashed worker, validators in their run's set, and the money
    (deposits - withdrawals = held + burned, covered by the balance). What the chain cannot show is printed
    as a note.
    """
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
        "signed_head": None
        if head is None
        else {"entries": head.size, "head": head.head, "signer": head.signer},
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
    from swarmnode.ledger.evm import EvmLedger
    from swarmnode.ledger.evm_audit import audit_chain

    if contract is None:
        raise click.ClickException(f"pass --contract (or set {CONTRACT_ENV})")
    try:
        evm = EvmLedger.connect(url, contract)
        report = audit_chain(evm)
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        emit_json({**dataclasses.asdict(report), "ok": report.ok, "first_failure": report.first_failure})
    else:
        for note in report.notes:
            click.echo(f"note: {note}", err=True)
    if not report.ok:
        more = f" (and {len(report.failures) - 1} more)" if len(report.failures) > 1 else ""
        raise click.ClickException(f"{report.contract} fails the audit: {report.first_failure}{more}")
    if not as_json:
        click.echo(
            f"ok: {report.contract} runs the committed SwarmLedger code; {report.runs} runs, "
            f"{report.batches} batches ({report.credits} credits), {report.slashes} slashes; "
            "the money checks out"
        )


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

    from swarmnode.ledger.evm import deploy_contract

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
    """swarmnode ledger commands (standalone entry point: python -m swarmnode.node.cli.ledger)."""


register_commands(standalone)

if __name__ == "__main__":
    standalone()
