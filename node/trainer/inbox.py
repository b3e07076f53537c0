"""The trainer's inbox: accepted submissions pulled from validators, durable before they are acknowledged.

A pulled batch and the validator's new cursor are written in one SQLite transaction (WAL, synchronous
FULL), so a trainer killed at any point restarts with exactly what it had received and asks each
validator from where it stopped: nothing accepted is lost and nothing is stored twice (the submission
digest is unique, so one submission accepted by two validators is kept once, and so is (worker, step): a
worker that sends one assignment, sealed anew, to several validators is trained on once).

A row's life: pending (`consumed_step` and `dropped_step` NULL) → used by step n (`consumed_step = n`,
written before step n's weights are saved) or dropped as stale at step n (`dropped_step = n`). A trainer
that resumes at step s never saved what steps >= s did, so `release_from(s)` makes their rows pending
again. Per-step records (`record_step`) live here too, so the status survives a restart.

Bounded (spec/bounds.md, trainer inbox): `prune` deletes every row of a version older than
`newest - async_level - retention_versions`, whatever its state. No step can take such a row again: a step
of version s takes versions in [s - async_level, s], versions never go back below `newest - 1` (a lone
trainer resumes from its newest or its previous save, `trainer.KEEP_SAVES`; a DiLoCo round from the newest
outer state), so every row below the cutoff was trained by a step that is final, or dropped, or is stale
for every step to come. Nor can it come back: the trainer refuses submissions of versions its origin no
longer keeps (`async_level + 1` behind the newest), so a re-delivered copy is Ignored as stale before it is
stored, and the (worker, step) and digest guards are only needed inside the window. The counts of pruned
rows are folded into `totals`, so `counts()` stays cumulative. Freed pages are reused by later inserts and
given back to the file system after each prune (`auto_vacuum = INCREMENTAL`, then a truncating
checkpoint), and the WAL is truncated to `WAL_LIMIT_BYTES` after any checkpoint: the bytes on disk follow
the retained rows, not the run's age.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    validator BLOB NOT NULL,
    idx INTEGER NOT NULL,
    digest BLOB NOT NULL UNIQUE,
    worker BLOB NOT NULL,
    step BLOB,
    checkpoint_version INTEGER NOT NULL,
    groups INTEGER NOT NULL,
    signal_groups INTEGER NOT NULL,
    submission BLOB NOT NULL,
    verdict BLOB NOT NULL,
    received_ms INTEGER NOT NULL,
    consumed_step INTEGER,
    dropped_step INTEGER
);
CREATE INDEX IF NOT EXISTS rollouts_pending ON rollouts (consumed_step, dropped_step, id);
CREATE TABLE IF NOT EXISTS cursors (
    validator BLOB PRIMARY KEY,
    after INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    step INTEGER PRIMARY KEY,
    submissions INTEGER NOT NULL,
    groups INTEGER NOT NULL,
    signal_groups INTEGER NOT NULL,
    mean_reward REAL NOT NULL,
    wait_s REAL NOT NULL,
    train_s REAL NOT NULL,
    step_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS settled (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    below INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    received INTEGER NOT NULL,
    used INTEGER NOT NULL,
    dropped INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_version ON rollouts (checkpoint_version);
CREATE INDEX IF NOT EXISTS rollouts_validator ON rollouts (validator);
"""
# After SCHEMA (an inbox made before `step` existed gets the column first; its old rows keep NULL).
ASSIGNMENT_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS rollouts_assignment ON rollouts (worker, step)"

RETENTION_VERSIONS = 4  # versions kept beyond the async window: the audit horizon
MIN_RETENTION_VERSIONS = 2  # one for a resume from the previous save, one for the origin's extra kept version
WAL_LIMIT_BYTES = 64 * 2**20  # the WAL file is truncated to this after a checkpoint


def prune_cutoff(newest: int, async_level: int, retention: int) -> int:
    """Rows of versions below this are never taken again (see the module docstring): they may go."""
    return newest - async_level - retention


def step_key(step: int) -> bytes:
    """An assignment step (u64) as stored: 8 big-endian bytes (SQLite integers are signed 64-bit)."""
    return step.to_bytes(8, "big")


@dataclass(frozen=True)
class InboxEntry:
    """A verified accepted submission, ready to store."""

    index: int  # the validator's index of this acceptance
    digest: bytes  # sha256 of the submission envelope
    worker: bytes
    step: int  # the assignment step (u64): one submission per (worker, step) is kept
    checkpoint_version: int
    groups: int
    signal_groups: int  # groups with a nonzero advantage (online filtering keeps only these)
    submission: bytes  # the worker-signed envelope
    verdict: bytes  # the validator-signed accepting Verdict envelope
    received_ms: int


@dataclass(frozen=True)
class InboxRow:
    """A pending submission as the batch planner sees it (no blobs)."""

    id: int  # arrival order
    digest: bytes
    worker: bytes
    checkpoint_version: int
    groups: int
    signal_groups: int


