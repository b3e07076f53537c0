"""The validator's durable state: submissions queued for judgement, what was judged, what was accepted.

One SQLite file (WAL, synchronous=FULL: a commit is on disk when it returns) holds three tables:
- `pending`: signed submissions received but not yet judged, in arrival order. A submission is written
  here before its SUBMIT is acknowledged as queued (status 100), so a validator killed at any point
  judges, after a restart, everything it ever acknowledged.
- `judged`: one row per judged submission (its digest, the worker and assignment step, the outcome code,
  whether the outcome was an ignore, the sealed verdict), so a resend of the same submission, or another
  submission for an assignment step judged with a verdict, is refused as a duplicate even after a restart.
  An ignore (the `ignored` flag: every `Ignore`, whatever its code, 607 included) leaves the step free.
- `decided`: the decision on a pending submission, written (`decide`) right after the judgement and
  before any ledger write: the outcome's class, its code, tokens, the `Verdict` body (with the failing
  chunks) and the sealed verdict envelope. A pending submission with a decision is never judged again.
- `accepted`: the append-only log the trainer pulls with `AcceptedRequest`: index (from 1), the
  validator's sealed accepting verdict and the worker's signed submission, digest unique.

A judgement is decided (`decided`) before the ledger is written, and leaves `pending` and `decided` for
`judged` (and `accepted`) in one later transaction (`finish`): nothing is judged twice by this store,
nothing is lost. A crash between the two replays the ledger write from the stored decision after a
restart (the ledger refuses a repeated entry: at least once, and the ledger makes it exactly once) and
finishes with the verdict sealed the first time, the one the ledger's contribution cites.

Every method is blocking and thread-safe (one lock around one connection): call them from
`trio.to_thread.run_sync`. `finish_async` and `wait_after` are the trio side: a finished acceptance
wakes the long polls waiting for something newer than their cursor.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

import trio

from protocol.errors import Ignore, Reason, Reject
from protocol.messages import AcceptedRollout

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
CREATE TABLE IF NOT EXISTS judged (
    digest BLOB PRIMARY KEY,
    worker BLOB NOT NULL,
    step BLOB NOT NULL,
    status INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    verdict BLOB NOT NULL,
    judged_ms INTEGER NOT NULL,
    ignored INTEGER NOT NULL DEFAULT 0
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
    submission BLOB NOT NULL
);
"""
# After `judged` has its `ignored` column (a store from before the flag gets it in `_migrate`).
JUDGED_INDEX = """
DROP INDEX IF EXISTS judged_assignment;
CREATE UNIQUE INDEX IF NOT EXISTS judged_verdict_assignment ON judged (worker, step) WHERE ignored = 0;
"""

ACCEPTED = 0  # the `judged.status` of an acceptance; otherwise the reason code (`judged.ignored`: an ignore)
OUTCOMES = ("accepted", "rejected", "ignored")  # `decided.outcome`: the class of the outcome
MAX_CURSOR = 2**63 - 1  # accepted indices are SQLite INTEGERs
SECRET_KEY = "sample_secret"


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


@dataclass(frozen=True)
class PendingItem:
    """A queued submission as the judge's scheduler sees it (the envelope stays on disk)."""

    id: int  # arrival order
    digest: bytes
    worker: bytes
    step: int
    checkpoint_version: int
    received_ms: int
    size: int


@dataclass(frozen=True)
class Decided:
    """A pending submission's decision, made before its ledger write (the `decided` table)."""

    outcome: str  # one of OUTCOMES
    status: int  # ACCEPTED, or the reason code
    tokens: int
    verdict: bytes  # the encoded `Verdict` body (reason, detail, failing chunks, tokens, TOPLOC means)
    sealed: bytes  # the verdict envelope, sealed once; b"" for an ignore
    full: bool  # the prefill checks ran
    cpu_s: float


@dataclass(frozen=True)
class JudgedCounts:
    """What the `judged` table says, for the status after a restart."""

    by_status: dict[int, int]  # verdicts (acceptances and rejections) by status
    ignored: dict[int, int]  # ignores by reason code
    per_worker: dict[bytes, dict[int, int]]  # verdicts only
    tokens: int


