"""Whether the ledger lets this worker work, and when not, the exact commands that fix it.

The worker checks before it joins the swarm (`node.assemble`) and again as its work starts: a node
that is not registered as a worker, is under-staked or was ejected stops with `NotEligible`, whose message
names the `swarmnode register` / `swarmnode stake` command lines for its own ledger and key.
"""

from __future__ import annotations

from pathlib import Path

from swarmnode.crypto.identity import format_address
from swarmnode.ledger import Ledger
from swarmnode.node.config import NodeConfig
from swarmnode.node.errors import OperatorError

WORKER_MEMORY_GB = 1  # what the refusal message suggests registering: the devnet model needs far less


class NotEligible(OperatorError, RuntimeError):
    """The ledger does not let this worker work: not registered as a worker, under-staked, or ejected."""


def ledger_cli_args(ledger_url: str) -> str:
    """The `--ledger ... [--contract ...]` options of `swarmnode stake/register` for a `[node] ledger_url`."""
    if ledger_url.startswith("evm:") and "#" in ledger_url:
        url, contract = ledger_url.split("#", 1)
        return f"--ledger {url} --contract {contract}"
    return f"--ledger {ledger_url}"


def refusal_message(ledger: Ledger, address: bytes, ledger_url: str, key: Path) -> str:
    """Why `address` may not work, and the exact commands that fix it (when anything can)."""
    who = format_address(address)
    options = f"{ledger_cli_args(ledger_url)} --key {key}"
    node = ledger.node(address)
    minimum = ledger.params.min_stake_per_unit_gwei
    if node is None:
        return (
            f"worker {who} is not registered in the ledger {ledger_url}; "
            "register it and bond stake, then restart:\n"
            "  swarmnode register --role worker --accelerator cpu --count 1 "
            f"--memory-gb {WORKER_MEMORY_GB} {options}\n"
            f"  swarmnode stake deposit {minimum}gwei {options}\n"
            f"(a stake of {minimum} gwei per compute unit declared with --count)"
        )
    if node.ejected:
        return (
            f"worker {who} was ejected from the ledger {ledger_url} after {node.slash_count} slashes; "
            "an ejected node cannot stake again: run the worker with a new key"
        )
    if node.role != "worker":
        return (
            f"{who} is registered as a {node.role} in the ledger {ledger_url}, not as a worker; "
            "a node has one role: run the worker with a key registered by `swarmnode register --role worker`"
        )
    stake = ledger.stake(address)
    bonded, required = (stake.bonded_gwei, stake.required_gwei) if stake is not None else (0, minimum)
    shortfall = max(required - bonded, 1)
    return (
        f"worker {who} has {bonded} gwei bonded in the ledger {ledger_url}, {required} gwei required; "
        f"bond the rest, then restart:\n"
        f"  swarmnode stake deposit {shortfall}gwei {options}"
    )


def require_eligible(ledger: Ledger, address: bytes, config: NodeConfig) -> None:
    """Raise `NotEligible` (saying how to fix it) unless the ledger lets `address` work."""
    if not ledger.is_eligible(address):
        raise NotEligible(refusal_message(ledger, address, config.ledger_url, config.identity))
