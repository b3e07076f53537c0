"""Child process of the crash test: appends to a signed log forever, acknowledging each entry on stdout.

`python crash_writer.py PATH` creates the log if needed, registers a trainer, a validator and a worker,
puts a run on the ledger, then commits batches of credits until killed. A line `ack INDEX HASH` is
printed (and flushed) only after the append returned, i.e. after its transaction committed: those are
the entries the parent holds us to.
"""

from __future__ import annotations

import sys
from pathlib import Path

from swarmnode.ledger.signedlog import SignedLog
from swarmnode.ledger.types import Params
from swarmnode.testing import ledger as T

RUN = "crash-run"
CREDITS_PER_BATCH = 8


def main(path: Path) -> None:
    params = Params(min_stake_per_unit_gwei=10, unbonding_delay_epochs=1, slash_gwei=5, ejection_threshold=3)
    log = SignedLog.open(path) if path.exists() else SignedLog.create(path, params, ledger_id="crash")
    trainer, validator = T.identity("crash-trainer"), T.identity("crash-validator")
    worker = T.identity("crash-worker")
    if log.run(RUN) is None:
        for who, role in ((trainer, "trainer"), (validator, "validator"), (worker, "worker")):
            log.register(who, role, T.compute())
            log.deposit(who, 10)
        log.register_run(trainer, T.register_run(RUN, (validator,)))
    nonce = len(log.contributions())
    print("ready", flush=True)
    while True:
        credits = (T.credit(worker, nonce=nonce + i) for i in range(CREDITS_PER_BATCH))
        receipt = log.commit_credits(validator, T.batch(RUN, *credits))
        print(f"ack {receipt.position} {receipt.ref.hex()}", flush=True)
        nonce += CREDITS_PER_BATCH


if __name__ == "__main__":
    main(Path(sys.argv[1]))
