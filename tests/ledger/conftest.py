"""Fixtures shared by the ledger tests: a real anvil node for the slow tests.

If anvil is missing, the slow tests install it once with scripts/install_anvil.sh (npm, into the
git-ignored .tools/); set SWARMNODE_NO_ANVIL_INSTALL=1 to skip instead. Without npm, they skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from swarmnode.testing.ledger import PROJECT_ROOT, AnvilProcess, find_anvil

INSTALL_SCRIPT = PROJECT_ROOT / "scripts" / "install_anvil.sh"
INSTALL_HINT = (
    "anvil is not installed: run scripts/install_anvil.sh (npm install of @foundry-rs/anvil into .tools/)"
)


@pytest.fixture(scope="session")
def anvil_binary() -> str:
    binary = find_anvil()
    if binary is None and os.environ.get("SWARMNODE_NO_ANVIL_INSTALL") != "1" and shutil.which("npm"):
        result = subprocess.run([str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=600)
        binary = find_anvil()
        if binary is None:
            pytest.skip(f"{INSTALL_HINT}; the automatic install failed: {result.stderr.strip()[-300:]}")
    if binary is None:
        pytest.skip(INSTALL_HINT)
    return binary


@pytest.fixture(scope="session")
def anvil_url(anvil_binary: str) -> Iterator[str]:
    """One anvil on 127.0.0.1 for the session; every test deploys its own contract on it."""
    with AnvilProcess(anvil_binary) as node:
        yield node.url