@dataclass(frozen=True)
class Stored:
    inserted: int
    duplicates: int  # digests or (worker, step) already in the inbox (accepted by another validator too)


@dataclass(frozen=True)
class StepRecord:
    step: int  # the policy version trained on (the step produces version step + 1)
    submissions: int
    groups: int
    signal_groups: int
    mean_reward: float
    wait_s: float
    train_s: float
    step_s: float


@dataclass(frozen=True)
class InboxStatistics:
    rows: int  # rows held (any state)
    pending: int
    blob_bytes: int  # submission and verdict envelopes held
    file_bytes: int  # the database file (pages in use and free)
    free_bytes: int  # free pages inside it, reused by the next inserts
    wal_bytes: int  # the write-ahead log beside it
    oldest_version: int | None  # of the rows held


class RolloutInbox:
    def __init__(self, path: Path, *, retention_versions: int = RETENTION_VERSIONS) -> None:
        if retention_versions < MIN_RETENTION_VERSIONS:
            raise ValueError(
                f"inbox retention of {retention_versions} versions is below {MIN_RETENTION_VERSIONS}: "
                "a resumed trainer could need rows already deleted"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.retention_versions = retention_versions
        self._db = sqlite3.connect(path, isolation_level=None)
        if self._db.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:  # 2: incremental
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect on a new file, or by:
            self._db.execute("VACUUM")  # once, for an inbox made before pruning existed
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        self._db.executescript(SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(rollouts)")}
        if "step" not in columns:
            self._db.execute("ALTER TABLE rollouts ADD COLUMN step BLOB")
        self._db.execute(ASSIGNMENT_INDEX)

    def close(self) -> None:
        self._db.close()

    # --- pulling -----------------------------------------------------------------------------------

    def cursor(self, validator: bytes) -> int:
        """The last index received from `validator` (0: nothing yet)."""
        row = self._db.execute("SELECT after FROM cursors WHERE validator = ?", (validator,)).fetchone()
        return int(row[0]) if row else 0

    def store(self, validator: bytes, entries: Sequence[InboxEntry], cursor: int) -> Stored:
        """Insert `entries` and set the validator's cursor to `cursor`, in one transaction."""
        inserted = 0
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for e in entries:
                changed = self._db.execute(
                    # a uniqueness conflict (digest, or worker and step) skips the row; NOT NULL still fails
                    "INSERT INTO rollouts (validator, idx, digest, worker, step, checkpoint_version,"
                    " groups, signal_groups, submission, verdict, received_ms)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (
                        validator,
                        e.index,
                        e.digest,
                        e.worker,
                        step_key(e.step),
                        e.checkpoint_version,
                        e.groups,
                        e.signal_groups,
                        e.submission,
                        e.verdict,
                        e.received_ms,
                    ),
                ).rowcount
                inserted += changed
            self._db.execute(
                "INSERT INTO cursors (validator, after) VALUES (?, ?)"
                " ON CONFLICT (validator) DO UPDATE SET after = excluded.after",
                (validator, cursor),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return Stored(inserted, len(entries) - inserted)

    # --- the step loop -----------------------------------------------------------------------------

    def pending(self) -> list[InboxRow]:
        """Submissions neither used nor dropped, in arrival order."""
        rows = self._db.execute(
            "SELECT id, digest, worker, checkpoint_version, groups, signal_groups FROM rollouts"
            " WHERE consumed_step IS NULL AND dropped_step IS NULL ORDER BY id"
        ).fetchall()
        return [InboxRow(*row) for row in rows]

    def held_from(self, validator: bytes) -> int:
        """How many rows `validator` delivered that are still held (in any state: until pruned)."""
        row = self._db.execute("SELECT COUNT(*) FROM rollouts WHERE validator = ?", (validator,)).fetchone()
        return int(row[0])

    def submissions(self, ids: Sequence[int]) -> list[bytes]:
        """The signed submission envelopes of rows `ids`, in that order."""
        out = []
        for row_id in ids:
            row = self._db.execute("SELECT submission FROM rollouts WHERE id = ?", (row_id,)).fetchone()
            if row is None:
                raise KeyError(f"no inbox row {row_id}")
            out.append(bytes(row[0]))
        return out

    def consume(self, ids: Iterable[int], step: int) -> None:
        self._mark("consumed_step", ids, step)

    def drop(self, ids: Iterable[int], step: int) -> None:
        self._mark("dropped_step", ids, step)

    def _mark(self, column: str, ids: Iterable[int], step: int) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany(
                f"UPDATE rollouts SET {column} = ? WHERE id = ?", [(step, row_id) for row_id in ids]
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def release_from(self, step: int) -> int:
        """Make rows used or dropped by steps >= `step` pending again (those steps were never saved)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            released = self._db.execute(
                "UPDATE rollouts SET consumed_step = NULL WHERE consumed_step >= ?", (step,)
            ).rowcount
            released += self._db.execute(
                "UPDATE rollouts SET dropped_step = NULL WHERE dropped_step >= ?", (step,)
            ).rowcount
            self._db.execute("DELETE FROM steps WHERE step >= ?", (step,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return released

    def settled_below(self) -> int:
        """Steps below this are final: what they used was trained into the run (multi-trainer runs)."""
        row = self._db.execute("SELECT below FROM settled WHERE id = 0").fetchone()
        return int(row[0]) if row else 0

    def settle(self, upto: int, counted_from: int) -> int:
        """Settle every step below `upto`; rows used by unsettled steps below `counted_from` go back.

        A DiLoCo trainer calls it once it holds the outer weights of a round: steps in
        [counted_from, upto) made the contribution that round counted; the earlier unsettled ones made
        contributions no round counted (left out, or abandoned for a newer outer state), so their rows
        were never trained into the run. Returns how many rows went back to the pool.
        """
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute("SELECT below FROM settled WHERE id = 0").fetchone()
            below = int(row[0]) if row else 0
            released = 0
            if upto > below:
                uncounted = (below, min(counted_from, upto))
                released = self._db.execute(
                    "UPDATE rollouts SET consumed_step = NULL WHERE consumed_step >= ? AND consumed_step < ?",
                    uncounted,
                ).rowcount
                self._db.execute("DELETE FROM steps WHERE step >= ? AND step < ?", uncounted)
                self._db.execute("INSERT OR REPLACE INTO settled (id, below) VALUES (0, ?)", (upto,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return released

    def prune(self, newest: int, async_level: int) -> int:
        """Delete the rows of versions below `prune_cutoff` (their counts go to `totals`); give back pages.

        `newest` is the newest version published. Returns how many rows were deleted.
        """
        below = prune_cutoff(newest, async_level, self.retention_versions)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            received, used, dropped = self._db.execute(
                "SELECT COUNT(*), COUNT(consumed_step), COUNT(dropped_step) FROM rollouts"
                " WHERE checkpoint_version < ?",
                (below,),
            ).fetchone()
            if received:
                self._db.execute(
                    "INSERT INTO totals (id, received, used, dropped) VALUES (0, ?, ?, ?)"
                    " ON CONFLICT (id) DO UPDATE SET received = received + excluded.received,"
                    " used = used + excluded.used, dropped = dropped + excluded.dropped",
                    (received, used, dropped),
                )
                self._db.execute("DELETE FROM rollouts WHERE checkpoint_version < ?", (below,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        if received:
            self._db.execute("PRAGMA incremental_vacuum")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the file shrinks, the WAL empties
        return int(received)

    def record_step(self, record: StepRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.step,
                record.submissions,
                record.groups,
                record.signal_groups,
                record.mean_reward,
                record.wait_s,
                record.train_s,
                record.step_s,
            ),
        )

    # --- statistics --------------------------------------------------------------------------------

    def steps(self) -> list[StepRecord]:
        rows = self._db.execute("SELECT * FROM steps ORDER BY step").fetchall()
        return [StepRecord(*row) for row in rows]

    def counts(self) -> dict[str, int]:
        """Rows received, used, dropped since the inbox was made (pruned ones included), and pending."""
        received, used, dropped = self._db.execute(
            "SELECT COUNT(*), COUNT(consumed_step), COUNT(dropped_step) FROM rollouts"
        ).fetchone()
        pending = received - used - dropped
        row = self._db.execute("SELECT received, used, dropped FROM totals WHERE id = 0").fetchone()
        if row is not None:
            received, used, dropped = received + row[0], used + row[1], dropped + row[2]
        return {"received": received, "used": used, "dropped": dropped, "pending": pending}

    def statistics(self) -> InboxStatistics:
        rows, pending, blob_bytes, oldest = self._db.execute(
            "SELECT COUNT(*), COUNT(*) - COUNT(consumed_step) - COUNT(dropped_step),"
            " COALESCE(SUM(LENGTH(submission) + LENGTH(verdict)), 0), MIN(checkpoint_version) FROM rollouts"
        ).fetchone()
        page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
        pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        wal = self.path.with_name(self.path.name + "-wal")
        return InboxStatistics(
            rows=rows,
            pending=pending,
            blob_bytes=blob_bytes,
            file_bytes=pages * page_size,
            free_bytes=free * page_size,
            wal_bytes=os.path.getsize(wal) if wal.exists() else 0,
            oldest_version=oldest,
        )

    def used_per_worker(self) -> dict[bytes, int]:
        """Rows each worker had used, among the rows still held (the ledger keeps the credit for good)."""
        rows = self._db.execute(
            "SELECT worker, COUNT(*) FROM rollouts WHERE consumed_step IS NOT NULL GROUP BY worker"
        ).fetchall()
        return {bytes(worker): count for worker, count in rows}

    def cursors(self) -> dict[bytes, int]:
        return {bytes(v): after for v, after in self._db.execute("SELECT validator, after FROM cursors")}
