"""Kill a real appending process with SIGKILL mid-stream: no acknowledged entry is lost, the log verifies,
and what the batches of credits derive (contributions, totals, the credited set) is whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from swarmnode.ledger.signedlog import SignedLog, verify_log
from swarmnode.ledger.state import worker_totals

WRITER = Path(__file__).with_name("crash_writer.py")
PROJECT = Path(__file__).resolve().parents[2]


def run_and_kill(path: Path, acks_before_kill: int) -> dict[int, str]:
    """Start the writer, read acknowledgements, SIGKILL it at once; return every acknowledged entry."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    acked: dict[int, str] = {}
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        while len(acked) < acks_before_kill:
            line = proc.stdout.readline()
            assert line, f"writer died early with {proc.poll()}"
            _, index, digest = line.split()
            acked[int(index)] = digest
        proc.send_signal(signal.SIGKILL)  # mid-stream: it is busy appending the next entries
        for line in proc.stdout:  # acknowledgements already in the pipe count too
            _, index, digest = line.split()
            acked[int(index)] = digest
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return acked


def test_sigkill_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    acked: dict[int, str] = {}
    for round_ in range(2):  # kill, then reopen, continue and kill again
        acked.update(run_and_kill(path, acks_before_kill=25 + 10 * round_))
        report = verify_log(path)
        assert report.ok, report.error
        log = SignedLog.open(path, audit=True)
        try:
            assert log.size() >= max(acked) + 1
            for index, digest in acked.items():
                assert log.prove(index).entry_hash.hex() == digest, f"acknowledged entry {index} changed"
            batches, contributions = log.batches(), log.contributions()
            assert len(batches) == log.size() - 7  # three registrations, three deposits, the run
            assert {b.count for b in batches} == {8} and len(contributions) == 8 * len(batches)
            assert log.totals() == worker_totals(contributions)
            assert all(log.is_credited(c.run, c.worker, c.step) for c in contributions)
            assert log.check_credit_proof(log.prove_credit(len(contributions) - 1))
        finally:
            log.close()
