"""What the role works share: the run's setup from its descriptor and the ledger.

The run on the ledger (spec/ledger.md, Runs): its owner is the trainer that signs the RunDescriptor. The
lead trainer registers it (`ensure_run`, with `run_registration`'s bounds); every follower refuses a run
whose ledger owner is anyone else (`check_run_owner`), since that owner names the validators whose credits
and slashes count.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

import torch
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger import Ledger, LedgerError, open_ledger
from swarmnode.ledger.errors import BackendError, CorruptLog, EpochRegression, ReplayedOperation, RunExists
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.ledger.types import RunInfo
from swarmnode.node.config import WorkSettings
from swarmnode.node.errors import RunMismatch
from swarmnode.node.rl.run import DEVNET_MODEL, devnet_dataset
from swarmnode.node.rl.tasks import Task
from swarmnode.protocol.ledger_messages import (
    DEFAULT_MAX_SUBMISSIONS_PER_VERSION,
    FLOPS_PER_TOKEN_MAX,
    MAX_RUN_VALIDATORS,
    RUN_LIMIT_MAX,
    RegisterRun,
    SetRunValidators,
)
from swarmnode.protocol.messages import EnvironmentTerms, GrpoParams, RunDescriptor

CONTRACT_ENV = "SWARMNODE_CONTRACT"
# LedgerErrors that say nothing about the operation (the backend or the log's file failed, a nonce race):
# retried, like every exception that is not a LedgerError. Every other LedgerError is a decided refusal.
TRANSIENT_LEDGER_ERRORS = (BackendError, CorruptLog, ReplayedOperation, EpochRegression)
# Epochs a slash of the run waits before it takes stake, while the run's owner (or a majority of its other
# validators) may void it. Params.epoch_seconds defaults to an hour: a day of review.
CHALLENGE_WINDOW_EPOCHS = 24

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

log = logging.getLogger(__name__)


def run_model_dir(work: WorkSettings) -> Path:
    """The model folder this node takes part in runs with: `[work] model`, or the devnet's built-in one."""
    return Path(work.model).expanduser() if work.model else DEVNET_MODEL


def run_tasks(work: WorkSettings) -> list[Task]:
    """The tasks this node holds: the file `[work] tasks` names, or the devnet's generated additions."""
    if not work.tasks:
        return devnet_dataset()
    from swarmnode.node.rl.tasks.files import read_tasks

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


# --- the run on the ledger ----------------------------------------------------------------------------


def is_refusal(exc: BaseException) -> bool:
    """A typed refusal of the ledger's state machine: the operation is decided, retrying cannot help."""
    return isinstance(exc, LedgerError) and not isinstance(exc, TRANSIENT_LEDGER_ERRORS)


def run_registration(
    run: str,
    grpo: GrpoParams,
    validators: Sequence[bytes],
    parameters: int,
    window_epochs: int,
    max_submissions_per_version: int = DEFAULT_MAX_SUBMISSIONS_PER_VERSION,
    environment: EnvironmentTerms | None = None,
) -> RegisterRun:
    """The RegisterRun of a run (its descriptor's GRPO parameters and counter bound): its validator set
    (sorted, distinct) and the bounds of one credit.

    A submission carries `prompts_per_step` groups of `group_size` completions of at most `max_new_tokens`
    each (of at most the `environment`'s `max_completion_tokens` in a multi-turn run); a token costs about
    2 · parameters FLOPs. Both are capped at the ledger's limits (a validator credits at most the run's
    bound per token)."""
    members = tuple(sorted(set(validators)))
    if not 1 <= len(members) <= MAX_RUN_VALIDATORS:
        raise ValueError(f"a run names 1 to {MAX_RUN_VALIDATORS} validators, not {len(members)}")
    longest = environment.max_completion_tokens if environment is not None else grpo.max_new_tokens
    tokens = longest * grpo.group_size * grpo.prompts_per_step
    return RegisterRun(
        run=run,
        validators=members,
        challenge_window_epochs=window_epochs,
        max_tokens_per_credit=min(tokens, RUN_LIMIT_MAX),
        max_flops_per_token=min(2 * parameters, FLOPS_PER_TOKEN_MAX),
        max_submissions_per_version=max_submissions_per_version,
    )


def check_run_owner(info: RunInfo, descriptor: RunDescriptor) -> None:
    """A follower takes part in a run only if the ledger's owner of it signed its descriptor."""
    if info.owner != descriptor.trainer:
        raise RunMismatch(
            f"run {descriptor.run!r} is registered on the ledger by 0x{info.owner.hex()}, not by its "
            f"descriptor's trainer 0x{descriptor.trainer.hex()}: its credits and slashes are another "
            "trainer's to govern; refusing the run"
        )


def check_run_terms(info: RunInfo, max_window_epochs: int) -> None:
    """A worker or validator takes part in a run only if a slash in it cannot freeze its stake longer than
    it accepts (`[work] max_challenge_window_epochs`; spec/ledger.md §2.2)."""
    if info.challenge_window_epochs > max_window_epochs:
        raise RunMismatch(
            f"run {info.run!r} holds a pending slash for {info.challenge_window_epochs} epochs before it is "
            f"final, longer than this node accepts ({max_window_epochs}, "
            "[work] max_challenge_window_epochs): refusing the run; raise that setting to take part"
        )


def read_run(ledger: Ledger, run: str) -> RunInfo | None:
    """Blocking: the run as the ledger holds it now (a signed log first reads what others appended)."""
    if isinstance(ledger, SignedLog):
        ledger.refresh()
    return ledger.run(run)


async def wait_run_owner(ledger: Ledger, descriptor: RunDescriptor, max_window_epochs: int, *,
                         poll_s: float = 1.0) -> RunInfo:
    """Wait until the run is on the ledger, then refuse it (RunMismatch) unless its owner signed
    `descriptor` and its terms are within this node's (`check_run_terms`). The blocking ledger reads run in
    a worker thread, one at a time."""
    logged = False
    while True:
        info = await trio.to_thread.run_sync(read_run, ledger, descriptor.run)
        if info is not None:
            check_run_owner(info, descriptor)
            check_run_terms(info, max_window_epochs)
            return info
        if not logged:
            log.info("waiting for the run's owner to register it", extra={"run": descriptor.run})
            logged = True
        await trio.sleep(poll_s)


def ensure_run(ledger: Ledger, owner: NodeIdentity, op: RegisterRun) -> RunInfo:
    """Blocking: register the run with `owner` as its owner, or accept it already registered by `owner` (a
    restart); then its validator set is `op`'s (SetRunValidators when the operator changed it).
    RunMismatch when another key owns the run; a refusal (the owner is not a registered trainer) raises
    its LedgerError."""
    info = read_run(ledger, op.run)
    if info is None:
        try:
            ledger.register_run(owner, op)
        except RunExists:  # registered meanwhile: by us (an earlier attempt) or by another key
            pass
        info = read_run(ledger, op.run)
        assert info is not None
    if info.owner != owner.address:
        raise RunMismatch(
            f"run {op.run!r} is registered on the ledger by 0x{info.owner.hex()}, not by this trainer "
            f"{owner.checksum_address}: choose another run id"
        )
    if info.validators != op.validators:
        ledger.set_run_validators(owner, SetRunValidators(op.run, op.validators))
        info = read_run(ledger, op.run)
        assert info is not None
    return info


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
