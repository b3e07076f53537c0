"""`swarmnode ledger deploy | run … | slash …`: the writes that govern a ledger rather than a node's stake.

deploy creates it (a signed-log file or the contract on a chain); `run` is where a trainer registers its run,
the validators it trusts and the bounds of a credit (with `run show` beside the writes it reads back);
`slash void | finalize` settle a pending slash. cli/ledger.py adds these to the `ledger` group.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from swarmnode.crypto.identity import NodeIdentity, format_address, parse_address
from swarmnode.ledger import LedgerError, Params, SignedLog, parse_ledger_url
from swarmnode.ledger.types import SLASH_VOIDED
from swarmnode.node.cli.ledger_common import (
    emit_json,
    json_option,
    key_option,
    ledger_options,
    load_identity,
    opened,
    parse_amount,
    print_table,
    report_receipt,
    to_jsonable,
)
from swarmnode.protocol.codec import Pattern
from swarmnode.protocol.ledger_messages import (
    DEFAULT_MAX_SUBMISSIONS_PER_VERSION,
    FLOPS_PER_TOKEN_MAX,
    MAX_CHALLENGE_WINDOW_EPOCHS,
    MAX_RUN_VALIDATORS,
    MAX_SUBMISSIONS_PER_VERSION_LIMIT,
    RUN_LIMIT_MAX,
)
from swarmnode.protocol.types import RunId

RUN_ID = re.compile(next(m.regex for m in typing.get_args(RunId)[1:] if isinstance(m, Pattern)))


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


@click.group("run")
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
    type=click.IntRange(0, MAX_CHALLENGE_WINDOW_EPOCHS),
    required=True,
    metavar="EPOCHS",
    help=f"epochs a slash waits, voidable, before it may take stake (at most {MAX_CHALLENGE_WINDOW_EPOCHS}: "
    "a pending slash freezes the accused's stake that long)",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1, RUN_LIMIT_MAX),
    required=True,
    metavar="N",
    help="most tokens one credit may claim: a credit pays one submission, whose completion tokens are at "
    "most max new tokens x group size x prompts per step (the devnet: 6 x 8 x 32 = 1536)",
)
@click.option(
    "--max-flops-per-token",
    type=click.IntRange(0, FLOPS_PER_TOKEN_MAX),
    required=True,
    metavar="F",
    help="most flops a credit may claim per token (validators credit 2 x the model's parameters)",
)
@click.option(
    "--max-submissions-per-version",
    type=click.IntRange(1, MAX_SUBMISSIONS_PER_VERSION_LIMIT),
    default=DEFAULT_MAX_SUBMISSIONS_PER_VERSION,
    show_default=True,
    metavar="N",
    help="the RunDescriptor's max_submissions_per_version: a credit's counter must be below it",
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
    max_submissions_per_version: int,
    ledger_spec: str,
    contract: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Register RUN with the --key's trainer as its owner (first come; a run id is registered once)."""
    from swarmnode.protocol.ledger_messages import RegisterRun

    identity = load_identity(key)
    op = RegisterRun(run, validators, window, max_tokens, max_flops_per_token, max_submissions_per_version)
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
    print_table(
        "runs",
        ["run", "owner", "validators", "challenge window", "max tokens", "max flops/token", "per version",
         "since epoch"],
        [
            [
                r.run,
                format_address(r.owner),
                "\n".join(format_address(v) for v in r.validators),
                r.challenge_window_epochs,
                r.max_tokens_per_credit,
                r.max_flops_per_token,
                r.max_submissions_per_version,
                r.registered_epoch,
            ]
            for r in runs
        ],
    )


# --- slashes -------------------------------------------------------------------------------------


@click.group("slash")
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

    Signed by the run's owner, it voids the slash at once and costs no one; signed by another of the run's
    validators, it is one vote, and the vote that reaches a majority of the run's validators other than the
    slasher voids it and takes what the slash asked from the slasher. Either way the worker keeps its stake.
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
    if record.status == SLASH_VOIDED and record.votes == 0:
        click.echo(f"slash {index} is voided by the run's owner: the worker keeps its stake; it costs no one")
    elif record.status == SLASH_VOIDED:
        click.echo(f"slash {index} is voided by a quorum of {record.votes}: the slasher paid "
                   f"{record.penalty_gwei} gwei")
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


# --- deploy --------------------------------------------------------------------------------------


@click.command("deploy")
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
