"""The validator's parameters: queue and size bounds, waits, retention, credit and slash cadence.

One table, so every bound the validator keeps is found in one place; the tunable ones are the defaults of
`SwarmValidatorWork`'s keyword arguments.
"""

from __future__ import annotations

from swarmnode.protocol.ledger_messages import MAX_CREDITS_PER_BATCH
from swarmnode.protocol.types import MIB

QUEUED = 100  # SubmitAck status: durably queued for judgement
WAIT_FOR_CHECKPOINT_S = 60.0  # how long a submission waits for a checkpoint version not held yet
MAX_PENDING = 256  # submissions queued at once
MAX_PENDING_PER_WORKER = 8  # submissions of one worker queued at once
MAX_PENDING_BYTES = 1024 * MIB
MAX_BATCH_BYTES = 8 * MIB  # an AcceptedBatch carries at least one item, more only up to this size
VERDICT_BACKLOG = 256  # verdicts waiting for gossip before new ones are dropped from it
VERDICT_FLUSH_S = 1.0  # a pending VerdictBatch is gossiped this long after its first verdict, or when full
MAX_DETAIL_BYTES = 512
MAX_VERDICT_CHUNKS = 4096
UNSAMPLED = "cheap checks only: not drawn for the prefill checks"
LEDGER_RETRY_S = 1.0  # first wait before retrying a ledger write that failed; doubles up to the max
LEDGER_RETRY_MAX_S = 60.0
STORE_FILE = "validator.db"
ELIGIBILITY_TTL_S = 10.0  # how long SUBMIT trusts a stake read (the judge reads it again, uncached)
MAX_ELIGIBILITY_CACHE = 4096  # senders whose stake read is cached (identities are free: oldest evicted)
MAX_WORKER_TALLIES = 1024  # workers with a per-worker tally in the status (least recently judged evicted)
# Retention (AcceptedStore.prune): versions kept beyond the async window, for audits and late pulls
ACCEPTED_RETENTION_VERSIONS = 4
MAX_ACCEPTED_BYTES = 2048 * MIB  # accepted log bytes; over it, items every trainer pulled go, oldest first
PRUNE_EVERY_S = 30.0
# Credits: one CommitCredits per interval, or as soon as a batch is full. The devnet's scale; a real swarm
# commits about once an epoch (Params.epoch_seconds: an hour), one transaction per validator.
CREDIT_INTERVAL_S = 5.0
MAX_QUEUED_CREDITS = 16 * MAX_CREDITS_PER_BATCH  # credits waiting for the ledger; SUBMIT is BUSY beyond
SLASH_CHECK_S = 5.0  # how often the pending slashes this validator filed are tried for finalization
RUN_WAIT_S = 2.0  # while the run is not on the ledger yet: how often to look again
