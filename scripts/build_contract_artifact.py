"""Rebuild the committed SwarmLedger artifact (ledger/contracts/SwarmLedger.json) from its Vyper source.

    .venv/bin/python scripts/build_contract_artifact.py

Needs the pinned vyper (`ledger.artifact.COMPILER_VERSION`). Run it after editing
ledger/contracts/SwarmLedger.vy and commit both; tests/ledger/test_ledger_evm.py recompiles and demands
identical bytes.
"""

from __future__ import annotations

import sys

from swarmnode.ledger.artifact import ARTIFACT, write_artifact


def main() -> None:
    built = write_artifact()
    print(f"wrote {ARTIFACT} ({len(built['bytecode']) // 2 - 1} bytes of init code)", file=sys.stderr)


if __name__ == "__main__":
    main()
