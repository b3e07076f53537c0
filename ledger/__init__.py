"""The swarm's ledger: stake, registered compute, runs, batched credits and slashes (spec/ledger.md).

One pure state machine (`ledger.state`) and two backends behind one `Ledger` interface:
`SignedLog` (an append-only signed log in SQLite, the embedded default) and `EvmLedger` (a Vyper
contract on any EVM chain through web3.py). `open_ledger("signed:PATH" | "evm:URL", contract=...)`
picks one. The EVM backend is imported lazily: web3 is heavy and the signed log does not need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmnode.ledger.batches import CreditProof
from swarmnode.ledger.errors import LedgerError
from swarmnode.ledger.interface import Ledger
from swarmnode.ledger.signedlog import SignedLog, verify_log
from swarmnode.ledger.types import (
    BatchRecord,
    ContributionRecord,
    NodeInfo,
    Params,
    Receipt,
    RunInfo,
    SlashRecord,
    Snapshot,
    StakeInfo,
    WorkerTotal,
)

if TYPE_CHECKING:
    from swarmnode.ledger.evm import EvmLedger

__all__ = [
    "BatchRecord",
    "ContributionRecord",
    "CreditProof",
    "EvmLedger",
    "Ledger",
    "LedgerError",
    "NodeInfo",
    "Params",
    "Receipt",
    "RunInfo",
    "SignedLog",
    "SlashRecord",
    "Snapshot",
    "StakeInfo",
    "WorkerTotal",
    "open_ledger",
    "parse_ledger_url",
    "verify_log",
]


def __getattr__(name: str) -> Any:
    if name == "EvmLedger":
        from swarmnode.ledger.evm import EvmLedger

        return EvmLedger
    raise AttributeError(name)


def parse_ledger_url(spec: str) -> tuple[str, str]:
    """`signed:PATH` or `evm:URL` → (kind, target)."""
    kind, sep, target = spec.partition(":")
    if not sep or kind not in ("signed", "evm") or not target:
        raise ValueError(f"ledger must be signed:PATH or evm:URL, got {spec!r}")
    return kind, target


def open_ledger(spec: str, *, contract: str | None = None) -> Ledger:
    """Open an existing ledger: a signed-log file, or the contract at `contract` behind an RPC URL."""
    kind, target = parse_ledger_url(spec)
    if kind == "signed":
        return SignedLog.open(Path(target))
    if contract is None:
        raise ValueError("an evm: ledger needs the contract address (--contract or SWARMNODE_CONTRACT)")
    from swarmnode.ledger.evm import EvmLedger

    return EvmLedger.connect(target, contract)
