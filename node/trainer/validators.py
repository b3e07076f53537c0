"""The validators a trainer pulls from: the bounded table of them (`track_validators`), their standing in
the ledger (`validator_in_good_standing`), and how much to ask each for (`pull_limit`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from swarmnode.ledger import Ledger, LedgerError
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.node.p2p.peers import PeerRecord
from swarmnode.node.trainer.limits import PULL_LIMIT, TRUST_CHECK_S

LEDGER_FAILURES = (LedgerError, OSError, sqlite3.Error)  # refused, unreachable, or the log's file failing


@dataclass
class ValidatorPull:
    """One validator's pull loop as the status shows it."""

    record: PeerRecord
    pulls: int = 0
    failures: int = 0
    stored: int = 0
    refused: int = 0
    errors: int = 0  # batches whose handling failed unexpectedly
    trusted: bool = False  # a registered, eligible, unejected validator in the ledger (always without one)
    checked_at: float | None = None  # trio time of the last ledger check
    scope: trio.CancelScope | None = None  # the running pull loop's, None while not pulling


def track_validators(
    tracked: dict[bytes, ValidatorPull],
    found: Sequence[PeerRecord],
    now: float,
    cap: int,
) -> None:
    """Add or refresh the validators `found` (trio time `now`), keeping at most `cap` entries.

    Peer records are free to make, so their number must not grow the table, nor the ledger reads: a
    newcomer that finds the table full takes the place of an entry not pulled from whose standing was
    read at least `TRUST_CHECK_S` ago and found wanting (the stalest first); with none, it waits for a
    later scan. So the ledger is read at most about `cap` times per `TRUST_CHECK_S`, however many records
    claim the role, and a real validator among them is reached in turn.
    """
    for record in found:
        known = tracked.get(record.address)
        if known is not None:
            known.record = record
            continue
        if len(tracked) >= cap:
            idle = [
                a
                for a, pull in tracked.items()
                if pull.scope is None
                and not pull.trusted
                and pull.checked_at is not None
                and now - pull.checked_at >= TRUST_CHECK_S
            ]
            if not idle:
                continue
            del tracked[min(idle, key=lambda a: tracked[a].checked_at or 0.0)]
        tracked[record.address] = ValidatorPull(record)


def pull_limit(held: int, cap: int) -> int:
    """How many items to ask a validator for, given the inbox rows it delivered still held (0: wait).

    A trusted validator can still deliver any number of well-signed items (workers' identities are free),
    so its share of the inbox is capped, whatever the rows' state (dropped rows take disk too): past it,
    pulling from it waits until a prune deletes its rows of old versions.
    """
    return max(0, min(PULL_LIMIT, cap - held))


def validator_in_good_standing(ledger: Ledger, address: bytes) -> bool:
    """Blocking: `address` is registered as a validator, not ejected, and holds its full stake."""
    if isinstance(ledger, SignedLog):
        ledger.refresh()  # read what other writers appended since our last look
    info = ledger.node(address)
    return info is not None and info.role == "validator" and not info.ejected and ledger.is_eligible(address)
