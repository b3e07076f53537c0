"""What the trainer's work holds, what it has counted, and the `status` it reports.

`TrainerState` builds the state every part of the work shares (`publishing`, `steps`, `pull`,
`registration`; `work.SwarmTrainerWork` is all of them), and the pacing they share: `pull` notes when a
version's first row arrives, the step loop holds a ready batch on it (`protocol.pacing`).

Decisions:
- Bounded state: the verdict tally keeps `MAX_VERDICT_WORKERS` workers (`count_verdict`, least recently
  counted goes), the validator table `MAX_TRACKED_VALIDATORS` (`validators.track_validators`); the other
  tallies are keyed by finite sets (reason names, gossip topic and message type).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger import Ledger
from swarmnode.ledger.types import RunInfo
from swarmnode.node.config import NodeConfig
from swarmnode.node.dataplane.roles import OriginNode
from swarmnode.node.rl.learner import GrpoTrainer, OptimizerParams
from swarmnode.node.rl.model import ModelInfo
from swarmnode.node.rl.run import devnet_optimizer
from swarmnode.node.rl.tasks import Task
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.roles.common import CHALLENGE_WINDOW_EPOCHS, bounded_get, run_model_dir, run_tasks
from swarmnode.node.trainer.inbox import RolloutInbox
from swarmnode.node.trainer.limits import (
    CHECKPOINTS_DIR,
    DESCRIPTOR_FILE,
    INBOX_FILE,
    TRAINER_DIR,
    TrainerBounds,
)
from swarmnode.node.trainer.sharded import ShardedGrpoTrainer
from swarmnode.node.trainer.validators import ValidatorPull
from swarmnode.protocol.messages import RunDescriptor
from swarmnode.protocol.pacing import LAG_HISTORY, hold_until_ms, note_lag

log = logging.getLogger(__name__)

Policy = GrpoTrainer | ShardedGrpoTrainer  # one process, or rank 0 of an FSDP2 group


def count_verdict(verdicts: OrderedDict[str, Counter[str]], worker: str, outcome: str, cap: int) -> None:
    """Count one gossiped verdict about `worker`; past `cap` workers the least recently counted goes."""
    bounded_get(verdicts, worker, Counter, cap)[outcome] += 1


@dataclass
class Tallies:
    """Counts since this start; every key set is bounded (module docstring)."""

    duplicates: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # reason name → items
    cursor_resets: int = 0
    pull_errors: int = 0
    ledger_errors: int = 0
    # worker → accepted / rejected, the MAX_VERDICT_WORKERS most recently counted (`count_verdict`)
    verdicts: OrderedDict[str, Counter[str]] = field(default_factory=OrderedDict)
    gossip: Counter[str] = field(default_factory=Counter)  # topic/type of other gossip (admitted types only)


class TrainerState:
    """The trainer's state and counts; its behaviour is in the parts that subclass it."""

    def __init__(
        self,
        config: NodeConfig,
        identity: NodeIdentity,
        *,
        model_dir: Path | None = None,
        tasks: Sequence[Task] | None = None,
        optim: OptimizerParams | None = None,
        ledger: Ledger | None = None,
        bounds: TrainerBounds | None = None,
        run_validators: Sequence[bytes] = (),
        challenge_window_epochs: int = CHALLENGE_WINDOW_EPOCHS,
    ) -> None:
        self.config = config
        self.identity = identity
        self.run_validators = tuple(run_validators)  # the run's validator set on the ledger (lead only)
        self.challenge_window_epochs = challenge_window_epochs
        self.ledger_run: RunInfo | None = None  # the run as the ledger held it at start
        self.bounds = bounds or TrainerBounds()
        self.ledger = ledger  # with one, only validators in good standing there are pulled from
        self._ledger_lock = trio.Lock()  # ledger calls run in threads, never two at once
        self.model_dir = model_dir or run_model_dir(config.work)
        self.tasks = list(tasks) if tasks is not None else run_tasks(config.work)
        self.optim = optim or devnet_optimizer()
        data = config.data_dir
        self.descriptor_path = data / DESCRIPTOR_FILE
        self.inbox_path = data / INBOX_FILE
        self.trainer_dir = data / TRAINER_DIR
        self.checkpoints_dir = data / CHECKPOINTS_DIR
        self.descriptor: RunDescriptor | None = None
        self.model_config: ModelInfo | None = None
        self._model_files: dict[str, bytes] | None = None  # config + tokenizer files of every checkpoint
        self.inbox: RolloutInbox | None = None
        self._last_status: dict[str, Any] | None = None
        self.trainer: Policy | None = None
        self.origin_node: OriginNode | None = None
        self.endpoint = ""
        self.done = False
        self.signal: dict[str, Any] = {}  # a starved step's diagnosis (`node.trainer.liveness`); {} otherwise
        self.tallies = Tallies()
        self.validators: dict[bytes, ValidatorPull] = {}
        self._net: RoleNet | None = None
        self._background: trio.Nursery | None = None
        self._provided: set[int] = set()
        self._arrived = trio.Event()
        self._lags: tuple[int, ...] = ()  # first-arrival lag of recent versions (`protocol.pacing`)
        self._lagged: set[int] = set()  # versions whose first row has arrived

    def published_roots(self) -> dict[int, bytes]:
        """Version → Merkle root of each version the origin keeps (what we published and still serve)."""
        if self.origin_node is None:
            return {}
        catalog = self.origin_node.catalog
        return {v: entry.manifest.merkle_root for v in catalog.versions() if (entry := catalog.get(v))}

    def _published_ms(self, version: int) -> int | None:
        if self.origin_node is None or version < 0:
            return None
        entry = self.origin_node.catalog.get(version)
        return entry.manifest.created_ms if entry is not None else None

    def _hold_until_ms(self, oldest: int) -> int:
        """When a ready batch whose oldest usable version is `oldest` may be taken (`hold_until_ms`)."""
        return hold_until_ms(self._published_ms(oldest), self._lags)

    def _note_arrivals(self, versions: set[int], at_ms: int) -> None:
        """The first row of a version arrived: one sample of the lag from its publication."""
        for version in sorted(versions - self._lagged):
            published = self._published_ms(version)
            if published is not None:
                self._lags = note_lag(self._lags, at_ms - published)
            self._lagged.add(version)
        if len(self._lagged) > 4 * LAG_HISTORY:  # versions that can no longer arrive first
            self._lagged = set(sorted(self._lagged)[-2 * LAG_HISTORY :])

    def _parts(self) -> tuple[Policy, RolloutInbox, RunDescriptor]:
        if self.trainer is None or self.inbox is None or self.descriptor is None:
            raise RuntimeError("the trainer work is not serving yet (start `serve` first)")
        return self.trainer, self.inbox, self.descriptor

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot for the node's status file and the devnet display.

        Counts of submissions come from the inbox and the per-step lists from its step records, so they
        survive a restart; `refused`, `duplicates`, `verdicts` and `validators` count since this start.
        `rewards` is each step's mean reward over all the groups it took (filtered ones included, as in
        `node.rl.sync`); `groups_used` counts the groups with signal that the steps trained on.
        """
        trainer, inbox, origin = self.trainer, self.inbox, self.origin_node
        if inbox is None and self._last_status is not None:
            return self._last_status
        records = inbox.steps() if inbox is not None else []
        counts = (
            inbox.counts() if inbox is not None else {"received": 0, "used": 0, "dropped": 0, "pending": 0}
        )
        per_worker = inbox.used_per_worker() if inbox is not None else {}
        stored = asdict(inbox.statistics()) if inbox is not None else {}
        cursors = inbox.cursors() if inbox is not None else {}
        return {
            "step": trainer.step_count if trainer is not None else 0,
            "version": origin.catalog.latest_version if origin is not None else None,
            "submissions_received": counts["received"],
            "submissions_used": counts["used"],
            "submissions_pending": counts["pending"],
            "stale_dropped": counts["dropped"],
            "duplicates": self.tallies.duplicates,
            "refused": dict(self.tallies.refused),
            "groups_used": sum(r.signal_groups for r in records),
            "groups_filtered": sum(r.groups - r.signal_groups for r in records),
            "rewards": [round(r.mean_reward, 4) for r in records],
            "wait_s": round(sum(r.wait_s for r in records), 2),
            "train_s": round(sum(r.train_s for r in records), 2),
            "step_s": [round(r.step_s, 2) for r in records],
            "done": self.done,
            "signal": self.signal,
            "endpoint": self.endpoint,
            "per_worker": {"0x" + w.hex(): n for w, n in sorted(per_worker.items())},  # rows still held
            "inbox": stored,  # rows and bytes held now (bounded: module docstring)
            "verdicts": {w: dict(c) for w, c in sorted(self.tallies.verdicts.items())},
            "validators": {
                "0x" + address.hex(): {
                    "peer": pull.record.peer_id,
                    "cursor": cursors.get(address, 0),
                    "pulls": pull.pulls,
                    "failures": pull.failures,
                    "stored": pull.stored,
                    "refused": pull.refused,
                    "errors": pull.errors,
                    "trusted": pull.trusted,
                    "pulling": pull.scope is not None,
                }
                for address, pull in sorted(self.validators.items())
            },
            "cursor_resets": self.tallies.cursor_resets,
            "pull_errors": self.tallies.pull_errors,
            "ledger_errors": self.tallies.ledger_errors,
            "gossip": dict(self.tallies.gossip),
        }
