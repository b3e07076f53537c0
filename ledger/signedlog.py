"""SignedLog: the embedded ledger backend, an append-only signed log in one SQLite file.

Durability: WAL journal, `synchronous=FULL` (each commit fsyncs the WAL), one `BEGIN IMMEDIATE`
transaction per append holding the entry, its author's seal and the new signed head; an append returns
(is acknowledged) only after its commit, so a crash loses no acknowledged entry and never leaves an
entry without its head (or a head without its entry). The state is never stored, only derived by
replaying entries through `ledger.log`, so a copy of the file is audited by replaying it (`verify`).
Several processes may append to one file: the immediate transaction serialises them and each catches up
on entries it has not seen before its own.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.merkle import inclusion_proof, is_included, merkle_root
from swarmnode.ledger.batches import CreditProof, credit_proof, credits_of
from swarmnode.ledger.errors import BackendError, CorruptLog, LedgerError, MalformedOperation, TruncatedLog
from swarmnode.ledger.log import (
    AppliedEntry,
    Checkpoint,
    LogState,
    SignedHead,
    apply_entry,
    check_head,
    checkpoint_at,
    epoch_at,
    genesis_hash,
    make_entry,
    make_genesis,
    new_log_state,
    next_nonce,
    seal_entry,
    sign_head,
    sign_operation,
)
from swarmnode.ledger.state import (
    Operation,
    filter_contributions,
    filter_slashes,
    query_nodes,
    query_stakes,
    snapshot,
    stake_info,
)
from swarmnode.ledger.types import (
    BatchRecord,
    ContributionRecord,
    NodeInfo,
    Params,
    Receipt,
    RunInfo,
    SlashRecord,
    Snapshot,
    StakeInfo,
    WorkerTotal,
)
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.errors import Reject
from swarmnode.protocol.ledger_messages import (
    CommitCredits,
    ComputeSpec,
    FinalizeSlash,
    LedgerGenesis,
    RegisterNode,
    RegisterRun,
    SetRunValidators,
    Slash,
    StakeDeposit,
    StakeUnbond,
    StakeWithdraw,
    VoidSlash,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS entries (idx INTEGER PRIMARY KEY, hash BLOB NOT NULL, epoch INTEGER NOT NULL,
                                    seal BLOB NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (epoch INTEGER PRIMARY KEY, size INTEGER NOT NULL, root BLOB NOT NULL);
"""
FORMAT_VERSION = b"swarmnode-signed-log/3"  # /3: body-hash envelope digests, runs, batches, pending slashes
ROWS = "SELECT idx, CAST(hash AS BLOB), epoch, CAST(seal AS BLOB), CAST(data AS BLOB) FROM entries"


@dataclass(frozen=True)
class InclusionProof:
    """Entry `index` (by its hash) is leaf `index` of the `size`-entry tree with head `root`."""

    index: int
    size: int
    entry_hash: bytes
    path: tuple[bytes, ...]
    root: bytes

    def verify(self) -> bool:
        return is_included(self.entry_hash, self.index, self.size, list(self.path), self.root)


@dataclass(frozen=True)
class VerifyReport:
    entries: int
    head: bytes
    root: bytes
    checkpoints: int
    error: LedgerError | None
    signed_head: SignedHead | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def truncated(self) -> bool:
        return isinstance(self.error, TruncatedLog)

    @property
    def first_bad(self) -> int | None:
        if self.error is None:
            return None
        return self.error.index if isinstance(self.error, CorruptLog) else self.entries