class AcceptedStore:
    """Pending queue, judgements and the accepted log of one validator (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._migrate()
        self._db.executescript(JUDGED_INDEX)
        self._newest = int(self._db.execute("SELECT COALESCE(MAX(idx), 0) FROM accepted").fetchone()[0])
        self._changed = trio.Event()

    def _migrate(self) -> None:
        """A store written before the `ignored` flag: add it, set for the ignores of then (2xx and 607)."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(judged)")}
        if "ignored" in columns:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute("ALTER TABLE judged ADD COLUMN ignored INTEGER NOT NULL DEFAULT 0")
            self._db.execute(
                "UPDATE judged SET ignored = 1 WHERE status BETWEEN 200 AND 299 OR status = ?",
                (int(Reason.UNKNOWN_CHECKPOINT),),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def newest(self) -> int:
        """The newest accepted index (0 while nothing was accepted)."""
        return self._newest

    def secret(self) -> bytes:
        """A random secret of this validator, made once and kept: it draws which submissions get prefilled."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (SECRET_KEY,)).fetchone()
            if row is not None:
                return bytes(row[0])
            value = secrets.token_bytes(32)
            self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (SECRET_KEY, value))
            return value

    # --- the pending queue -------------------------------------------------------------------------

    def enqueue(
        self,
        *,
        digest: bytes,
        worker: bytes,
        step: int,
        checkpoint_version: int,
        received_ms: int,
        envelope: bytes,
        max_items: int,
        max_bytes: int,
        max_per_worker: int | None = None,
    ) -> PendingItem:
        """Queue a submission durably; `Ignore` DUPLICATE if this submission or another one for the same
        assignment step was queued or judged with a verdict before, NOT_FOR_US if the queue is full or
        the worker already has `max_per_worker` submissions queued."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._check_new(digest, worker, step)
                count, size = self._db.execute(
                    "SELECT COUNT(*), COALESCE(SUM(LENGTH(envelope)), 0) FROM pending"
                ).fetchone()
                if count >= max_items or size + len(envelope) > max_bytes:
                    raise Ignore(Reason.NOT_FOR_US, f"queue full ({count} submissions, {size} bytes)")
                if max_per_worker is not None:
                    (mine,) = self._db.execute(
                        "SELECT COUNT(*) FROM pending WHERE worker = ?", (worker,)
                    ).fetchone()
                    if mine >= max_per_worker:
                        raise Ignore(Reason.NOT_FOR_US, f"this worker has {mine} submissions queued already")
                cursor = self._db.execute(
                    "INSERT INTO pending (digest, worker, step, checkpoint_version, received_ms, envelope)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (digest, worker, _u64(step), _u64(checkpoint_version), received_ms, envelope),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        assert cursor.lastrowid is not None
        return PendingItem(
            cursor.lastrowid, digest, worker, step, checkpoint_version, received_ms, len(envelope)
        )

    def _check_new(self, digest: bytes, worker: bytes, step: int) -> None:
        seen = self._db.execute(
            "SELECT 1 FROM pending WHERE digest = ? UNION ALL SELECT 1 FROM judged WHERE digest = ?",
            (digest, digest),
        ).fetchone()
        if seen is not None:
            raise Ignore(Reason.DUPLICATE, f"submission {digest.hex()[:16]} was received before")
        taken = self._db.execute(
            "SELECT 1 FROM pending WHERE worker = ? AND step = ? UNION ALL"
            " SELECT 1 FROM judged WHERE worker = ? AND step = ? AND ignored = 0",
            (worker, _u64(step), worker, _u64(step)),
        ).fetchone()
        if taken is not None:
            raise Ignore(Reason.DUPLICATE, f"assignment step {step:#x} of this worker was submitted before")

    def pending(self) -> list[PendingItem]:
        """Every queued submission, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, digest, worker, step, checkpoint_version, received_ms, LENGTH(envelope)"
                " FROM pending ORDER BY id"
            ).fetchall()
        return [
            PendingItem(
                int(i),
                bytes(d),
                bytes(w),
                int.from_bytes(s, "big"),
                int.from_bytes(v, "big"),
                int(ms),
                int(n),
            )
            for i, d, w, s, v, ms, n in rows
        ]

    def pending_envelope(self, item_id: int) -> bytes:
        with self._lock:
            row = self._db.execute("SELECT envelope FROM pending WHERE id = ?", (item_id,)).fetchone()
        if row is None:
            raise KeyError(f"no pending submission {item_id}")
        return bytes(row[0])

    # --- judgements --------------------------------------------------------------------------------

    def decide(self, item: PendingItem, decided: Decided, *, decided_ms: int) -> None:
        """Record the decision on a pending submission durably (one transaction), before its ledger write.
        A submission no longer pending, or decided already, raises `KeyError`: it is decided once."""
        if decided.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome class {decided.outcome!r}")
        if (decided.outcome == "accepted") != (decided.status == ACCEPTED):
            raise ValueError("exactly the acceptances have status ACCEPTED")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if self._db.execute("SELECT 1 FROM pending WHERE id = ?", (item.id,)).fetchone() is None:
                    raise KeyError(f"no pending submission {item.id}")
                if self._db.execute("SELECT 1 FROM decided WHERE id = ?", (item.id,)).fetchone() is not None:
                    raise KeyError(f"pending submission {item.id} was decided already")
                self._db.execute(
                    "INSERT INTO decided"
                    " (id, outcome, status, tokens, verdict, sealed, full, cpu_s, decided_ms)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        item.id,
                        decided.outcome,
                        decided.status,
                        decided.tokens,
                        decided.verdict,
                        decided.sealed,
                        int(decided.full),
                        decided.cpu_s,
                        decided_ms,
                    ),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def decided(self) -> dict[int, Decided]:
        """The stored decisions of pending submissions (their ledger write and `finish` due), by id."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, outcome, status, tokens, verdict, sealed, full, cpu_s FROM decided ORDER BY id"
            ).fetchall()
        return {
            int(i): Decided(str(o), int(st), int(t), bytes(v), bytes(se), bool(f), float(c))
            for i, o, st, t, v, se, f, c in rows
        }

    def finish(
        self,
        item: PendingItem,
        *,
        status: int,
        tokens: int,
        verdict: bytes,
        submission: bytes | None,
        judged_ms: int,
        ignored: bool = False,
    ) -> int | None:
        """Move a judged submission out of the queue; an acceptance (`status` 0, with its submission
        envelope) is appended to the accepted log. `ignored`: the outcome was an `Ignore` (whatever its
        code), which leaves the assignment step free. A decided submission (`decide`) finishes with the
        verdict it was decided with, and its decision goes. Returns the accepted index, or None."""
        if (status == ACCEPTED) != (submission is not None):
            raise ValueError("exactly the accepted judgements carry their submission")
        if ignored and status == ACCEPTED:
            raise ValueError("an acceptance is not an ignore")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT sealed FROM decided WHERE id = ?", (item.id,)).fetchone()
                if row is not None and bytes(row[0]) != verdict:
                    raise ValueError(f"pending submission {item.id} was decided with another verdict")
                self._db.execute("DELETE FROM decided WHERE id = ?", (item.id,))
                self._db.execute("DELETE FROM pending WHERE id = ?", (item.id,))
                self._db.execute(
                    "INSERT INTO judged (digest, worker, step, status, tokens, verdict, judged_ms, ignored)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        item.digest,
                        item.worker,
                        _u64(item.step),
                        status,
                        tokens,
                        verdict,
                        judged_ms,
                        int(ignored),
                    ),
                )
                index = None
                if submission is not None:
                    cursor = self._db.execute(
                        "INSERT INTO accepted (digest, verdict, submission) VALUES (?, ?, ?)",
                        (item.digest, verdict, submission),
                    )
                    index = cursor.lastrowid
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            if index is not None:
                self._newest = index
        return index

    async def finish_async(
        self,
        item: PendingItem,
        *,
        status: int,
        tokens: int,
        verdict: bytes,
        submission: bytes | None,
        judged_ms: int,
        ignored: bool = False,
    ) -> int | None:
        """`finish` in a thread, then wake the long polls (call from the trio thread)."""
        index = await trio.to_thread.run_sync(
            lambda: self.finish(
                item,
                status=status,
                tokens=tokens,
                verdict=verdict,
                submission=submission,
                judged_ms=judged_ms,
                ignored=ignored,
            )
        )
        if index is not None:
            self._changed.set()
            self._changed = trio.Event()
        return index

    def judged_counts(self) -> JudgedCounts:
        with self._lock:
            rows = self._db.execute(
                "SELECT worker, status, ignored, COUNT(*) FROM judged GROUP BY worker, status, ignored"
            )
            per_worker: dict[bytes, dict[int, int]] = {}
            by_status: dict[int, int] = {}
            ignores: dict[int, int] = {}
            for worker, status, ignored, count in rows.fetchall():
                if ignored:
                    ignores[int(status)] = ignores.get(int(status), 0) + int(count)
                    continue
                mine = per_worker.setdefault(bytes(worker), {})
                mine[int(status)] = mine.get(int(status), 0) + int(count)
                by_status[int(status)] = by_status.get(int(status), 0) + int(count)
            tokens = self._db.execute(
                "SELECT COALESCE(SUM(tokens), 0) FROM judged WHERE status = ?", (ACCEPTED,)
            ).fetchone()[0]
        return JudgedCounts(by_status, ignores, per_worker, int(tokens))

    # --- the accepted log ----------------------------------------------------------------------------

    def after(self, cursor: int, limit: int, max_bytes: int) -> tuple[list[AcceptedRollout], int]:
        """Accepted items with index > `cursor`, oldest first: at most `limit`, and at most `max_bytes` of
        envelopes except that the first item always comes. Returns (items, newest index)."""
        if not 0 <= cursor <= MAX_CURSOR:
            raise Reject(Reason.OUT_OF_RANGE, f"cursor {cursor} is beyond any accepted index")
        with self._lock:
            newest = int(self._db.execute("SELECT COALESCE(MAX(idx), 0) FROM accepted").fetchone()[0])
            sizes = self._db.execute(
                "SELECT idx, LENGTH(verdict) + LENGTH(submission) FROM accepted WHERE idx > ?"
                " ORDER BY idx LIMIT ?",
                (cursor, limit),
            ).fetchall()
            last, total = None, 0
            for idx, size in sizes:
                if last is not None and total + size > max_bytes:
                    break
                last, total = idx, total + size
            if last is None:
                return [], newest
            rows = self._db.execute(
                "SELECT idx, verdict, submission FROM accepted WHERE idx > ? AND idx <= ? ORDER BY idx",
                (cursor, last),
            ).fetchall()
        return [AcceptedRollout(int(i), bytes(v), bytes(s)) for i, v, s in rows], newest

    async def wait_after(self, cursor: int, timeout_s: float) -> int:
        """Wait until something newer than `cursor` is accepted, or `timeout_s` passes; the newest index."""
        with trio.move_on_after(timeout_s):
            while self._newest <= cursor:
                await self._changed.wait()
        return self._newest
