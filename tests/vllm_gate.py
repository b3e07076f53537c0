"""One rule for tests that need vLLM: skipped where it cannot run, never in the test command's vLLM
environment (scripts/test.sh sets SWARMNODE_REQUIRE_VLLM in build/vllm-venv), where a skip would hide it."""

from __future__ import annotations

import os

import pytest

REQUIRE_VLLM_ENV = "SWARMNODE_REQUIRE_VLLM"


def require_vllm(missing: str | None) -> None:
    """Go on when `missing` is None; otherwise fail if vLLM is required here, else skip saying why."""
    if missing is None:
        return
    if os.environ.get(REQUIRE_VLLM_ENV):
        pytest.fail(f"{REQUIRE_VLLM_ENV} is set but {missing}")
    pytest.skip(missing)