def _connect(path: Path) -> sqlite3.Connection:
    """One connection per SignedLog; callers may use it from a worker thread (the validator calls it
    through `trio.to_thread`), one call at a time: the SignedLog is not itself thread-safe."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # every commit fsyncs the WAL: acknowledged means durable
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def _read_genesis(conn: sqlite3.Connection) -> LedgerGenesis:
    try:
        rows = dict(conn.execute("SELECT key, CAST(value AS BLOB) FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise CorruptLog(None, f"no readable log header: {exc}") from None
    if rows.get("format") != FORMAT_VERSION:
        raise CorruptLog(None, f"not a swarmnode signed log (format {rows.get('format')!r})")
    try:
        return decode(LedgerGenesis, rows["genesis"])
    except (KeyError, Reject) as exc:
        raise CorruptLog(None, f"genesis record is missing or malformed: {exc}") from None


def _read_head(conn: sqlite3.Connection) -> SignedHead | None:
    row = conn.execute("SELECT CAST(value AS BLOB) FROM meta WHERE key = 'head'").fetchone()
    if row is None:
        return None
    try:
        return decode(SignedHead, row[0])
    except Reject as exc:
        raise CorruptLog(None, f"the signed head is malformed: {exc.detail}") from None


class SignedLog:
    """The signed-log `Ledger`. Create with `SignedLog.create`, reopen with `SignedLog.open`."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        log: LogState,
        *,
        epochs: Callable[[], int] | None = None,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self._conn = conn
        self._log = log
        genesis = log.genesis
        self._epochs = epochs or (lambda: epoch_at(genesis, time.time()))
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))

    # --- lifecycle -----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: Path,
        params: Params,
        *,
        ledger_id: str = "default",
        genesis_time_s: int | None = None,
        epochs: Callable[[], int] | None = None,
        now_ms: Callable[[], int] | None = None,
    ) -> SignedLog:
        """A new, empty log; refuses to touch an existing file."""
        if Path(path).exists():
            raise FileExistsError(f"{path} already exists; open it instead")
        genesis = make_genesis(
            ledger_id, params, int(time.time()) if genesis_time_s is None else genesis_time_s
        )
        conn = _connect(Path(path))
        conn.executescript(SCHEMA)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO meta VALUES ('format', ?), ('genesis', ?)", (FORMAT_VERSION, encode(genesis))
        )
        conn.execute("COMMIT")
        return cls(conn, new_log_state(genesis), epochs=epochs, now_ms=now_ms)

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        audit: bool = False,
        epochs: Callable[[], int] | None = None,
        now_ms: Callable[[], int] | None = None,
    ) -> SignedLog:
        """Open and replay a log. `audit=True` also re-checks every signature (what `verify` does)."""
        if not Path(path).exists():
            raise FileNotFoundError(f"no signed log at {path}; create one with `swarmnode ledger deploy`")
        try:
            conn = _connect(Path(path))
        except sqlite3.DatabaseError as exc:
            raise CorruptLog(None, f"{path} is not a readable SQLite database: {exc}") from None
        try:
            genesis = _read_genesis(conn)
        except CorruptLog:
            conn.close()
            raise
        ledger = cls(conn, new_log_state(genesis), epochs=epochs, now_ms=now_ms)
        try:
            ledger._catch_up(check_signatures=audit)
        except BaseException:
            conn.close()
            raise
        return ledger

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SignedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- appending -----------------------------------------------------------------------------

    @property
    def ledger_id(self) -> str:
        return self._log.genesis.ledger_id

    @property
    def genesis(self) -> LedgerGenesis:
        return self._log.genesis

    @property
    def params(self) -> Params:
        return self._log.ledger.params

    def current_epoch(self) -> int:
        """The host's clock epoch, never before the last entry's (an entry's epoch never goes back)."""
        return max(self._epochs(), self._log.last_epoch)

    def nonce_of(self, address: bytes) -> int:
        return next_nonce(self._log, address)

    def sign(self, identity: NodeIdentity, op: Operation) -> bytes:
        """Sign `op` for this ledger at the author's next nonce (what a remote author would gossip)."""
        try:
            return sign_operation(
                identity,
                op,
                ledger_id=self.ledger_id,
                nonce=self.nonce_of(identity.address),
                ts_ms=self._now_ms(),
            )
        except Reject as exc:  # the codec validates every field before signing
            raise MalformedOperation(exc.detail) from None

    def append_envelope(self, op_envelope: bytes, author: NodeIdentity) -> AppliedEntry:
        """Append an operation its author signed beforehand (offline, in a batch); the author's key seals
        the entry and signs the new head, so a key that did not sign the operation cannot append it
        (`BadSignature`). Durable when this returns. Refusals change nothing."""
        return self._append(lambda: op_envelope, author)

    def submit(self, identity: NodeIdentity, op: Operation) -> Receipt:
        """Sign `op` at the author's next nonce (known only after catching up) and append it."""
        applied = self._append(lambda: self.sign(identity, op), identity)
        return Receipt(applied.index, applied.entry_hash, applied.epoch)

    def _append(self, make_envelope: Callable[[], bytes], author: NodeIdentity) -> AppliedEntry:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise BackendError(f"cannot lock the log: {exc}") from exc
        try:
            self._catch_up_locked(check_signatures=False)
            data = make_entry(self._log, make_envelope(), self.current_epoch())
            seal = seal_entry(author, self.ledger_id, self._log.size, sha256(data))
            applied = apply_entry(self._log, data, seal=seal)
            head = sign_head(author, self.ledger_id, self._log.size, applied.entry_hash)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        try:
            self._conn.execute(
                "INSERT INTO entries (idx, hash, epoch, seal, data) VALUES (?, ?, ?, ?, ?)",
                (applied.index, applied.entry_hash, applied.epoch, seal, data),
            )
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('head', ?)", (encode(head),))
            if applied.closed is not None:
                c = applied.closed
                self._conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?)", (c.epoch, c.size, c.root))
            self._conn.execute("COMMIT")
        except BaseException as exc:
            # The in-memory state already moved on; put it back by replaying what is on disk.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            self._reload()
            if isinstance(exc, sqlite3.Error):
                raise BackendError(f"append failed, nothing was written: {exc}") from exc
            raise
        return applied

    # --- the Ledger operations -----------------------------------------------------------------

    def register(
        self, identity: NodeIdentity, role: str, compute: ComputeSpec, peer_id: str | None = None
    ) -> Receipt:
        return self.submit(
            identity, RegisterNode(role, compute, identity.peer_id if peer_id is None else peer_id)
        )

    def deposit(self, identity: NodeIdentity, amount_gwei: int) -> Receipt:
        return self.submit(identity, StakeDeposit(amount_gwei))

    def unbond(self, identity: NodeIdentity, amount_gwei: int) -> Receipt:
        return self.submit(identity, StakeUnbond(amount_gwei))

    def withdraw(self, identity: NodeIdentity) -> Receipt:
        return self.submit(identity, StakeWithdraw())

    def register_run(self, identity: NodeIdentity, op: RegisterRun) -> Receipt:
        return self.submit(identity, op)

    def set_run_validators(self, identity: NodeIdentity, op: SetRunValidators) -> Receipt:
        return self.submit(identity, op)

    def commit_credits(self, identity: NodeIdentity, op: CommitCredits) -> Receipt:
        return self.submit(identity, op)

    def slash(self, identity: NodeIdentity, op: Slash) -> Receipt:
        return self.submit(identity, op)

    def void_slash(self, identity: NodeIdentity, slash_index: int) -> Receipt:
        return self.submit(identity, VoidSlash(slash_index))

    def finalize_slash(self, identity: NodeIdentity, slash_index: int) -> Receipt:
        return self.submit(identity, FinalizeSlash(slash_index))

    # --- queries -------------------------------------------------------------------------------

    def node(self, address: bytes) -> NodeInfo | None:
        state = self._log.ledger.nodes.get(address)
        return None if state is None else state.info

    def nodes(self) -> list[NodeInfo]:
        return query_nodes(self._log.ledger)

    def stake(self, address: bytes) -> StakeInfo | None:
        state = self._log.ledger.nodes.get(address)
        return None if state is None else stake_info(self.params, state)

    def stakes(self) -> list[StakeInfo]:
        return query_stakes(self._log.ledger)

    def contributions(self, node: bytes | None = None, run: str | None = None) -> list[ContributionRecord]:
        return filter_contributions(self._log.ledger.contributions, node, run)

    def slashes(self, node: bytes | None = None) -> list[SlashRecord]:
        return filter_slashes(self._log.ledger.slashes, node)

    def run(self, run: str) -> RunInfo | None:
        return self._log.ledger.runs.get(run)

    def runs(self) -> list[RunInfo]:
        return list(self._log.ledger.runs.values())

    def batches(self, run: str | None = None) -> list[BatchRecord]:
        return [b for b in self._log.ledger.batches if run is None or b.run == run]

    def totals(self, run: str | None = None) -> list[WorkerTotal]:
        return [t for t in self._log.ledger.totals.values() if run is None or t.run == run]

    def is_credited(self, run: str, worker: bytes, step: int) -> bool:
        return (run, worker, step) in self._log.ledger.assignments

    def prove_credit(self, contribution: int) -> CreditProof:
        """The inclusion proof of one credited contribution in its validator's batch (IndexError if none)."""
        ledger = self._log.ledger
        record = ledger.contributions[contribution]
        batch = ledger.batches[record.batch]
        members = ledger.contributions[batch.first_contribution : batch.first_contribution + batch.count]
        return credit_proof(contribution, batch, credits_of(members))

    def check_credit_proof(self, proof: CreditProof) -> bool:
        """The proof verifies and names a batch of this log with that root, run and validator."""
        batches = self._log.ledger.batches
        if not 0 <= proof.batch < len(batches):
            return False
        batch = batches[proof.batch]
        return (
            proof.verify()
            and (batch.root, batch.run, batch.validator, batch.count)
            == (proof.root, proof.run, proof.validator, proof.count)
        )

    def is_eligible(self, address: bytes) -> bool:
        stake = self.stake(address)
        return stake is not None and stake.eligible

    def snapshot(self) -> Snapshot:
        return snapshot(self._log.ledger, self.current_epoch())

    # --- log-specific ----------------------------------------------------------------------------

    def size(self) -> int:
        return self._log.size

    def head(self) -> bytes:
        """Hash of the last entry (the genesis hash for an empty log)."""
        return self._log.head

    def merkle_root(self) -> bytes:
        return self._log.tree.root()

    def checkpoint(self, epoch: int) -> Checkpoint:
        return checkpoint_at(self._log, epoch)

    def checkpoints(self) -> list[Checkpoint]:
        return list(self._log.checkpoints)

    def entry(self, index: int) -> bytes:
        row = self._conn.execute("SELECT data FROM entries WHERE idx = ?", (index,)).fetchone()
        if row is None:
            raise IndexError(f"no entry {index} in a log of {self._log.size}")
        return bytes(row[0])

    def prove(self, index: int, size: int | None = None) -> InclusionProof:
        """Inclusion proof of entry `index` in the tree of the first `size` entries (default: all)."""
        size = self._log.size if size is None else size
        if not 0 <= index < size <= self._log.size:
            raise IndexError(f"cannot prove entry {index} in a tree of {size} (log has {self._log.size})")
        hashes = [
            bytes(h)
            for (h,) in self._conn.execute("SELECT hash FROM entries WHERE idx < ? ORDER BY idx", (size,))
        ]
        root = merkle_root(hashes)
        return InclusionProof(index, size, hashes[index], tuple(inclusion_proof(hashes, index)), root)

    def iter_entries(self) -> Iterator[bytes]:
        for (data,) in self._conn.execute("SELECT data FROM entries ORDER BY idx"):
            yield bytes(data)

    def refresh(self) -> None:
        """Apply entries other processes appended since this handle last looked (appends do this anyway)."""
        self._catch_up(check_signatures=False)

    # --- internals -----------------------------------------------------------------------------

    def _catch_up(self, *, check_signatures: bool) -> None:
        self._conn.execute("BEGIN")
        try:
            self._catch_up_locked(check_signatures=check_signatures)
        finally:
            self._conn.execute("COMMIT")

    def _catch_up_locked(self, *, check_signatures: bool) -> None:
        """Apply entries another process (or an earlier session) appended since our last look, then
        hold them to the signed head read in the same transaction: a truncated file is refused here,
        before an append could sign a new head over the loss."""
        rows = self._conn.execute(f"{ROWS} WHERE idx >= ? ORDER BY idx", (self._log.size,))
        for row in rows:
            replay_row(self._log, row, check_signatures=check_signatures)
        check_head(self._log, _read_head(self._conn), check_signature=check_signatures)

    def _reload(self) -> None:
        self._log = new_log_state(self._log.genesis)
        self._catch_up(check_signatures=False)


