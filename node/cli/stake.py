"""`swarmnode stake …` and `swarmnode register`: a node stakes and registers its compute.

Every node does this once before it gets work: `register` binds its role, compute and peer id to its key,
`stake deposit` bonds the minimum per compute unit; `unbond` and `withdraw` take it back out.
"""

from __future__ import annotations

import click

from swarmnode.crypto.identity import format_address
from swarmnode.ledger.types import ROLES
from swarmnode.node.cli.ledger_common import (
    address_arg,
    emit_json,
    json_option,
    key_option,
    ledger_options,
    load_identity,
    opened,
    parse_amount,
    print_table,
    report_receipt,
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
    print_table(
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
