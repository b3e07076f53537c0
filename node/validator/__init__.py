"""Validator work: queue signed submissions, judge them on the claimed checkpoint, gossip signed verdicts,
serve the accepted ones to the trainer, and credit (in batches) or slash in the ledger.

The life of a submission (spec/validation.md):
1. SUBMIT (`submit`): only cheap checks (a RolloutSubmission of this run, once the run is loaded; its step
   bound to its version with a counter the run allows; not stale, not newer than the newest trainer-signed
   manifest the follower has seen; a staked sender, read from the ledger and cached for
   `ELIGIBILITY_TTL_S`; not a duplicate (201) nor a second submission for an assignment (610); room in the
   queue and in the worker's share of it); then it is written to the durable pending queue
   (`AcceptedStore`) and acknowledged 100. Nothing is written for a refused one.
2. The judging loop (`judge_forever`) takes queued submissions oldest first, skipping over those whose
   checkpoint it does not hold yet: they wait up to `WAIT_FOR_CHECKPOINT_S` for the follower to bring it,
   then are ignored (203/607). `node.rl.validation.judge_total` runs in a thread on the engine of the claimed
   version; on a run with `sample_fraction < 1`, only the submissions an HMAC of their digest under a
   validator-local secret draws get the prefill checks (workers cannot tell which), the others the cheap
   ones, except that a submission whose grading executes a completion (a code task) is always checked in
   full: its text is graded only after the model checks. The judge is total: an exception while judging
   is a JUDGE_FAULT ignore (207), an envelope that does not read back too, and any other exception on one
   item's path quarantines that item (a JUDGE_FAULT ignore written straight to the store, `quarantined` in
   the status): no item can stop the loop or a restart.
3. The outcome becomes a `Verdict`, sealed once with the node key: those bytes are what the accepted log
   stores and the ledger cites; the decision (outcome, verdict, sealed envelope) is written to the store
   before any ledger call. After the ledger write and `finish`, the verdict is gossiped on `verdicts`
   (ignores are not: nobody is at fault and nothing is recorded).
4. Accepted: an entry in the accepted log that the run's trainers (the lead and its co-trainers, only
   they) pull with ACCEPTED (long poll, cursor), and, in the same store transaction, a credit owed
   (tokens, flops = 2 · parameters · tokens, capped by the run's bound per token; the submission's
   digest). The committer (`commit_credits`) sends the queued credits of the run as one `CommitCredits`
   of up to `max_credits_per_batch`, sorted by (worker, step), every `credit_interval_s` or as soon as a
   batch is full, and marks them committed.
   Rejected for a slashable reason (`ledger.evidence.SLASHABLE_REASONS`): a slash of the run's
   `slash_gwei` (capped by the ledger's own maximum) whose evidence is the worker's signed submission
   and, for a bad proof, the failing chunks. The ledger files it pending; `finalize_slashes` applies it
   once the run's challenge window has passed (unless the run's owner or its other validators voided it).
   Other rejections only get the verdict.


One concern per module (each module's docstring records its design decisions):

- `limits`: every bound, wait and cadence, in one table.
- `engines`: the engines of the retained checkpoint versions (`CheckpointEngines`).
- `judgement`: the decision about one submission: the draw for the prefill checks, the checks, the
  verdict body, the `Decision` stored before any ledger write.
- `ledger_access`: the ledger from trio (`LedgerAccess`, whose `ledger` is the `Ledger` it wraps: one
  blocking call at a time, refusals typed, failures `LedgerUnavailable`) and what each write carries
  (`slash_for`, `credit_for`, `fit_credit`) or why it is refused (`commit_blocker`, `credit_refusal`).
- `state`: the small objects the parts share, each handed to them explicitly: `RunContext` (the run as
  known, the engines, the follower), `PendingQueue`, `CreditBacklog`, `OutcomeCounts`.
- `intake`: `Intake`, SUBMIT's cheap checks and the durable queue.
- `judging_loop`: `JudgingLoop`, the scheduler (which queued submission next, fairly) and the carrying
  of one judgement through store, ledger and gossip, crash-safe.
- `settlement`: `Settlement`, the run on the ledger, slashes filed and finalized, credits committed in
  batches.
- `accepted_log`: `AcceptedLog`, ACCEPTED served to the run's trainers, and the store's retention.
- `work`: `SwarmValidatorWork`, the parts composed (no part inherits from another) and the one loop that
  runs them: learn the run, hold checkpoints, judge forever.
- `store`: `AcceptedStore`, the durable SQLite state (queue, decisions, judged, accepted log, credits);
  `store_schema` its tables and migration, `store_rows` the rows it hands out.
- `service`: the network service (`Validator`): the SUBMIT and ACCEPTED endpoints.

Import from here: `from node.validator import SwarmValidatorWork, ...` is the public surface.
"""

