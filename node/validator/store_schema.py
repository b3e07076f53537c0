"""The validator store's SQLite schema (`node.validator.store`): its tables, the values its columns take,
and the migration of a store written by an older version.

One SQLite file holds these tables (the methods named are `AcceptedStore`'s):
- `pending`: signed submissions received but not yet judged, in arrival order. A submission is written
  here before its SUBMIT is acknowledged as queued (status 100), so a validator killed at any point
  judges, after a restart, everything it ever acknowledged.
- `judged`: one row per judged submission (its digest, the worker, assignment step and its version, the
  outcome code, whether the outcome was an ignore, the sealed verdict), so a resend of the same submission
  is refused as a duplicate (201), and another submission for an assignment step queued or judged with a
  verdict as a reuse (610), even after a restart. An ignore (the `ignored` flag: every `Ignore`, whatever
  its code, 607 included) leaves the step free, but one assignment is judged at most
  `MAX_JUDGED_PER_ASSIGNMENT` times.
- `decided`: the decision on a pending submission, written (`decide`) right after the judgement and
  before any ledger write: the outcome's class, its code, tokens, the `Verdict` body (with the failing
  chunks) and the sealed verdict envelope. A pending submission with a decision is never judged again.
- `accepted`: the append-only log the trainer pulls with `AcceptedRequest`: index (from 1), the
  validator's sealed accepting verdict and the worker's signed submission, digest unique, and the version.
- `pruned`: the outcome counts of judged rows pruned, so the status counts survive pruning.
- `credits`: what each acceptance is owed on the ledger (run, worker, assignment step, tokens, flops, the
  submission's digest), written in the same transaction as the acceptance (`finish`), so a credit is never
  lost to a crash. The validator's committer sends the queued ones in batches (`CommitCredits`) and marks
  them committed, or dropped with the reason (already credited, a worker no longer eligible, ...).
"""

from __future__ import annotations

import sqlite3

from swarmnode.protocol.errors import Reason
from swarmnode.protocol.runs import step_version

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS pending (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    digest BLOB NOT NULL UNIQUE,
    worker BLOB NOT NULL,
    step BLOB NOT NULL,
    checkpoint_version BLOB NOT NULL,
    received_ms INTEGER NOT NULL,
    envelope BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS pending_assignment ON pending (worker, step);
CREATE TABLE IF NOT EXISTS pruned (
    status INTEGER NOT NULL,
    ignored INTEGER NOT NULL,
    count INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (status, ignored)
);
CREATE TABLE IF NOT EXISTS judged (
    digest BLOB PRIMARY KEY,
    worker BLOB NOT NULL,
    step BLOB NOT NULL,
    status INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    verdict BLOB NOT NULL,
    judged_ms INTEGER NOT NULL,
    ignored INTEGER NOT NULL DEFAULT 0,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS decided (
    id INTEGER PRIMARY KEY,
    outcome TEXT NOT NULL,
    status INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    verdict BLOB NOT NULL,
    sealed BLOB NOT NULL,
    full INTEGER NOT NULL,
    cpu_s REAL NOT NULL,
    decided_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS accepted (
    idx INTEGER PRIMARY KEY AUTOINCREMENT,
    digest BLOB NOT NULL UNIQUE,
    verdict BLOB NOT NULL,
    submission BLOB NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS credits (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run TEXT NOT NULL,
    worker BLOB NOT NULL,
    step BLOB NOT NULL,
    version INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    flops BLOB NOT NULL,
    rollout_digest BLOB NOT NULL,
    state INTEGER NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS credits_assignment ON credits (run, worker, step);
CREATE INDEX IF NOT EXISTS credits_queue ON credits (state, run, id);
"""
# After `judged` and `accepted` have their `ignored` and `version` columns (`_migrate` adds them to an
# older store). One verdict per assignment, except the reuse rejections (610) that name a second submission.
JUDGED_INDEX = f"""
DROP INDEX IF EXISTS judged_assignment;
DROP INDEX IF EXISTS judged_verdict_assignment;
CREATE UNIQUE INDEX IF NOT EXISTS judged_one_verdict ON judged (worker, step)
    WHERE ignored = 0 AND status != {int(Reason.ASSIGNMENT_REUSED)};
CREATE INDEX IF NOT EXISTS judged_tries ON judged (worker, step);
CREATE INDEX IF NOT EXISTS judged_version ON judged (version);
CREATE INDEX IF NOT EXISTS accepted_version ON accepted (version);
"""

ACCEPTED = 0  # the `judged.status` of an acceptance; otherwise the reason code (`judged.ignored`: an ignore)
OUTCOMES = ("accepted", "rejected", "ignored")  # `decided.outcome`: the class of the outcome
SECRET_KEY = "sample_secret"
FLOOR_KEY = "floor"  # the oldest version whose assignments are kept (and may be queued)
# `credits.state`: waiting for the ledger, in a committed batch, or dropped (the reason in `detail`)
CREDIT_QUEUED, CREDIT_COMMITTED, CREDIT_DROPPED = 0, 1, 2


def u64(value: int) -> bytes:
    """An assignment step, version or flops as the 8 big-endian bytes its BLOB column holds."""
    return value.to_bytes(8, "big")


def migrate(db: sqlite3.Connection) -> None:
    """An older store: `judged` gets the `ignored` flag (set for the ignores of then: 2xx and 607) and,
    with `accepted`, the `version` column (the assignment step's high 32 bits)."""
    judged = {row[1] for row in db.execute("PRAGMA table_info(judged)")}
    accepted = {row[1] for row in db.execute("PRAGMA table_info(accepted)")}
    if "ignored" in judged and "version" in judged and "version" in accepted:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        if "ignored" not in judged:
            db.execute("ALTER TABLE judged ADD COLUMN ignored INTEGER NOT NULL DEFAULT 0")
            db.execute(
                "UPDATE judged SET ignored = 1 WHERE status BETWEEN 200 AND 299 OR status = ?",
                (int(Reason.UNKNOWN_CHECKPOINT),),
            )
        if "version" not in judged:
            db.execute("ALTER TABLE judged ADD COLUMN version INTEGER NOT NULL DEFAULT 0")
            steps = db.execute("SELECT rowid, step FROM judged").fetchall()
            db.executemany(
                "UPDATE judged SET version = ? WHERE rowid = ?",
                [(step_version(int.from_bytes(step, "big")), rowid) for rowid, step in steps],
            )
        if "version" not in accepted:
            db.execute("ALTER TABLE accepted ADD COLUMN version INTEGER NOT NULL DEFAULT 0")
            db.execute(
                "UPDATE accepted SET version = COALESCE("
                "(SELECT judged.version FROM judged WHERE judged.digest = accepted.digest), 0)"
            )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