def replay_row(
    log: LogState, row: tuple[object, object, object, object, object], *, check_signatures: bool
) -> AppliedEntry:
    """Apply one stored row, or raise CorruptLog naming it; the log state is unchanged on error."""
    idx, stored_hash, epoch, seal, data = row
    if idx != log.size:
        raise CorruptLog(log.size, f"entry {log.size} is missing (next stored is {idx})")
    if not (isinstance(data, bytes) and isinstance(stored_hash, bytes) and isinstance(seal, bytes)):
        raise CorruptLog(log.size, "entry, hash or seal column is not a blob")
    if not isinstance(epoch, int):
        raise CorruptLog(log.size, "epoch column is not an integer")
    if sha256(data) != stored_hash:
        raise CorruptLog(log.size, "stored hash column does not match the entry bytes")
    try:
        return apply_entry(log, data, seal=seal, stored_epoch=epoch, check_signatures=check_signatures)
    except CorruptLog:
        raise
    except LedgerError as exc:
        raise CorruptLog(log.size, str(exc)) from None


def verify_log(path: Path) -> VerifyReport:
    """Audit a log file end to end: hash chain, every signature and rule, and the stored checkpoints.

    Names the first bad entry; never trusts anything derived (the state is rebuilt from genesis).
    """
    try:
        conn = _connect(Path(path))
    except sqlite3.DatabaseError as exc:
        return VerifyReport(0, b"", b"", 0, CorruptLog(None, f"not a readable SQLite database: {exc}"))
    try:
        try:
            genesis = _read_genesis(conn)
        except CorruptLog as exc:
            return VerifyReport(0, b"", b"", 0, exc)
        log = new_log_state(genesis)
        error: LedgerError | None = None
        head: SignedHead | None = None
        for row in conn.execute(f"{ROWS} ORDER BY idx"):
            try:
                replay_row(log, row, check_signatures=True)
            except CorruptLog as exc:
                error = exc
                break
        if error is None:  # the end of the log: is it where its last author signed it ended?
            try:
                head = _read_head(conn)
                check_head(log, head, check_signature=True)
            except CorruptLog as exc:
                error = exc
        stored = [
            Checkpoint(e, s, bytes(r))
            for e, s, r in conn.execute(
                "SELECT epoch, size, CAST(root AS BLOB) FROM checkpoints ORDER BY epoch"
            )
        ]
        if error is None and stored != log.checkpoints:
            error = CorruptLog(
                None,
                f"stored checkpoints differ from the replayed ones ({len(stored)} vs {len(log.checkpoints)})",
            )
        return VerifyReport(log.size, log.head, log.tree.root(), len(log.checkpoints), error, head)
    finally:
        conn.close()


__all__ = ["InclusionProof", "SignedLog", "VerifyReport", "genesis_hash", "verify_log"]
