"""The trainer's work: GRPO steps on accepted rollouts pulled from validators, checkpoints out via the origin.

The distributed twin of `node.rl.sync.run_sync` (spec/rollouts.md, Training on them):

- The policy being trained is version `step` (version 0 is the base checkpoint). It is published through
  an `OriginNode` (signed manifest, shards over HTTP), gossiped on `checkpoints` and re-gossiped every
  `REPUBLISH_S` seconds, since gossip may drop and followers also long-poll HTTP.
- One long-poll loop per validator pulls its accepted submissions after a cursor (`ACCEPTED`). With a
  ledger, only validators registered there as validators, unejected and fully staked are pulled from
  (read again every `TRUST_CHECK_S`; one that loses its standing stops being pulled from). Every item
  is verified before it is stored: the verdict is the validator's own signed acceptance of exactly this
  submission, the submission is signed by the worker the verdict names, and it names a version we
  published with our manifest's root. Good items and the new cursor go into the inbox in one SQLite
  transaction (`node.trainer.inbox`), at most one per (worker, assignment step) whichever validator
  delivered it; bad ones are counted and reported. A batch whose handling fails unexpectedly is logged,
  counted and reported, and the loop backs off: it never stops the trainer.
- A step takes pending submissions of versions in `[step - async_level, step]` in arrival order (older
  ones are dropped as stale), whole submissions at a time: it waits until they hold at least
  `min_batch_groups` (default: the run's `prompts_per_step`) groups with signal, then takes every usable
  one up to `batch_limit` (4x that), so a swarm that supplies more than a step needs is trained on rather
  than left to go stale (`plan_batch`). A ready step whose oldest usable version went out less than 1.5
  median first-arrival lags ago waits for that version's rows on their way (`protocol.pacing.
  hold_until_ms`, at most 60 s): stepping at each arrival outran the workers, whose builds then arrived
  more than async_level steps old. Zero-advantage groups are filtered
  by `GrpoTrainer.step` itself (online filtering). The rows are marked used by the step *before* the
  weights are saved, and a trainer that resumes at step s releases what steps >= s used, so a kill at any
  point neither loses an accepted rollout nor trains on one twice.
- With a ledger, the lead registers its run before publishing (`register_run`): owner itself, the
  validators it names (`run_validators`), the challenge window of the run's slashes and the bounds of a
  credit (`node.roles.common.run_registration`). A run it registered before (a restart) is fine, its
  validator set updated if the operator changed it; a run another key owns is refused (`RunMismatch`),
  and so is, for a co-trainer, a run its lead does not own.
- After `work.steps` steps the trainer stops training and keeps serving (`done` in the status).
- Bounded: each publication prunes the inbox past the async window plus `inbox_retention_versions`
  (`node.trainer.inbox`); the per-worker verdict tally keeps `MAX_VERDICT_WORKERS` workers (the least
  recently counted one goes); at most `MAX_TRACKED_VALIDATORS` validators are tracked (`track_validators`
  says which one gives way); a validator with `MAX_ROWS_PER_VALIDATOR` rows held in the inbox is not
  pulled from until a prune deletes some (`pull_limit`); the other tallies are keyed by finite sets
  (reason names, gossip topic and message type).

One concern per module (each module's docstring records its design decisions):

- `limits`: every bound, wait and cadence, and the data dir's file names, in one table (`TrainerBounds`).
- `checks`: pure intake checks of a pulled item (`check_trainable`, `check_checkpoint`, `verify_accepted`,
  `check_batch`): everything as arguments, no network, no store.
- `batch`: pure, the batch of one step (`plan_batch`, `batch_limit`) and its groups.
- `disk`: what survives a restart: the run's descriptor, the published versions, the saved states.
- `validators`: the bounded table of validators, their standing in the ledger, how much to ask each.
- `state`: what the work holds, its counts and `status`, the arrival pacing shared by the parts below.
- `publishing`: checkpoint versions out through the origin, announced on gossip and in the DHT.
- `steps`: the step loop (wait for a batch, step, save, publish).
- `pull`: the pull loops over the network, and each batch verified and stored (`ingest_batch`).
- `registration`: the run on the ledger.
- `work`: `SwarmTrainerWork`, the role's work and the hooks `node.diloco.rl` overrides.
- `sharded`: the trainer as an FSDP2 process group (`ShardedGrpoTrainer`, rank 0's handle); its parts
  `group` (join, leave, timeouts, bytes between ranks), `rank` (one rank's shard and step), `commands`
  (rank 0's commands and pings), `launch` (the ranks under torchrun).

Import from here: `from swarmnode.node.trainer import SwarmTrainerWork, ...` is the public surface. A cadence
is read from the module that uses it (a test shortens `PULL_BACKOFF_S` in `pull`, `RUN_WAIT_S` in
`registration`): setting it here changes nothing.
"""

