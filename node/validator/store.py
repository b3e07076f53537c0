"""The validator's durable state (`AcceptedStore`): submissions queued for judgement, what was judged, what
was accepted, and the credits owed on the ledger.

One SQLite file (WAL, synchronous=FULL: a commit is on disk when it returns); its tables, the values of
their columns and the migration of an older file are in `store_schema`, the rows this class hands out in
`store_rows`.

Retention (`prune`): every table is bounded. `pending` and `decided` by the queue's caps; queued
`credits` by the validator (SUBMIT answers BUSY while too many wait for the ledger), settled ones below the
floor version are pruned. Rows of
assignments older than the floor version (a durable value that never goes down; the work sets it to the
newest version held minus the async window minus an audit horizon) are pruned from `judged` and
`accepted`, and `enqueue` refuses a submission below the floor as stale (203): a pruned assignment cannot
be reused. `judged` then holds at most `MAX_JUDGED_PER_ASSIGNMENT` rows per assignment of the retained
versions. The accepted log is further cut to a byte cap, oldest first, but only among the items every
trainer has pulled: an item a trainer has not pulled goes only when its version falls below the floor.

A judgement is decided (`decided`) before the ledger is written, and leaves `pending` and `decided` for
`judged` (and `accepted`) in one later transaction (`finish`): nothing is judged twice by this store,
nothing is lost. A crash between the two replays the ledger write (a slash) from the stored decision
after a restart (the ledger refuses a repeated slash: at least once, and the ledger makes it exactly
once) and finishes with the verdict sealed the first time. An acceptance writes nothing to the ledger
before `finish`: its credit is queued by `finish` itself and committed later, and a credit committed just
before a crash (not yet marked) is refused as a duplicate and dropped when it is sent again.

Every method is blocking and thread-safe (one lock around one connection): call them from
`trio.to_thread.run_sync`. `finish_async` and `wait_after` are the trio side: a finished acceptance
wakes the long polls waiting for something newer than their cursor.

Why one class, in a module of ~600 lines: its transactions cross the tables. `enqueue` checks `pending`
and `judged` under one write lock; `finish` moves a submission from `pending` and `decided` to `judged`,
`accepted` and `credits` in one commit (what makes a crash lose or double nothing); `prune` raises the
floor and cuts `judged`, `pruned`, `accepted` and `credits` together. One connection behind one lock
carries them; split into a class per table, those transactions would have to be reassembled across
objects. What is not a transaction (the schema, the migration, the row types) lives in the two modules
above.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from pathlib import Path

import trio

from swarmnode.node.validator.store_rows import (
    CreditCounts,
    Decided,
    JudgedCounts,
    PendingItem,
    Pruned,
    RunCredit,
    StoreStatistics,
)
from swarmnode.node.validator.store_schema import (
    ACCEPTED,
    CREDIT_COMMITTED,
    CREDIT_DROPPED,
    CREDIT_QUEUED,
    FLOOR_KEY,
    JUDGED_INDEX,
    OUTCOMES,
    SCHEMA,
    SECRET_KEY,
    migrate,
    u64,
)
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.ledger_messages import Credit
from swarmnode.protocol.messages import AcceptedRollout
from swarmnode.protocol.runs import step_version

MAX_CURSOR = 2**63 - 1  # accepted indices are SQLite INTEGERs
MAX_JUDGED_PER_ASSIGNMENT = 4  # judgements of one (worker, step): a verdict, or ignores and then a verdict


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
        migrate(self._db)
        self._db.executescript(JUDGED_INDEX)
        self._newest = self._newest_index()
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (FLOOR_KEY,)).fetchone()
        self._floor = int.from_bytes(row[0], "big") if row is not None else 0
        self._changed = trio.Event()

    def _newest_index(self) -> int:
        """The last index ever given (AUTOINCREMENT's counter): pruning the log never lowers it."""
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'accepted'").fetchone()
        return int(row[0]) if row is not None else 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def newest(self) -> int:
        """The newest accepted index (0 while nothing was accepted)."""
        return self._newest

    @property
    def floor(self) -> int:
        """The oldest version whose assignments are kept: older ones are refused as stale and pruned."""
        return self._floor

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
        """Queue a submission durably. Refused: `Ignore` STALE below the floor version, DUPLICATE if this
        submission was received before, `Reject` ASSIGNMENT_REUSED if another one for the same assignment
        step is queued or was judged with a verdict (or judged `MAX_JUDGED_PER_ASSIGNMENT` times), `Ignore`
        NOT_FOR_US if the queue is full or the worker already has `max_per_worker` submissions queued."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if min(checkpoint_version, step_version(step)) < self._floor:
                    raise Ignore(
                        Reason.STALE, f"version {checkpoint_version} is below the retained v{self._floor}"
                    )
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
                    (digest, worker, u64(step), u64(checkpoint_version), received_ms, envelope),
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
        holder = self._holder(worker, step, digest)
        if holder is not None:
            raise Reject(
                Reason.ASSIGNMENT_REUSED,
                f"assignment step {step:#x} of this worker is held by submission {holder.hex()[:16]}",
            )
        (tries,) = self._db.execute(
            "SELECT COUNT(*) FROM judged WHERE worker = ? AND step = ?", (worker, u64(step))
        ).fetchone()
        if tries >= MAX_JUDGED_PER_ASSIGNMENT:
            raise Reject(Reason.ASSIGNMENT_REUSED, f"assignment step {step:#x} was judged {tries} times")

    def _holder(self, worker: bytes, step: int, digest: bytes) -> bytes | None:
        """Another submission that holds the assignment: queued, or judged with a verdict."""
        row = self._db.execute(
            "SELECT digest FROM pending WHERE worker = ? AND step = ? AND digest != ? UNION ALL"
            " SELECT digest FROM judged WHERE worker = ? AND step = ? AND digest != ? AND ignored = 0"
            " AND status != ?",
            (worker, u64(step), digest, worker, u64(step), digest, int(Reason.ASSIGNMENT_REUSED)),
        ).fetchone()
        return None if row is None else bytes(row[0])

    def reused(self, item: PendingItem) -> bytes | None:
        """The digest of another submission that holds `item`'s assignment, checked again when judging."""
        with self._lock:
            return self._holder(item.worker, item.step, item.digest)

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
        credit: RunCredit | None = None,
    ) -> int | None:
        """Move a judged submission out of the queue; an acceptance (`status` 0, with its submission
        envelope) is appended to the accepted log, and its `credit` (with a ledger) queued for the
        committer. `ignored`: the outcome was an `Ignore` (whatever its code), which leaves the assignment
        step free. A decided submission (`decide`) finishes with the verdict it was decided with, and its
        decision goes. Returns the accepted index, or None."""
        if (status == ACCEPTED) != (submission is not None):
            raise ValueError("exactly the accepted judgements carry their submission")
        if ignored and status == ACCEPTED:
            raise ValueError("an acceptance is not an ignore")
        if credit is not None and (
            status != ACCEPTED or (credit.credit.worker, credit.credit.step) != (item.worker, item.step)
        ):
            raise ValueError("a credit is owed for an acceptance, to its worker, for its assignment")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT sealed FROM decided WHERE id = ?", (item.id,)).fetchone()
                if row is not None and bytes(row[0]) != verdict:
                    raise ValueError(f"pending submission {item.id} was decided with another verdict")
                self._db.execute("DELETE FROM decided WHERE id = ?", (item.id,))
                self._db.execute("DELETE FROM pending WHERE id = ?", (item.id,))
                self._insert_judged(item, status, tokens, verdict, judged_ms, ignored)
                index = None
                if submission is not None:
                    cursor = self._db.execute(
                        "INSERT INTO accepted (digest, verdict, submission, version) VALUES (?, ?, ?, ?)",
                        (item.digest, verdict, submission, step_version(item.step)),
                    )
                    index = cursor.lastrowid
                if credit is not None:
                    self._insert_credit(credit)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            if index is not None:
                self._newest = index
        return index

    def _insert_credit(self, owed: RunCredit) -> None:
        c = owed.credit
        version = step_version(c.step)
        self._db.execute(
            "INSERT INTO credits (run, worker, step, version, tokens, flops, rollout_digest)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (owed.run, c.worker, u64(c.step), version, c.tokens, u64(c.flops), c.rollout_digest),
        )

    def _insert_judged(
        self, item: PendingItem, status: int, tokens: int, verdict: bytes, judged_ms: int, ignored: bool
    ) -> None:
        self._db.execute(
            "INSERT INTO judged (digest, worker, step, status, tokens, verdict, judged_ms, ignored, version)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                item.digest,
                item.worker,
                u64(item.step),
                status,
                tokens,
                verdict,
                judged_ms,
                int(ignored),
                step_version(item.step),
            ),
        )

    def quarantine(self, item: PendingItem, *, status: int, judged_ms: int) -> None:
        """Take `item` out of the queue as an ignore with code `status` (JUDGE_FAULT), whatever its state:
        decided or not. For an item the judge failed on: it must never block the queue again. The ignore
        leaves the assignment free (a second credit for it is the ledger's to refuse)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM decided WHERE id = ?", (item.id,))
                self._db.execute("DELETE FROM pending WHERE id = ?", (item.id,))
                self._insert_judged(item, status, 0, b"", judged_ms, True)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

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
        credit: RunCredit | None = None,
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
                credit=credit,
            )
        )
        if index is not None:
            self._changed.set()
            self._changed = trio.Event()
        return index

    def judged_counts(self) -> JudgedCounts:
        """Outcome counts of every judgement (pruned ones included); per worker, of the retained ones."""
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
            for status, ignored, count in self._db.execute("SELECT status, ignored, count FROM pruned"):
                counts = ignores if ignored else by_status
                counts[int(status)] = counts.get(int(status), 0) + int(count)
            tokens = self._db.execute(
                "SELECT (SELECT COALESCE(SUM(tokens), 0) FROM judged WHERE status = ?)"
                " + (SELECT COALESCE(SUM(tokens), 0) FROM pruned WHERE status = ?)",
                (ACCEPTED, ACCEPTED),
            ).fetchone()[0]
        return JudgedCounts(by_status, ignores, per_worker, int(tokens))

    # --- credits owed on the ledger ------------------------------------------------------------------

    def queued_credits(self, run: str, limit: int) -> list[Credit]:
        """The oldest `limit` credits of `run` still to commit, in a batch's order: by (worker, step)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT worker, step, tokens, flops, rollout_digest FROM credits"
                " WHERE state = ? AND run = ? ORDER BY id LIMIT ?",
                (CREDIT_QUEUED, run, limit),
            ).fetchall()
        credits = [
            Credit(bytes(w), int.from_bytes(s, "big"), int(t), int.from_bytes(f, "big"), bytes(d))
            for w, s, t, f, d in rows
        ]
        return sorted(credits, key=lambda c: (c.worker, c.step))

    def settle_credits(self, run: str, settled: list[tuple[Credit, str]], *, committed: bool) -> int:
        """Mark queued credits committed (`detail` ""), or dropped with the reason each was dropped for,
        in one transaction. Credits no longer queued are left alone; returns how many were marked."""
        state = CREDIT_COMMITTED if committed else CREDIT_DROPPED
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                marked = 0
                for credit, detail in settled:
                    marked += self._db.execute(
                        "UPDATE credits SET state = ?, detail = ?"
                        " WHERE run = ? AND worker = ? AND step = ? AND state = ?",
                        (state, detail, run, credit.worker, u64(credit.step), CREDIT_QUEUED),
                    ).rowcount
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return marked

    def credit_counts(self) -> CreditCounts:
        with self._lock:
            rows = dict(self._db.execute("SELECT state, COUNT(*) FROM credits GROUP BY state").fetchall())
        return CreditCounts(
            queued=int(rows.get(CREDIT_QUEUED, 0)),
            committed=int(rows.get(CREDIT_COMMITTED, 0)),
            dropped=int(rows.get(CREDIT_DROPPED, 0)),
        )

    # --- retention -----------------------------------------------------------------------------------

    def prune(self, *, floor: int, max_accepted_bytes: int, pulled: int) -> Pruned:
        """Drop what no one needs any more, in one transaction (see the module docstring):
        - raise the floor version to `floor` (it never goes down); judged and accepted rows of versions
          below it go (judged ones into the `pruned` counts), and settled credits;
        - then accepted items with index <= `pulled` (what every trainer has pulled), oldest first, while
          the log holds more than `max_accepted_bytes`."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                new_floor = max(self._floor, floor)
                self._db.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (FLOOR_KEY, u64(new_floor)),
                )
                self._db.execute(
                    "INSERT INTO pruned (status, ignored, count, tokens)"
                    " SELECT status, ignored, COUNT(*), SUM(tokens) FROM judged WHERE version < ?"
                    " GROUP BY status, ignored"
                    " ON CONFLICT (status, ignored) DO UPDATE"
                    " SET count = count + excluded.count, tokens = tokens + excluded.tokens",
                    (new_floor,),
                )
                judged = self._db.execute("DELETE FROM judged WHERE version < ?", (new_floor,)).rowcount
                stale = self._db.execute("DELETE FROM accepted WHERE version < ?", (new_floor,)).rowcount
                self._db.execute(  # settled credits only: a queued one waits for the ledger, whatever its age
                    "DELETE FROM credits WHERE version < ? AND state != ?", (new_floor, CREDIT_QUEUED)
                )
                over = self._accepted_bytes() - max_accepted_bytes
                cut = 0
                if over > 0:
                    rows = self._db.execute(
                        "SELECT idx, LENGTH(verdict) + LENGTH(submission) FROM accepted WHERE idx <= ?"
                        " ORDER BY idx",
                        (pulled,),
                    )
                    last = None
                    for idx, size in rows:
                        if over <= 0:
                            break
                        last, over, cut = idx, over - size, cut + 1
                    if last is not None:
                        self._db.execute("DELETE FROM accepted WHERE idx <= ?", (last,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._floor = new_floor
        return Pruned(floor=new_floor, judged=judged, accepted=stale + cut)

    def _accepted_bytes(self) -> int:
        return int(
            self._db.execute(
                "SELECT COALESCE(SUM(LENGTH(verdict) + LENGTH(submission)), 0) FROM accepted"
            ).fetchone()[0]
        )

    def statistics(self) -> StoreStatistics:
        """Rows of each table and the bytes of the queue and the accepted log."""
        with self._lock:
            (pending, pending_bytes) = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(envelope)), 0) FROM pending"
            ).fetchone()
            (decided,) = self._db.execute("SELECT COUNT(*) FROM decided").fetchone()
            (judged,) = self._db.execute("SELECT COUNT(*) FROM judged").fetchone()
            (accepted,) = self._db.execute("SELECT COUNT(*) FROM accepted").fetchone()
            (credits_queued,) = self._db.execute(
                "SELECT COUNT(*) FROM credits WHERE state = ?", (CREDIT_QUEUED,)
            ).fetchone()
            accepted_bytes = self._accepted_bytes()
        return StoreStatistics(
            pending=int(pending),
            pending_bytes=int(pending_bytes),
            decided=int(decided),
            judged=int(judged),
            accepted=int(accepted),
            accepted_bytes=accepted_bytes,
            floor=self._floor,
            credits_queued=int(credits_queued),
        )

    # --- the accepted log ----------------------------------------------------------------------------

    def after(self, cursor: int, limit: int, max_bytes: int) -> tuple[list[AcceptedRollout], int]:
        """Accepted items with index > `cursor`, oldest first: at most `limit`, and at most `max_bytes` of
        envelopes except that the first item always comes. Returns (items, newest index)."""
        if not 0 <= cursor <= MAX_CURSOR:
            raise Reject(Reason.OUT_OF_RANGE, f"cursor {cursor} is beyond any accepted index")
        with self._lock:
            newest = self._newest_index()
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
