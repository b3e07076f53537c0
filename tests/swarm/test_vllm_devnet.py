"""`swarmnode devnet --engine vllm`: the devnet's workers generate with vLLM (its CPU build here, in the
environment `scripts/install_vllm.sh` builds), the validator re-checks their TOPLOC proofs with transformers.

The held-out reward must rise, the cheater (weights perturbed inside vLLM) be slashed and no honest node,
every honest worker be credited, and each worker's log say it runs vLLM and swapped checkpoints in.
Marked `vllm`: scripts/test.sh runs it in build/vllm-venv (SWARMNODE_REQUIRE_VLLM set, so it fails there
rather than skip); elsewhere it is skipped with the reason vLLM cannot run. Slow (about 2 minutes on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmnode.node.rl.engines import EngineUnavailable
from tests.swarm.test_real_models_devnet import check_nodes, swarmnode
from tests.vllm_gate import require_vllm

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _vllm_missing() -> str | None:
    """Why vLLM cannot run here, or None (on the CPU: its CPU build must be installed)."""
    from swarmnode.node.rl.engines import choose_engine

    try:
        choose_engine("vllm")
    except EngineUnavailable as exc:
        return str(exc)
    return None


def test_a_devnet_of_vllm_workers_learns_and_slashes_its_cheater(tmp_path: Path) -> None:
    require_vllm(_vllm_missing())
    summary_path = tmp_path / "summary.json"
    run = swarmnode(
        "devnet", "--no-live", "--engine", "vllm", "--steps", "10", "--cheaters", "1",
        "--out", str(tmp_path / "run"), "--summary", str(summary_path), timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    assert summary["final_reward"] > summary["base_reward"], (summary["base_reward"], summary["final_reward"])
    assert summary["every_cheater_slashed"] is True and summary["honest_slashed"] == []
    check_nodes(summary, cheaters=1)
    for name, node in summary["nodes"].items():
        if node["role"] == "worker":
            log = (tmp_path / "run" / name / "stdout.log").read_text()
            assert "worker ready" in log and "engine=VLLMEngine" in log, name
            assert "checkpoint swapped in" in log, name  # the trainer's new weights, loaded into vLLM