from swarmnode.node.validator.engines import CheckpointEngines
from swarmnode.node.validator.judgement import (
    Decision,
    Judgement,
    clip_detail,
    drawn_for_full_check,
    fault_verdict,
    gets_full_check,
    judge_submission,
    make_verdict,
    reason_name,
)
from swarmnode.node.validator.judging_loop import VerdictOut
from swarmnode.node.validator.ledger_access import (
    LedgerAccess,
    LedgerUnavailable,
    commit_blocker,
    credit_for,
    credit_refusal,
    fit_credit,
    slash_for,
)
from swarmnode.node.validator.limits import (
    ACCEPTED_RETENTION_VERSIONS,
    CREDIT_INTERVAL_S,
    ELIGIBILITY_TTL_S,
    LEDGER_RETRY_MAX_S,
    LEDGER_RETRY_S,
    MAX_ACCEPTED_BYTES,
    MAX_BATCH_BYTES,
    MAX_DETAIL_BYTES,
    MAX_ELIGIBILITY_CACHE,
    MAX_PENDING,
    MAX_PENDING_BYTES,
    MAX_PENDING_PER_WORKER,
    MAX_QUEUED_CREDITS,
    MAX_VERDICT_CHUNKS,
    MAX_WORKER_TALLIES,
    PRUNE_EVERY_S,
    QUEUED,
    RUN_WAIT_S,
    SLASH_CHECK_S,
    STORE_FILE,
    UNSAMPLED,
    VERDICT_BACKLOG,
    WAIT_FOR_CHECKPOINT_S,
)
from swarmnode.node.validator.state import WorkerTally
from swarmnode.node.validator.work import SwarmValidatorWork

__all__ = [
    "ACCEPTED_RETENTION_VERSIONS",
    "CREDIT_INTERVAL_S",
    "ELIGIBILITY_TTL_S",
    "LEDGER_RETRY_MAX_S",
    "LEDGER_RETRY_S",
    "MAX_ACCEPTED_BYTES",
    "MAX_BATCH_BYTES",
    "MAX_DETAIL_BYTES",
    "MAX_ELIGIBILITY_CACHE",
    "MAX_PENDING",
    "MAX_PENDING_BYTES",
    "MAX_PENDING_PER_WORKER",
    "MAX_QUEUED_CREDITS",
    "MAX_VERDICT_CHUNKS",
    "MAX_WORKER_TALLIES",
    "PRUNE_EVERY_S",
    "QUEUED",
    "RUN_WAIT_S",
    "SLASH_CHECK_S",
    "STORE_FILE",
    "UNSAMPLED",
    "VERDICT_BACKLOG",
    "WAIT_FOR_CHECKPOINT_S",
    "CheckpointEngines",
    "Decision",
    "Judgement",
    "LedgerAccess",
    "LedgerUnavailable",
    "SwarmValidatorWork",
    "VerdictOut",
    "WorkerTally",
    "clip_detail",
    "commit_blocker",
    "credit_for",
    "credit_refusal",
    "drawn_for_full_check",
    "fault_verdict",
    "fit_credit",
    "gets_full_check",
    "judge_submission",
    "make_verdict",
    "reason_name",
    "slash_for",
]