from swarmnode.node.trainer.batch import BatchPlan, batch_limit, groups_of, plan_batch, submission_of
from swarmnode.node.trainer.checks import (
    ADVANTAGE_SLACK,
    MAX_INDEX,
    MAX_VERSION,
    Checked,
    check_batch,
    check_checkpoint,
    check_trainable,
    open_stored,
    verify_accepted,
)
from swarmnode.node.trainer.disk import load_or_create_descriptor, prune_saves, restore_published
from swarmnode.node.trainer.limits import (
    BATCH_LIMIT_FACTOR,
    CHECKPOINTS_DIR,
    DESCRIPTOR_FILE,
    INBOX_FILE,
    KEEP_SAVES,
    MANIFEST_OK,
    MAX_ROWS_PER_VALIDATOR,
    MAX_TRACKED_VALIDATORS,
    MAX_VERDICT_WORKERS,
    PEER_SCAN_S,
    PULL_BACKOFF_S,
    PULL_EMPTY_PAUSE_S,
    PULL_LIMIT,
    PULL_WAIT_MS,
    REPUBLISH_S,
    RUN_WAIT_S,
    TRAINER_DIR,
    TRUST_CHECK_S,
    TrainerBounds,
    trainer_bounds,
)
from swarmnode.node.trainer.publishing import Publishing
from swarmnode.node.trainer.pull import Ingested, Pulling, ingest_batch
from swarmnode.node.trainer.registration import Registration
from swarmnode.node.trainer.state import Policy, Tallies, TrainerState, count_verdict
from swarmnode.node.trainer.steps import StepLoop
from swarmnode.node.trainer.validators import (
    LEDGER_FAILURES,
    ValidatorPull,
    pull_limit,
    track_validators,
    validator_in_good_standing,
)
from swarmnode.node.trainer.work import SwarmTrainerWork

__all__ = [
    "ADVANTAGE_SLACK",
    "BATCH_LIMIT_FACTOR",
    "CHECKPOINTS_DIR",
    "DESCRIPTOR_FILE",
    "INBOX_FILE",
    "KEEP_SAVES",
    "LEDGER_FAILURES",
    "MANIFEST_OK",
    "MAX_INDEX",
    "MAX_ROWS_PER_VALIDATOR",
    "MAX_TRACKED_VALIDATORS",
    "MAX_VERDICT_WORKERS",
    "MAX_VERSION",
    "PEER_SCAN_S",
    "PULL_BACKOFF_S",
    "PULL_EMPTY_PAUSE_S",
    "PULL_LIMIT",
    "PULL_WAIT_MS",
    "REPUBLISH_S",
    "RUN_WAIT_S",
    "TRAINER_DIR",
    "TRUST_CHECK_S",
    "BatchPlan",
    "Checked",
    "Ingested",
    "Policy",
    "Publishing",
    "Pulling",
    "Registration",
    "StepLoop",
    "SwarmTrainerWork",
    "Tallies",
    "TrainerBounds",
    "TrainerState",
    "ValidatorPull",
    "batch_limit",
    "check_batch",
    "check_checkpoint",
    "check_trainable",
    "count_verdict",
    "groups_of",
    "ingest_batch",
    "load_or_create_descriptor",
    "open_stored",
    "plan_batch",
    "prune_saves",
    "pull_limit",
    "restore_published",
    "submission_of",
    "track_validators",
    "trainer_bounds",
    "validator_in_good_standing",
    "verify_accepted",
]
