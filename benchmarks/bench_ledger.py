"""Ledger throughput: signed-log appends and full-replay verification against raw SQLite, and EVM on anvil.

    python benchmarks/bench_ledger.py [--entries N] [--evm-records M]

Signed log: N contribution entries, each signed by the validator and citing the validator's signed verdict,
appended one durable transaction at a time (signature checks, state machine, WAL fsync); then `verify_log`
replays the file from genesis re-checking every signature. Baseline, in the same run and the same
SQLite settings (WAL, synchronous=FULL, one transaction per row): raw inserts of the very same rows.
EVM: M contribution records on a local anvil (sequential, each waiting for its receipt), skipped with a
note if anvil is not installed (scripts/install_anvil.sh). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crypto.hashing import sha256  # noqa: E402
from ledger import testing as T  # noqa: E402
from ledger.log import sign_operation  # noqa: E402
from ledger.signedlog import SCHEMA, SignedLog, verify_log  # noqa: E402
from ledger.types import Params  # noqa: E402
from protocol.codec import decode  # noqa: E402
from protocol.ledger_messages import LedgerEntry  # noqa: E402

PARAMS = Params(
    min_stake_per_unit_gwei=1_000,
    unbonding_delay_epochs=2,
    slash_gwei=400,
    ejection_threshold=3,
    epoch_seconds=3_600,
)


def bench_signed_log(directory: Path, entries: int) -> dict[str, float]:
    validator, worker = T.identity("bench-val"), T.identity("bench-w")
    log = SignedLog.create(directory / "bench.db", PARAMS, ledger_id="bench", epochs=lambda: 0)
    for who, role in ((validator, "validator"), (worker, "worker")):
        log.register(who, role, T.compute())
        log.deposit(who, 1_000)
    first_nonce = log.nonce_of(validator.address)
    envelopes = [
        sign_operation(
            validator,
            T.contribution(validator, worker, nonce=i),
            ledger_id="bench",
            nonce=first_nonce + i,
            ts_ms=0,
        )
        for i in range(entries)
    ]
    start = time.perf_counter()
    for envelope in envelopes:
        log.append_envelope(envelope, validator)
    append_s = time.perf_counter() - start
    rows = [
        (i, sha256(data), decode(LedgerEntry, data).epoch, bytes(65), data) for i, data in enumerate(log.iter_entries())
    ]
    total = log.size()
    log.close()

    start = time.perf_counter()
    report = verify_log(directory / "bench.db")
    verify_s = time.perf_counter() - start
    assert report.ok and report.entries == total, report.error

    start = time.perf_counter()
    SignedLog.open(directory / "bench.db").close()
    open_s = time.perf_counter() - start

    raw = sqlite3.connect(directory / "raw.db", isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=FULL")
    raw.executescript(SCHEMA)
    start = time.perf_counter()
    for row in rows[-entries:]:
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("INSERT INTO entries (idx, hash, epoch, seal, data) VALUES (?, ?, ?, ?, ?)", row)
        raw.execute("COMMIT")
    raw_s = time.perf_counter() - start
    raw.close()

    entry_bytes = sum(len(r[4]) for r in rows) / len(rows)
    return {
        "signed_log_entries": entries,
        "signed_log_entry_bytes": round(entry_bytes),
        "signed_log_appends_per_s": entries / append_s,
        "signed_log_verify_entries_per_s": total / verify_s,
        "signed_log_open_replay_entries_per_s": total / open_s,
        "raw_sqlite_inserts_per_s": entries / raw_s,
    }


def bench_evm(records: int) -> dict[str, float | str | None]:
    binary = T.find_anvil()
    if binary is None:
        return {
            "evm_anvil_contributions_per_s": None,
            "evm_anvil_note": "skipped: anvil not installed (run scripts/install_anvil.sh)",
        }
    with T.AnvilProcess(binary) as node:
        harness = T.EvmHarness.anvil(node.url, PARAMS)
        validator, worker = T.identity("bench-val"), T.identity("bench-w")
        harness.fund(validator, worker)
        for who, role in ((validator, "validator"), (worker, "worker")):
            harness.ledger.register(who, role, T.compute())
            harness.ledger.deposit(who, 1_000)
        ops = [T.contribution(validator, worker, nonce=i) for i in range(records)]
        start = time.perf_counter()
        for op in ops:
            harness.ledger.record_contribution(validator, op)
        elapsed = time.perf_counter() - start
        assert len(harness.ledger.contributions()) == records
    return {"evm_anvil_contributions": records, "evm_anvil_contributions_per_s": records / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=2_000)
    parser.add_argument("--evm-records", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as tmp:
        result: dict[str, object] = dict(bench_signed_log(Path(tmp), args.entries))
    result.update(bench_evm(args.evm_records))
    raw = float(result["raw_sqlite_inserts_per_s"])  # type: ignore[arg-type]
    result["signed_log_append_vs_raw_insert_ratio"] = float(result["signed_log_appends_per_s"]) / raw  # type: ignore[arg-type]
    result["signed_log_verify_vs_raw_insert_ratio"] = float(result["signed_log_verify_entries_per_s"]) / raw  # type: ignore[arg-type]
    evm = result.get("evm_anvil_contributions_per_s")
    result["evm_vs_signed_log_append_ratio"] = (
        None if evm is None else float(evm) / float(result["signed_log_appends_per_s"])  # type: ignore[arg-type]
    )

    print(
        f"signed log: {result['signed_log_appends_per_s']:.0f} appends/s with signature checks, "
        f"{result['signed_log_verify_entries_per_s']:.0f} entries/s full-replay verification"
    )
    print(f"raw SQLite (same rows, same durability): {raw:.0f} inserts/s")
    if evm is None:
        print(f"EVM: {result['evm_anvil_note']}")
    else:
        print(f"EVM on anvil: {float(evm):.1f} contribution records/s")  # type: ignore[arg-type]
    print(
        json.dumps(
            {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()}, sort_keys=True
        )
    )


if __name__ == "__main__":
    main()
