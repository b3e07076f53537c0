"""The compiled SwarmLedger contract: build it, load the committed artifact, check they agree.

The artifact (ledger/contracts/SwarmLedger.json) is committed so a node never needs a compiler at run
time; `scripts/build_contract_artifact.py` rebuilds it, and a test recompiles and demands identical bytes.
Vyper is pinned and the EVM version is explicit (also in the source pragma), so the output is
reproducible: anyone can check that the deployed bytecode came from this source.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from swarmnode.crypto.hashing import sha256

CONTRACTS = Path(__file__).resolve().parent / "contracts"
SOURCE = CONTRACTS / "SwarmLedger.vy"
ARTIFACT = CONTRACTS / "SwarmLedger.json"
COMPILER_VERSION = "0.4.3"
EVM_VERSION = "cancun"  # supported by anvil, py-evm and every mainstream EVM chain
OPTIMIZE = "gas"


def compile_contract(source_path: Path = SOURCE) -> dict[str, Any]:
    """Compile with the pinned vyper; raises if the installed compiler is another version."""
    import vyper
    from vyper.compiler import compile_code
    from vyper.compiler.settings import OptimizationLevel, Settings

    if vyper.__version__ != COMPILER_VERSION:
        raise RuntimeError(f"vyper {COMPILER_VERSION} is pinned, {vyper.__version__} is installed")
    source = source_path.read_text()
    settings = Settings(evm_version=EVM_VERSION, optimize=OptimizationLevel.from_string(OPTIMIZE))
    out = compile_code(
        source,
        contract_path=source_path.name,
        output_formats=["abi", "bytecode", "bytecode_runtime"],
        settings=settings,
    )
    return {
        "contract_name": source_path.stem,
        "compiler": "vyper",
        "compiler_version": COMPILER_VERSION,
        "evm_version": EVM_VERSION,
        "optimize": OPTIMIZE,
        "source_path": f"ledger/contracts/{source_path.name}",
        "source_sha256": sha256(source.encode()).hex(),
        "abi": out["abi"],
        "bytecode": out["bytecode"],
        "bytecode_runtime": out["bytecode_runtime"],
    }


@cache
def load_artifact() -> dict[str, Any]:
    artifact: dict[str, Any] = json.loads(ARTIFACT.read_text())
    return artifact


def write_artifact(path: Path = ARTIFACT) -> dict[str, Any]:
    artifact = compile_contract()
    path.write_text(json.dumps(artifact, indent=2, sort_keys=True) + "\n")
    return artifact

