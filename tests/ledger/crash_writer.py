"""Child process of the crash test: appends to a signed log forever, acknowledging each entry on stdout.

`python crash_writer.py PATH` creates the log if needed, registers a validator and a worker, then records
contributions until killed. A line `ack INDEX HASH` is printed (and flushed) only after the append
returned, i.e. after its transaction committed: those are the entries the parent holds us to.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ledger import testing as T
from ledger.signedlog import SignedLog
from ledger.types import Params


def main(path: Path) -> None:
    params = Params(min_stake_per_unit_gwei=10, unbonding_delay_epochs=1, slash_gwei=5, ejection_threshold=3)
    log = SignedLog.open(path) if path.exists() else SignedLog.create(path, params, ledger_id="crash")
    validator, worker = T.identity("crash-validator"), T.identity("crash-worker")
    if log.node(validator.address) is None:
        for who, role in ((validator, "validator"), (worker, "worker")):
            log.register(who, role, T.compute())
            log.deposit(who, 10)
    nonce = len(log.contributions())
    print("ready", flush=True)
    while True:
        receipt = log.record_contribution(validator, T.contribution(validator, worker, nonce=nonce))
        print(f"ack {receipt.position} {receipt.ref.hex()}", flush=True)
        nonce += 1


if __name__ == "__main__":
    main(Path(sys.argv[1]))
