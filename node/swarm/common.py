"""What the role works share: the run's setup from its descriptor, the ledger, the ACCEPTED protocol."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

import torch

from ledger import Ledger, open_ledger
from node.p2p.reqresp import ProtocolSpec
from node.rl.model import file_sha256, load_model, model_config_hash
from node.rl.run import BASE_CHECKPOINT, RunSetup, dataset_hash, devnet_dataset
from protocol import ids
from protocol.messages import AcceptedBatch, AcceptedRequest, RunDescriptor

# The trainer pulls accepted submissions from each validator with this (long poll, cursor).
# Long polls hold a serving slot up to 30 s: room for every trainer of a run (a lead and up to 15
# co-trainers) and two streams each; others are refused before their frame is read (`admit`).
ACCEPTED = ProtocolSpec(
    ids.ACCEPTED, AcceptedRequest, AcceptedBatch, timeout=45.0, max_inbound=32, max_per_peer=2
)

CONTRACT_ENV = "SWARMNODE_CONTRACT"

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RunMismatch(RuntimeError):
    """This node cannot take part in the run its descriptor names (other dataset, model or base)."""


def load_run_setup(descriptor: RunDescriptor, base_checkpoint: Path = BASE_CHECKPOINT) -> RunSetup:
    """The run's tasks, after checking that the descriptor names the dataset and base this node holds."""
    run = repr(descriptor.run)
    if descriptor.task_kind != "arithmetic":
        raise RunMismatch(f"run {run} has task kind {descriptor.task_kind!r}; this node knows arithmetic")
    tasks = devnet_dataset()
    if dataset_hash(tasks) != descriptor.dataset_hash:
        raise RunMismatch(f"run {run} names dataset {descriptor.dataset_hash.hex()[:16]}, not ours")
    if file_sha256(base_checkpoint) != descriptor.base_checkpoint_hash:
        raise RunMismatch(f"run {run} starts from another base checkpoint than {base_checkpoint}")
    cfg, _ = load_model(base_checkpoint)
    if model_config_hash(cfg) != descriptor.model_config_hash:
        raise RunMismatch(f"run {run} names another model config than {base_checkpoint}")
    return RunSetup(descriptor, tasks)


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
