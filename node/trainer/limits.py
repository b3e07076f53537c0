"""The trainer's parameters: pull cadence and bounds, store and table bounds, the files of its data dir.

One table, so every bound the trainer keeps is found in one place; the ones a node's config sets are
`TrainerBounds` (`trainer_bounds`).
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmnode.node.config import NodeConfig
from swarmnode.node.trainer.inbox import RETENTION_VERSIONS

MANIFEST_OK = 100  # status of a ManifestResponse that carries a manifest (spec/errors.md: 100 = ok)
PULL_LIMIT = 16  # accepted submissions per ACCEPTED request
PULL_WAIT_MS = 20_000  # long poll: the validator answers at once when something new is accepted
PULL_EMPTY_PAUSE_S = 0.5  # after an empty answer, so a validator that does not hold the poll is not spun on
PULL_BACKOFF_S = (1.0, 30.0)  # first and longest pause after a failed request
PEER_SCAN_S = 2.0  # how often newly found validators get a pull loop
TRUST_CHECK_S = 30.0  # how often a validator's standing in the ledger is read again
REPUBLISH_S = 10.0  # re-gossip of the newest manifest
KEEP_SAVES = 2  # trainer states kept on disk (the newest and one before it)
MAX_VERDICT_WORKERS = 1024  # workers in the gossiped-verdict tally (the status display); LRU beyond
MAX_TRACKED_VALIDATORS = 256  # validators with a pull state (and a ledger check every TRUST_CHECK_S)
MAX_ROWS_PER_VALIDATOR = 2048  # inbox rows held that one validator delivered; pulling from it waits beyond
BATCH_LIMIT_FACTOR = 4  # a step trains on at most 4x the signal groups it waits for (`batch_limit`)
RUN_WAIT_S = 2.0  # the ledger cannot answer, or (co-trainer) the run is not registered yet: look again

DESCRIPTOR_FILE = "run_descriptor.bin"
INBOX_FILE = "inbox.sqlite"
CHECKPOINTS_DIR = "checkpoints"
TRAINER_DIR = "trainer"


@dataclass(frozen=True)
class TrainerBounds:
    """The trainer's store and table bounds (spec/bounds.md; config `[work]`)."""

    inbox_retention_versions: int = RETENTION_VERSIONS  # inbox versions kept beyond the async window
    rows_per_validator: int = MAX_ROWS_PER_VALIDATOR
    verdict_workers: int = MAX_VERDICT_WORKERS
    tracked_validators: int = MAX_TRACKED_VALIDATORS


def trainer_bounds(config: NodeConfig) -> TrainerBounds:
    """The bounds a node's config sets (`[work] retention_versions`); the rest keep their defaults."""
    return TrainerBounds(inbox_retention_versions=config.work.retention_versions)
