"""The trainer's work: GRPO steps on accepted rollouts pulled from validators, checkpoints out via the origin.

The distributed twin of `node.rl.sync.run_sync` (DESIGN.md, Run lifecycle, steps 1 and 6):

- The policy being trained is version `step` (version 0 is the base checkpoint). It is published through
  an `OriginNode` (signed manifest, shards over HTTP), gossiped on `checkpoints` and re-gossiped every
  `REPUBLISH_S` seconds, since gossip may drop and followers also long-poll HTTP.
- One long-poll loop per validator pulls its accepted submissions after a cursor (`ACCEPTED`). With a
  ledger, only validators registered there as validators, unejected and fully staked are pulled from
  (read again every `TRUST_CHECK_S`; one that loses its standing stops being pulled from). Every item
  is verified before it is stored: the verdict is the validator's own signed acceptance of exactly this
  submission, the submission is signed by the worker the verdict names, and it names a version we
  published with our manifest's root. Good items and the new cursor go into the inbox in one SQLite
  transaction (`node.swarm.inbox`), at most one per (worker, assignment step) whichever validator
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
  credit (`node.swarm.common.run_registration`). A run it registered before (a restart) is fine, its
  validator set updated if the operator changed it; a run another key owns is refused (`RunMismatch`),
  and so is, for a co-trainer, a run its lead does not own.
- After `work.steps` steps the trainer stops training and keeps serving (`done` in the status).
- Bounded: each publication prunes the inbox past the async window plus `inbox_retention_versions`
  (`node.swarm.inbox`); the per-worker verdict tally keeps `MAX_VERDICT_WORKERS` workers (the least
  recently counted one goes); at most `MAX_TRACKED_VALIDATORS` validators are tracked (`track_validators`
  says which one gives way); a validator with `MAX_ROWS_PER_VALIDATOR` rows held in the inbox is not
  pulled from until a prune deletes some (`pull_limit`); the other tallies are keyed by finite sets
  (reason names, gossip topic and message type).

Pure parts (`verify_accepted`, `check_trainable`, `ingest_batch`, `plan_batch`, `restore_published`) take
everything as arguments, so they are tested without a network.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sqlite3
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import trio
from libp2p.peer.id import ID

from crypto.identity import NodeIdentity
from ledger import Ledger, LedgerError
from ledger.signedlog import SignedLog
from ledger.types import RunInfo
from node.config import NodeConfig
from node.dataplane.catalog import Catalog
from node.dataplane.checkpoint import MODEL_LAYOUT
from node.dataplane.http_server import Handler, ServerConfig
from node.dataplane.origin import model_folder_files
from node.dataplane.roles import OriginNode
from node.dataplane.store import ShardStore
from node.p2p.clock import wall_ms
from node.p2p.gossip import Delivery
from node.p2p.peers import PeerRecord
from node.p2p.reqresp import RequestFailed
from node.rl.engine import TransformersEngine
from node.rl.model import ModelInfo, state_dict_of
from node.rl.rollouts import unpack_logprobs
from node.rl.run import DEVNET_MAX_NEW_TOKENS, RunMismatch, devnet_optimizer, devnet_run, load_run_setup
from node.rl.sharded import ShardedGrpoTrainer, dcp_dir, launched_rank
from node.rl.tasks import Task
from node.rl.trainer import GrpoTrainer, OptimizerParams, StepStats, signal_groups
from node.roles.base import RoleNet
from node.swarm.common import (
    ACCEPTED,
    CHALLENGE_WINDOW_EPOCHS,
    bounded_get,
    check_run_owner,
    ensure_run,
    is_refusal,
    read_run,
    run_model_dir,
    run_registration,
    run_tasks,
    set_threads,
)
from node.swarm.inbox import RETENTION_VERSIONS, InboxEntry, InboxRow, RolloutInbox, StepRecord, Stored
from protocol.codec import decode, encode
from protocol.envelope import Envelope, Opened, envelope_digest, open_envelope
from protocol.errors import Ignore, ProtocolError, Reason, Reject
from protocol.messages import (
    LATEST_VERSION,
    AcceptedBatch,
    AcceptedRequest,
    AcceptedRollout,
    GrpoParams,
    ManifestRequest,
    ManifestResponse,
    RolloutGroup,
    RolloutSubmission,
    RunDescriptor,
    Verdict,
)
from protocol.pacing import LAG_HISTORY, hold_until_ms, note_lag
from protocol.runs import step_version
from protocol.shards import is_retained, verify_manifest
from protocol.types import MIB

log = logging.getLogger(__name__)

MANIFEST_OK = 100  # status of a ManifestResponse that carries a manifest (spec/errors.md: 100 = ok)
PULL_LIMIT = 16  # accepted submissions per ACCEPTED request
PULL_WAIT_MS = 20_000  # long poll: the validator answers at once when something new is accepted
PULL_EMPTY_PAUSE_S = 0.5  # after an empty answer, so a validator that does not hold the poll is not spun on
PULL_BACKOFF_S = (1.0, 30.0)  # first and longest pause after a failed request
PEER_SCAN_S = 2.0  # how often newly found validators get a pull loop
TRUST_CHECK_S = 30.0  # how often a validator's standing in the ledger is read again
MAX_VERSION = 2**32  # a checkpoint version is the high half of a u64 assignment step
MAX_INDEX = 2**63  # SQLite integers are signed 64-bit
ADVANTAGE_SLACK = 1e-4  # relative rounding allowed above the largest group-normalised advantage
LEDGER_FAILURES = (LedgerError, OSError, sqlite3.Error)  # refused, unreachable, or the log's file failing
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

Policy = GrpoTrainer | ShardedGrpoTrainer  # one process, or rank 0 of an FSDP2 group


# --- verification of pulled items -------------------------------------------------------------------


def open_stored(data: bytes, cls: type, run: str) -> Opened:
    """Every check of `open_envelope` but the clock and the replay window: the envelope was signed earlier."""
    signed_at = decode(Envelope, data).ts
    return open_envelope(data, run=run, now_ms=signed_at, replay=None, expect=cls)


def check_trainable(sub: RolloutSubmission, grpo: GrpoParams, cfg: ModelInfo) -> None:
    """Refuse a submission the GRPO step could not take (a buggy validator must not crash the trainer)."""

    def refuse(detail: str) -> Reject:
        return Reject(Reason.RULE_VIOLATION, detail)

    if not sub.groups:
        raise refuse("submission has no groups")
    # (r - mean) / std over a group of n is at most sqrt(n - 1) in magnitude (all but one reward equal)
    max_advantage = math.sqrt(max(grpo.group_size - 1, 0)) * (1 + ADVANTAGE_SLACK)
    for g, group in enumerate(sub.groups):
        if len(group.completions) != grpo.group_size:
            raise refuse(
                f"group {g} has {len(group.completions)} completions, the run's size is {grpo.group_size}"
            )
        if not group.prompt_ids or any(not 0 <= t < cfg.vocab_size for t in group.prompt_ids):
            raise refuse(f"group {g} has an empty prompt or a token outside the vocabulary")
        for c in group.completions:
            n = len(c.token_ids)
            if not 1 <= n <= grpo.max_new_tokens or len(group.prompt_ids) + n > cfg.max_positions:
                raise refuse(f"group {g} has a completion of {n} tokens")
            if any(not 0 <= t < cfg.vocab_size for t in c.token_ids):
                raise refuse(f"group {g} has a completion token outside the vocabulary")
            if len(c.logprobs) != 4 * n or not unpack_logprobs(c.logprobs).isfinite().all():
                raise refuse(f"group {g} has logprobs that are not {n} finite float32 values")
            if not (math.isfinite(c.reward) and math.isfinite(c.advantage)):
                raise refuse(f"group {g} has a reward or advantage that is not finite")
            if abs(c.advantage) > max_advantage:
                raise refuse(f"group {g} has an advantage {c.advantage} beyond ±{max_advantage:.4f}")


def check_checkpoint(sub: RolloutSubmission, roots: Mapping[int, bytes]) -> None:
    """The submission names a version we published, with our manifest's root.

    `roots` holds the versions the origin still keeps (every one a step may still take, and one more), so
    a version below them is merely stale (Ignore); one above, or missing in between, we never published.
    """
    version = sub.checkpoint_version
    if version >= MAX_VERSION or step_version(sub.step) != version:
        raise Reject(Reason.BAD_ASSIGNMENT, f"step {sub.step} is not bound to checkpoint version {version}")
    if not roots:
        raise Ignore(Reason.UNKNOWN_CHECKPOINT, "nothing is published yet")
    root = roots.get(version)
    if root is None and version < min(roots):
        raise Ignore(Reason.STALE, f"checkpoint v{version} is older than the versions kept")
    if root is None:
        raise Reject(Reason.UNKNOWN_CHECKPOINT, f"checkpoint v{version} was never published")
    if root != sub.checkpoint_root:
        raise Reject(Reason.BAD_HASH, f"checkpoint v{version} root differs from the published manifest")


def verify_accepted(
    item: AcceptedRollout,
    *,
    run: str,
    validator: bytes,
    grpo: GrpoParams,
    cfg: ModelInfo,
    roots: Mapping[int, bytes],
    received_ms: int,
) -> InboxEntry:
    """An accepted item as an inbox entry, or Reject/Ignore with the reason the validator is charged for.

    The verdict must be `validator`'s own signed acceptance of exactly this submission envelope, and the
    submission must be signed by the worker the verdict names, for this run, on a checkpoint we published
    (`roots`: version → the Merkle root of our manifest).
    """
    opened_verdict = open_stored(item.verdict, Verdict, run)
    if opened_verdict.sender != validator:
        raise Reject(
            Reason.WRONG_SENDER, f"verdict signed by {opened_verdict.sender.hex()}, not the validator"
        )
    verdict: Verdict = opened_verdict.message
    if verdict.run != run:
        raise Reject(Reason.RULE_VIOLATION, f"verdict names run {verdict.run!r}")
    if not verdict.accepted:
        raise Reject(Reason.RULE_VIOLATION, "the verdict rejects the submission")
    digest = envelope_digest(item.submission)
    if verdict.submission_digest != digest:
        raise Reject(Reason.BAD_HASH, "the verdict names another submission")
    opened_sub = open_stored(item.submission, RolloutSubmission, run)
    if opened_sub.sender != verdict.worker:
        raise Reject(Reason.WRONG_SENDER, "the submission is not signed by the worker the verdict names")
    sub: RolloutSubmission = opened_sub.message
    if sub.run != run:
        raise Reject(Reason.RULE_VIOLATION, f"submission names run {sub.run!r}")
    if (sub.step, sub.checkpoint_version) != (verdict.step, verdict.checkpoint_version):
        raise Reject(
            Reason.RULE_VIOLATION, "the verdict names another step or checkpoint than the submission"
        )
    check_checkpoint(sub, roots)
    check_trainable(sub, grpo, cfg)
    return InboxEntry(
        index=item.index,
        digest=digest,
        worker=verdict.worker,
        step=sub.step,
        checkpoint_version=sub.checkpoint_version,
        groups=len(sub.groups),
        signal_groups=len(signal_groups(sub.groups)),
        submission=item.submission,
        verdict=item.verdict,
        received_ms=received_ms,
    )


@dataclass(frozen=True)
class Checked:
    entries: tuple[InboxEntry, ...]
    cursor: int  # the validator's cursor once this batch is stored
    refused: tuple[tuple[int, Reason, str], ...]  # (index, reason, detail) of each item refused


def check_batch(
    batch: AcceptedBatch,
    cursor: int,
    *,
    run: str,
    validator: bytes,
    grpo: GrpoParams,
    cfg: ModelInfo,
    roots: Mapping[int, bytes],
    now_ms: int,
) -> Checked:
    """Verify a pulled batch against our cursor (CPU only: callers may run it in a thread).

    Indices must rise above the cursor; refused items are skipped for good (the cursor passes them). A
    validator whose newest index fell below our cursor lost its log: the cursor starts over at 0 (what
    comes again is dropped by digest).
    """
    if not batch.items and batch.newest < cursor:
        return Checked((), 0, ())
    entries: list[InboxEntry] = []
    refused: list[tuple[int, Reason, str]] = []
    last = cursor
    for item in batch.items:
        if item.index <= last:
            refused.append((item.index, Reason.RULE_VIOLATION, f"index {item.index} is not above {last}"))
            continue
        if item.index >= MAX_INDEX:  # refused without moving the cursor there (it could not be stored)
            refused.append((item.index, Reason.OUT_OF_RANGE, f"index {item.index} is not below 2**63"))
            continue
        last = item.index
        try:
            entries.append(
                verify_accepted(
                    item, run=run, validator=validator, grpo=grpo, cfg=cfg, roots=roots, received_ms=now_ms
                )
            )
        except ProtocolError as exc:
            refused.append((item.index, exc.reason, exc.detail))
    return Checked(tuple(entries), last, tuple(refused))


@dataclass(frozen=True)
class Ingested:
    stored: Stored
    cursor: int
    refused: tuple[tuple[int, Reason, str], ...]


def ingest_batch(
    inbox: RolloutInbox,
    validator: bytes,
    batch: AcceptedBatch,
    *,
    run: str,
    grpo: GrpoParams,
    cfg: ModelInfo,
    roots: Mapping[int, bytes],
    now_ms: int,
) -> Ingested:
    """Verify a pulled batch and store its good items with the advanced cursor, in one transaction."""
    checked = check_batch(
        batch,
        inbox.cursor(validator),
        run=run,
        validator=validator,
        grpo=grpo,
        cfg=cfg,
        roots=roots,
        now_ms=now_ms,
    )
    return Ingested(inbox.store(validator, checked.entries, checked.cursor), checked.cursor, checked.refused)


# --- the batch of one step ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchPlan:
    take: tuple[InboxRow, ...]  # whole submissions in arrival order
    stale: tuple[InboxRow, ...]  # too old for this step: dropped
    signal_groups: int  # groups with signal in `take`
    ready: bool  # `take` reaches the number of signal groups a step needs


def batch_limit(need: int, configured: int = 0) -> int:
    """The most signal groups one step takes: `configured`, else `BATCH_LIMIT_FACTOR` times `need`; at
    least `need` (a limit below what a step waits for would never let it start)."""
    if need < 1 or configured < 0:
        raise ValueError(f"a step needs >= 1 signal groups and a limit >= 0, not {need} and {configured}")
    return max(need, configured or BATCH_LIMIT_FACTOR * need)


def plan_batch(
    pending: Sequence[InboxRow], step: int, async_level: int, need: int, limit: int | None = None
) -> BatchPlan:
    """Pick step `step`'s submissions: versions in [step - async_level, step], oldest arrivals first.

    The step waits for `need` signal groups; once it has them it takes every usable row, whole
    submissions, until it holds `limit` (`batch_limit`; None: `need`, a fixed-size batch), so what
    the swarm supplied beyond one step's need is trained on instead of ageing out of the window: the
    last row taken may pass `limit` by less than one submission's groups. Oldest first, since they
    leave the window first. Versions newer than `step` (only after a trainer lost its state) wait;
    older ones are stale.
    """
    stale = tuple(r for r in pending if r.checkpoint_version < step - async_level)
    cap = need if limit is None else max(limit, need)
    take: list[InboxRow] = []
    signal = 0
    for row in pending:
        if signal >= cap:
            break
        if step - async_level <= row.checkpoint_version <= step:
            take.append(row)
            signal += row.signal_groups
    ready = signal >= need
    return BatchPlan(tuple(take) if ready else (), stale, signal, ready)


def submission_of(envelope: bytes) -> RolloutSubmission:
    """The body of a stored (already verified) submission envelope."""
    return decode(RolloutSubmission, decode(Envelope, envelope).body)


def groups_of(envelopes: Sequence[bytes]) -> list[RolloutGroup]:
    return [group for envelope in envelopes for group in submission_of(envelope).groups]


# --- state on disk ------------------------------------------------------------------------------------


def load_or_create_descriptor(
    path: Path,
    run: str,
    trainer: bytes,
    model_dir: Path,
    tasks: Sequence[Task],
    co_trainers: tuple[bytes, ...] = (),
    max_new_tokens: int = DEVNET_MAX_NEW_TOKENS,
) -> RunDescriptor:
    """The run's descriptor as first published from this data dir, or a new one with the devnet's recipe
    on this model folder and these tasks (then stored)."""
    if path.exists():
        try:
            descriptor = decode(RunDescriptor, path.read_bytes())
        except ProtocolError as exc:
            raise RunMismatch(
                f"{path} cannot be read as a run descriptor ({exc}): written by an older swarmnode, or "
                "damaged. Move it (and the data dir's trainer state) away to start a new run."
            ) from exc
        if descriptor.run != run or descriptor.trainer != trainer or descriptor.co_trainers != co_trainers:
            raise RunMismatch(
                f"{path} describes run {descriptor.run!r} of trainer 0x{descriptor.trainer.hex()} "
                f"with {len(descriptor.co_trainers)} co-trainers, not run {run!r} of 0x{trainer.hex()} "
                f"with {len(co_trainers)}"
            )
        return descriptor
    created = devnet_run(trainer, model_dir, wall_ms(), tasks=tasks, max_new_tokens=max_new_tokens).descriptor
    descriptor = replace(created, run=run, co_trainers=co_trainers)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(encode(descriptor))
    os.replace(tmp, path)
    return descriptor


def restore_published(
    store: ShardStore, catalog: Catalog, *, run: str, trainer: bytes, step: int, async_level: int
) -> list[int]:
    """List the versions a previous life published that are still retained at `step`; remove the rest.

    Only complete versions whose manifest we signed and whose every shard is present come back; versions
    newer than `step` (a trainer state that was lost) and unfinished publications are removed.
    """
    kept: list[int] = []
    remove: list[int] = []
    for version, complete in sorted(store.versions_on_disk().items()):
        envelope = store.load_manifest(version)
        if not complete or envelope is None or version > step or not is_retained(version, step, async_level):
            remove.append(version)
            continue
        try:
            manifest = verify_manifest(envelope, run=run, trainer=trainer, now_ms=wall_ms())
        except ProtocolError:
            remove.append(version)
            continue
        held = store.verified_shards(manifest)
        if manifest.version != version or len(held) != len(manifest.shards):
            remove.append(version)
            continue
        catalog.add(manifest, envelope, held)
        kept.append(version)
    store.remove(remove)
    return kept


def prune_saves(directory: Path, keep_from: int) -> None:
    """Delete trainer states of steps below `keep_from` (the record first, so none names a missing file)."""
    for record in directory.glob("step-*.json"):
        step = int(record.stem.removeprefix("step-"))
        if step < keep_from:
            record.unlink(missing_ok=True)
            (directory / f"step-{step:06d}.safetensors").unlink(missing_ok=True)
            (directory / f"step-{step:06d}.optim.safetensors").unlink(missing_ok=True)
            shutil.rmtree(dcp_dir(directory, step), ignore_errors=True)


# --- the work -----------------------------------------------------------------------------------------


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


def count_verdict(verdicts: OrderedDict[str, Counter[str]], worker: str, outcome: str, cap: int) -> None:
    """Count one gossiped verdict about `worker`; past `cap` workers the least recently counted goes."""
    bounded_get(verdicts, worker, Counter, cap)[outcome] += 1


def validator_in_good_standing(ledger: Ledger, address: bytes) -> bool:
    """Blocking: `address` is registered as a validator, not ejected, and holds its full stake."""
    if isinstance(ledger, SignedLog):
        ledger.refresh()  # read what other writers appended since our last look
    info = ledger.node(address)
    return info is not None and info.role == "validator" and not info.ejected and ledger.is_eligible(address)


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


class SwarmTrainerWork:
    """The trainer role's work (`node.roles.trainer.TrainerWork`)."""

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
        self.origin: OriginNode | None = None
        self.endpoint = ""
        self.done = False
        self.tallies = Tallies()
        self.validators: dict[bytes, ValidatorPull] = {}
        self._net: RoleNet | None = None
        self._background: trio.Nursery | None = None
        self._provided: set[int] = set()
        self._arrived = trio.Event()
        self._lags: tuple[int, ...] = ()  # first-arrival lag of recent versions (`protocol.pacing`)
        self._lagged: set[int] = set()  # versions whose first row has arrived

    # --- TrainerWork ---------------------------------------------------------------------------------

    def run_descriptor(self, run: str, trainer: bytes) -> RunDescriptor:
        """The devnet descriptor, stored on first start so that a restarted trainer publishes the same."""
        if self.descriptor is None:
            self.descriptor = load_or_create_descriptor(
                self.descriptor_path, run, trainer, self.model_dir, self.tasks,
                max_new_tokens=self.config.work.max_new_tokens,
            )
        return self.descriptor

    async def manifest(self, peer: ID, request: ManifestRequest) -> ManifestResponse:
        if request.run != self.config.run:
            return ManifestResponse(status=int(Reason.WRONG_RUN), manifest=b"")
        catalog = self.origin.catalog if self.origin is not None else None
        entry = None
        if catalog is not None:
            entry = catalog.latest if request.version == LATEST_VERSION else catalog.get(request.version)
        if entry is None:
            return ManifestResponse(status=int(Reason.UNKNOWN_CHECKPOINT), manifest=b"")
        return ManifestResponse(status=MANIFEST_OK, manifest=entry.envelope)

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if net.identity.address != self.identity.address:
            raise ValueError("the trainer work must sign with the node's own identity")
        self._net = net
        async with trio.open_nursery() as nursery:
            self._background = nursery
            await nursery.start(self.serve)  # publishes (and so announces) the current version
            nursery.start_soon(self._republish_forever)
            nursery.start_soon(self._pull_validators, net)
            nursery.start_soon(self.train)
            task_status.started()

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        message = delivery.opened.message
        if delivery.kind == "verdicts" and isinstance(message, Verdict):
            outcome = "accepted" if message.accepted else "rejected"
            worker = "0x" + message.worker.hex()
            count_verdict(self.tallies.verdicts, worker, outcome, self.bounds.verdict_workers)
        else:
            self.tallies.gossip[f"{delivery.kind}/{delivery.opened.envelope.type}"] += 1

    # --- serving and training (no network needed) ----------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the trainer and the inbox, start the origin, publish the current policy; serve forever."""
        cfg = self.config
        set_threads(cfg.work.threads)
        descriptor = await self._descriptor()
        await trio.to_thread.run_sync(load_run_setup, descriptor, self.model_dir, self.tasks)
        trainer = await trio.to_thread.run_sync(self._load_trainer, descriptor)
        self.trainer = trainer
        self.model_config = trainer.info
        if self.ledger is not None:
            parameters = trainer.parameter_count()
            self.ledger_run = await self.register_run(self.ledger, descriptor, parameters)
        self.inbox = inbox = RolloutInbox(
            self.inbox_path, retention_versions=self.bounds.inbox_retention_versions
        )
        self._release_unsaved(inbox, trainer)
        self.done = self._finished()
        self.origin = origin = OriginNode(
            self.checkpoints_dir,
            self.identity,
            cfg.run,
            server=ServerConfig(host=cfg.http_host, port=cfg.http_port),
            shard_size=max(1, int(cfg.work.shard_mb * MIB)),
            async_level=descriptor.async_level,
            mount=self._mount,
        )
        try:
            async with trio.open_nursery() as nursery:
                self.endpoint = await nursery.start(origin.run)
                current = self._current_version(trainer, origin.store)
                restored = restore_published(
                    origin.store,
                    origin.catalog,
                    run=cfg.run,
                    trainer=self.identity.address,
                    step=current,
                    async_level=descriptor.async_level,
                )
                if current not in restored:
                    await self._publish(current)
                self._prune_inbox(current)
                task_status.started(self.endpoint)
        finally:
            self._last_status = self.status()  # the node writes a final status after the work stops
            self.inbox = None
            inbox.close()

    async def register_run(self, ledger: Ledger, descriptor: RunDescriptor, parameters: int) -> RunInfo:
        """The lead registers the run (or finds it its own); a co-trainer, or a lead that names no
        validators (the run registered beforehand, as the devnet does), checks the ledger's owner of it,
        waiting for the registration. RunMismatch for another owner or a refused registration; a ledger
        that cannot answer is asked again every `RUN_WAIT_S`."""
        lead = descriptor.trainer == self.identity.address
        op = None
        if lead and self.run_validators:
            window = self.challenge_window_epochs
            op = run_registration(descriptor.run, descriptor.grpo, self.run_validators, parameters, window)
        waiting = False
        while True:
            try:
                async with self._ledger_lock:
                    if op is not None:
                        return await trio.to_thread.run_sync(ensure_run, ledger, self.identity, op)
                    info = await trio.to_thread.run_sync(read_run, ledger, descriptor.run)
            except RunMismatch:
                raise
            except Exception as exc:  # web3 and the OS raise anything: a refusal is decided, the rest passes
                if is_refusal(exc):
                    refused = f"the ledger refused to register run {descriptor.run!r}: {exc}"
                    raise RunMismatch(refused) from exc
                self.tallies.ledger_errors += 1
                log.warning("ledger unavailable for the run's registration", extra={"error": repr(exc)})
                await trio.sleep(RUN_WAIT_S)
                continue
            if info is not None:
                check_run_owner(info, descriptor)
                return info
            if lead:
                raise RunMismatch(
                    f"run {descriptor.run!r} is not on the ledger, and this trainer names no validators to "
                    "register it with ([trainer] run_validators)"
                )
            if not waiting:
                log.info("waiting for the lead to register the run", extra={"run": descriptor.run})
                waiting = True
            await trio.sleep(RUN_WAIT_S)

    # --- what a multi-trainer run (node.swarm.diloco_rl) does differently ---------------------------

    async def _descriptor(self) -> RunDescriptor:
        """The run this trainer trains: its own (persisted) descriptor."""
        return self.run_descriptor(self.config.run, self.identity.address)

    def _release_unsaved(self, inbox: RolloutInbox, trainer: Policy) -> None:
        """Rows used by steps whose weights were never saved go back into the pool."""
        released = inbox.release_from(trainer.step_count)
        if released:
            log.info(
                "released rollouts of unsaved steps", extra={"step": trainer.step_count, "rows": released}
            )

    def _current_version(self, trainer: Policy, store: ShardStore) -> int:
        """The version the restored weights are (one per GRPO step here)."""
        return trainer.step_count

    def _mount(self, shards: Handler) -> Handler:
        """The HTTP handler of our endpoint: the checkpoint shards alone here."""
        return shards

    async def _before_check(self, batch: AcceptedBatch) -> None:
        """Wait, if need be, until a pulled batch can be checked (nothing to wait for here)."""

    def _mine(self, entries: Sequence[InboxEntry]) -> Sequence[InboxEntry]:
        """The verified items this trainer trains on: all of them here."""
        return entries

    def _blames(self, reason: Reason) -> bool:
        """Whether an item refused for `reason` is the delivering validator's fault."""
        return reason.error_class != "ignore"  # stale items are nobody's fault

    def _announces(self) -> bool:
        """Whether this trainer announces its checkpoints (gossip, DHT): it signs the run's manifests."""
        return True

    def _load_trainer(self, descriptor: RunDescriptor) -> Policy:
        if launched_rank() == 0:  # rank 0 of a process group: every rank loads its shard
            sharded = ShardedGrpoTrainer.start(self.trainer_dir, self.model_dir, descriptor.grpo, self.optim)
            if sharded.info.config_hash != descriptor.model_config_hash:
                raise RunMismatch(f"the model in {self.model_dir} is not the run's")
            return sharded
        trainer = GrpoTrainer.resume(self.trainer_dir, self.model_dir, descriptor.grpo)
        if trainer is None:
            engine = TransformersEngine.from_folder(self.model_dir)
            trainer = GrpoTrainer(engine, descriptor.grpo, optim=self.optim)
        if trainer.info.config_hash != descriptor.model_config_hash:
            raise RunMismatch(f"the trainer state in {self.trainer_dir} is for another model than the run's")
        return trainer

    def _finished(self) -> bool:
        steps = self.config.work.steps
        return self.trainer is not None and steps > 0 and self.trainer.step_count >= steps

    async def train(self) -> None:
        """GRPO steps until `work.steps` (forever when 0); each publishes the next version."""
        trainer, inbox, descriptor = self._parts()
        need = self.config.work.min_batch_groups or descriptor.grpo.prompts_per_step
        while not self._finished():
            step = trainer.step_count
            started = time.perf_counter()
            record, stats = await self._train_step(step, need)
            began = started + record.step_s - record.train_s  # when the GRPO step itself began
            await trio.to_thread.run_sync(self._save, trainer)
            trained = time.perf_counter() - began
            await self._publish(trainer.step_count)
            inbox.record_step(replace(record, train_s=trained, step_s=time.perf_counter() - started))
            log.info(
                "trained step",
                extra={
                    "step": step,
                    "submissions": record.submissions,
                    "groups": record.groups,
                    "signal_groups": stats.groups_used,
                    "mean_reward": round(stats.mean_reward, 4),
                    "loss": round(stats.loss, 5),
                    "wait_s": round(record.wait_s, 2),
                    "train_s": round(trained, 2),
                },
            )
        self.done = True
        log.info("training done; still serving", extra={"step": trainer.step_count})

    async def _train_step(
        self, step: int, need: int, *, version: int | None = None
    ) -> tuple[StepRecord, StepStats]:
        """Wait for a batch, mark its rows used by `step`, take the GRPO step, record it.

        The record goes in before any save: a resume that drops this step drops its record too.
        """
        trainer, inbox, _ = self._parts()
        started = time.perf_counter()
        plan = await self._wait_for_batch(step, need, version=version)
        waited = time.perf_counter() - started
        ids = [row.id for row in plan.take]
        groups = await trio.to_thread.run_sync(groups_of, inbox.submissions(ids))
        inbox.consume(ids, step)
        began = time.perf_counter()
        stats = await trio.to_thread.run_sync(trainer.step, groups)
        record = StepRecord(
            step=step,
            submissions=len(ids),
            groups=len(groups),
            signal_groups=stats.groups_used,
            mean_reward=stats.mean_reward,
            wait_s=waited,
            train_s=time.perf_counter() - began,
            step_s=time.perf_counter() - started,
        )
        inbox.record_step(record)
        return record, stats

    def _save(self, trainer: Policy) -> None:
        trainer.save(self.trainer_dir)
        prune_saves(self.trainer_dir, trainer.step_count - KEEP_SAVES + 1)

    async def _wait_for_batch(self, step: int, need: int, *, version: int | None = None) -> BatchPlan:
        """A batch for `step` of the policy `version` (the step itself when one step is one version)."""
        _, inbox, descriptor = self._parts()
        while True:
            arrived = self._arrived
            current = step if version is None else version
            plan = plan_batch(inbox.pending(), current, descriptor.async_level, need, batch_limit(need))
            if plan.stale:
                inbox.drop([row.id for row in plan.stale], step)
            if plan.ready:
                hold_s = (self._hold_until_ms(current - descriptor.async_level) - wall_ms()) / 1000
                if hold_s <= 0:
                    return plan
                await trio.sleep(hold_s)  # rows of the oldest usable version on their way join the batch
                continue
            await arrived.wait()

    def _published_ms(self, version: int) -> int | None:
        entry = self.origin.catalog.get(version) if self.origin is not None and version >= 0 else None
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

    async def _publish(self, version: int) -> None:
        """Publish the current weights as `version` through the origin, then announce it."""
        trainer, _, descriptor = self._parts()
        assert self.origin is not None
        if self._model_files is None:
            self._model_files = await trio.to_thread.run_sync(model_folder_files, self.model_dir)
        origin = self.origin.origin
        if isinstance(trainer, ShardedGrpoTrainer):  # every rank writes its files: no full gather
            infos = await trio.to_thread.run_sync(
                trainer.write_model, origin.store, version, origin.shard_size, self._model_files
            )
            await origin.publish_written(
                version=version,
                parent_version=max(version - 1, 0),
                model_config_hash=descriptor.model_config_hash,
                shards=infos,
            )
            self._announce_newest()
            self._prune_inbox(version)
            return
        state = await trio.to_thread.run_sync(state_dict_of, trainer.engine.model)
        await origin.publish(
            state,
            version=version,
            parent_version=max(version - 1, 0),
            model_config_hash=descriptor.model_config_hash,
            layout=MODEL_LAYOUT,
            files=self._model_files,
        )
        self._announce_newest()
        self._prune_inbox(version)

    def _prune_inbox(self, newest: int) -> None:
        """Delete the inbox rows no step can take any more, now that `newest` is published."""
        _, inbox, descriptor = self._parts()
        pruned = inbox.prune(newest, descriptor.async_level)
        if pruned:
            log.info("pruned the inbox", extra={"version": newest, "rows": pruned})

    # --- receiving rollouts --------------------------------------------------------------------------

    async def ingest(self, validator: bytes, batch: AcceptedBatch) -> Ingested:
        """Verify (in a thread) and store one pulled batch; wakes the step loop when something arrived.

        One caller per validator at a time (its pull loop), so the cursor cannot move in between.
        """
        _, inbox, descriptor = self._parts()
        assert self.model_config is not None
        await self._before_check(batch)
        before = inbox.cursor(validator)
        checked = await trio.to_thread.run_sync(
            partial(
                check_batch,
                batch,
                before,
                run=descriptor.run,
                validator=validator,
                grpo=descriptor.grpo,
                cfg=self.model_config,
                roots=self.published_roots(),
                now_ms=wall_ms(),
            )
        )
        await trio.lowlevel.checkpoint_if_cancelled()  # shutting down: the inbox may be closed by now
        stored = inbox.store(validator, self._mine(checked.entries), checked.cursor)
        result = Ingested(stored, checked.cursor, checked.refused)
        if result.cursor < before:
            self.tallies.cursor_resets += 1
            log.warning(
                "validator's index fell below our cursor; pulling from the start",
                extra={"validator": "0x" + validator.hex(), "cursor": before, "newest": batch.newest},
            )
        self.tallies.duplicates += result.stored.duplicates
        for _, reason, _ in result.refused:
            self.tallies.refused[reason.name] += 1
        if result.stored.inserted:
            self._note_arrivals({e.checkpoint_version for e in checked.entries}, wall_ms())
            self._arrived.set()
            self._arrived = trio.Event()
        return result

    def published_roots(self) -> dict[int, bytes]:
        """Version → Merkle root of each version the origin keeps (what we published and still serve)."""
        if self.origin is None:
            return {}
        catalog = self.origin.catalog
        return {v: entry.manifest.merkle_root for v in catalog.versions() if (entry := catalog.get(v))}

    async def _trusted(self, address: bytes, state: ValidatorPull) -> bool:
        """Whether to pull from `address`: its ledger standing, read again every `TRUST_CHECK_S`."""
        if self.ledger is None:
            state.trusted = True
            return True
        now = trio.current_time()
        if state.checked_at is not None and now - state.checked_at < TRUST_CHECK_S:
            return state.trusted
        ledger = self.ledger
        async with self._ledger_lock:
            try:
                trusted = await trio.to_thread.run_sync(validator_in_good_standing, ledger, address)
            except LEDGER_FAILURES as exc:
                self.tallies.ledger_errors += 1
                log.warning(
                    "ledger check of a validator failed",
                    extra={"validator": "0x" + address.hex(), "error": str(exc)},
                )
                trusted = False
        state.checked_at = trio.current_time()
        state.trusted = trusted
        return trusted

    async def _pull_validators(self, net: RoleNet) -> None:
        """One pull loop per validator found and (with a ledger) in good standing; keep records current.

        A validator that loses its standing stops being pulled from (what it delivered stays stored).
        """
        async with trio.open_nursery() as nursery:
            while True:
                found = net.peers("validator")
                track_validators(self.validators, found, trio.current_time(), self.bounds.tracked_validators)
                for address, state in list(self.validators.items()):
                    trusted = await self._trusted(address, state)
                    if trusted and state.scope is None:
                        state.scope = trio.CancelScope()
                        nursery.start_soon(self._pull_in, state.scope, net, address)
                    elif not trusted and state.scope is not None:
                        log.warning(
                            "validator not in good standing in the ledger; no longer pulling from it",
                            extra={"validator": "0x" + address.hex()},
                        )
                        state.scope.cancel()
                        state.scope = None
                await trio.sleep(PEER_SCAN_S)

    async def _pull_in(self, scope: trio.CancelScope, net: RoleNet, validator: bytes) -> None:
        with scope:
            await self._pull(net, validator)

    async def _pull(self, net: RoleNet, validator: bytes) -> None:
        _, inbox, _ = self._parts()
        state = self.validators[validator]
        pause = PULL_BACKOFF_S[0]
        while True:
            peer = ID.from_base58(state.record.peer_id)
            limit = pull_limit(inbox.held_from(validator), self.bounds.rows_per_validator)
            if not limit:
                await trio.sleep(PULL_EMPTY_PAUSE_S)
                continue
            request = AcceptedRequest(net.run, inbox.cursor(validator), limit, PULL_WAIT_MS)
            state.pulls += 1
            try:
                opened = await net.request(peer, ACCEPTED, request)
            except RequestFailed as exc:
                state.failures += 1
                log.debug("pull failed", extra={"validator": "0x" + validator.hex(), "error": str(exc)})
                await trio.sleep(pause)
                pause = min(pause * 2, PULL_BACKOFF_S[1])
                continue
            batch: AcceptedBatch = opened.message
            try:
                before = request.after
                result = await self.ingest(validator, batch)
            except Exception as exc:  # one bad batch must not stop the trainer (nothing of it was stored)
                state.errors += 1
                self.tallies.pull_errors += 1
                log.exception("handling a pulled batch failed", extra={"validator": "0x" + validator.hex()})
                if not isinstance(exc, sqlite3.Error | OSError):  # our storage failing: not its fault
                    net.report(peer, Reason.RULE_VIOLATION, f"accepted batch could not be handled: {exc}")
                await trio.sleep(pause)
                pause = min(pause * 2, PULL_BACKOFF_S[1])
                continue
            pause = PULL_BACKOFF_S[0]
            state.stored += result.stored.inserted
            state.refused += len(result.refused)
            for index, reason, detail in result.refused:
                if self._blames(reason):
                    net.report(peer, reason, f"accepted item {index}: {detail}")
            if not batch.items or result.cursor == before:  # nothing new, or nothing we could pass
                await trio.sleep(PULL_EMPTY_PAUSE_S)

    # --- announcing checkpoints ----------------------------------------------------------------------

    def _announce_newest(self) -> None:
        """Gossip the newest manifest and provide the retained versions in the DHT (in the background)."""
        if self._background is None or self.origin is None or not self._announces():
            return
        self._background.start_soon(self._gossip_newest)
        net = self._net
        assert net is not None
        held = set(self.origin.catalog.versions())
        for version in sorted(held - self._provided):
            self._background.start_soon(net.provide_checkpoint, version)
        for version in self._provided - held:
            net.stop_providing_checkpoint(version)
        self._provided = held

    async def _gossip_newest(self) -> None:
        entry = self.origin.catalog.latest if self.origin is not None else None
        if entry is not None and self._net is not None:
            await self._net.publish("checkpoints", entry.head)

    async def _republish_forever(self) -> None:
        while True:
            await trio.sleep(REPUBLISH_S)
            if self._announces():
                await self._gossip_newest()

    # --- status --------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot for the node's status file and the devnet display.

        Counts of submissions come from the inbox and the per-step lists from its step records, so they
        survive a restart; `refused`, `duplicates`, `verdicts` and `validators` count since this start.
        `rewards` is each step's mean reward over all the groups it took (filtered ones included, as in
        `node.rl.sync`); `groups_used` counts the groups with signal that the steps trained on.
        """
        trainer, inbox, origin = self.trainer, self.inbox, self.origin
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
