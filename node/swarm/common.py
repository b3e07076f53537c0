"""What the role works share: the run's setup from its descriptor, the ledger, the ACCEPTED protocol."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

import torch

from ledger import Ledger, open_ledger
from node.config import WorkSettings
from node.p2p.reqresp import ProtocolSpec
from node.rl.run import DEVNET_MODEL, devnet_dataset
from node.rl.run import RunMismatch as RunMismatch  # re-exported: the roles raise it
from node.rl.tasks import Task
from protocol import ids
from protocol.messages import AcceptedBatch, AcceptedRequest

# The trainer pulls accepted submissions from each validator with this (long poll, cursor).
# Long polls hold a serving slot up to 30 s: room for every trainer of a run (a lead and up to 15
# co-trainers) and two streams each; others are refused before their frame is read (`admit`).
ACCEPTED = ProtocolSpec(
    ids.ACCEPTED, AcceptedRequest, AcceptedBatch, timeout=45.0, max_inbound=32, max_per_peer=2
)

CONTRACT_ENV = "SWARMNODE_CONTRACT"

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def run_model_dir(work: WorkSettings) -> Path:
    """The model folder this node takes part in runs with: `[work] model`, or the devnet's built-in one."""
    return Path(work.model).expanduser() if work.model else DEVNET_MODEL


def run_tasks(work: WorkSettings) -> list[Task]:
    """The tasks this node holds: the file `[work] tasks` names, or the devnet's generated additions."""
    if not work.tasks:
        return devnet_dataset()
    from node.rl.tasks.files import read_tasks

    return read_tasks(Path(work.tasks).expanduser())


def open_work_ledger(url: str) -> Ledger | None:
    """The node's ledger from `[node] ledger_url`: `signed:PATH`, or `evm:RPC_URL#0xCONTRACT` (or the
    contract from $SWARMNODE_CONTRACT); None when no ledger is configured."""
    if not url:
        return None
    contract = None
    if url.startswith("evm:") and "#" in url:
        url, contract = url.split("#", 1)
    elif url.startswith("evm:"):
        contract = os.environ.get(CONTRACT_ENV)
    return open_ledger(url, contract=contract)


def set_threads(threads: int) -> None:
    """Torch intra-op threads for this process: the devnet runs eight processes on two cores."""
    torch.set_num_threads(threads)


# --- tables keyed by what a peer chooses (identities are free): every one is bounded ---------------


class TtlCache(Generic[K, V]):
    """At most `max_entries` values, each for `ttl_s`; the oldest go first. Time is an argument."""

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("a cache holds at least one entry")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K, now: float) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= now:
            del self._entries[key]
            return None
        return entry[1]

    def put(self, key: K, value: V, now: float) -> None:
        self._entries.pop(key, None)
        self._entries[key] = (now + self.ttl_s, value)
        while self._entries and (
            len(self._entries) > self.max_entries or next(iter(self._entries.values()))[0] <= now
        ):
            self._entries.popitem(last=False)


def bounded_get(table: OrderedDict[K, V], key: K, make: Callable[[], V], cap: int) -> V:
    """`table[key]`, made if absent, marked most recently used; the least recently used go over `cap`."""
    value = table.get(key)
    if value is None:
        value = table[key] = make()
        while len(table) > cap:
            table.popitem(last=False)
    else:
        table.move_to_end(key)
    return value
