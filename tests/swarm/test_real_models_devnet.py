"""A run on a model folder and a task file as a user would bring them: `swarmnode model init` writes a tiny
Qwen2 or Llama folder (save_pretrained, a BPE tokenizer trained on the tasks, a warm start), the tasks are a
JSONL of math problems graded by their last \\boxed{}, and `swarmnode devnet --model --tasks` trains on them.

The held-out reward must rise, every cheater be slashed (the Qwen2 run has one of each kind) and no honest
node, the ledger verify, and the relay's copy of the final checkpoint load with transformers
`from_pretrained`. Credits go through batches and slashes are finalized after the run's challenge window,
within the run. The Llama run records on a local anvil chain, whose records the devnet audits. Slow (about
1.5 minutes per architecture on 2 cores).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from swarmnode.node.rl.tasks import Task, write_tasks
from swarmnode.testing.ledger import find_anvil

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WARM_TASKS, TRAIN_TASKS, EVAL_TASKS = 3000, 512, 128


def math_tasks(seed: int, count: int) -> list[Task]:
    """Distinct two-digit additions as math problems whose answer is boxed."""
    rng = random.Random(seed)
    seen: dict[tuple[int, int], Task] = {}
    while len(seen) < count:
        a, b = rng.randrange(100), rng.randrange(100)
        seen.setdefault((a, b), Task("math", f"{a}+{b}=", f"\\boxed{{{a + b}}}"))
    return list(seen.values())


def check_nodes(summary: dict, cheaters: int) -> None:
    """Honest workers credited and never rejected or slashed; each cheat (in devnet order) slashed."""
    nodes = summary["nodes"]
    cheats = {node["cheat"] for node in nodes.values() if not node["honest"]}
    assert cheats == set(["perturbed-model", "tampered-prompt", "forged-reward"][:cheaters])
    for name, node in nodes.items():
        if node["role"] != "worker":
            continue
        if node["honest"]:
            assert node["rollouts_accepted"] > 0 and node["rollouts_rejected"] == 0, name
            assert node["contributions"] > 0 and node["stake_after_gwei"] == node["stake_before_gwei"], name
        else:
            assert node["rollouts_accepted"] == 0 and node["rollouts_rejected"] > 0, name
            assert node["slashes"] > 0 and node["stake_after_gwei"] < node["stake_before_gwei"], name
            assert node["slashes_final"] > 0, name  # taken after the run's challenge window, in the run


def swarmnode(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swarmnode.node.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# The Llama run records on a local anvil chain (one contract slash at least), where anvil is installed.
# A busy machine stretches `model init` most (its warm start's torch threads wait on a loaded core): measured
# 39 s quiet and 4.5 minutes beside one busy core for the family file's; hence a timeout of its own.
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("arch", "cheaters", "ledger"), [("qwen2", 3, "signed"), ("llama", 1, "evm")])
def test_a_devnet_trains_a_user_model_on_a_task_file(
    arch: str, cheaters: int, ledger: str, tmp_path: Path
) -> None:
    if ledger == "evm" and find_anvil() is None:
        ledger = "signed"
    tasks = math_tasks(seed=11, count=WARM_TASKS)
    write_tasks(tasks, tmp_path / "warm.jsonl")  # the warm start sees all of them, as the devnet's base did
    write_tasks(tasks[:TRAIN_TASKS], tmp_path / "train.jsonl")
    write_tasks(tasks[TRAIN_TASKS : TRAIN_TASKS + EVAL_TASKS], tmp_path / "held-out.jsonl")
    model = tmp_path / "model"
    init = swarmnode(
        "model", "init", "--arch", arch, "--tasks", str(tmp_path / "warm.jsonl"), "--warm-start-pass", "0.3",
        str(model), timeout=900,
    )  # fmt: skip
    assert init.returncode == 0, init.stdout[-3000:] + init.stderr[-3000:]
    assert json.loads((model / "config.json").read_text())["model_type"] == arch

    summary_path = tmp_path / "summary.json"
    run = swarmnode(
        "devnet", "--no-live", "--steps", "10", "--workers", "1", "--relays", "1",
        "--cheaters", str(cheaters), "--ledger", ledger,
        "--model", str(model), "--tasks", str(tmp_path / "train.jsonl"),
        "--eval-tasks", str(tmp_path / "held-out.jsonl"), "--max-new-tokens", "10",
        "--out", str(tmp_path / "run"), "--summary", str(summary_path), timeout=1200,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    base, final = summary["base_reward"], summary["final_reward"]
    assert final > base, (base, final)
    assert summary["every_cheater_slashed"] is True and summary["honest_slashed"] == []
    assert summary["ledger"]["kind"] == ledger
    assert summary["ledger"]["batches"] > 0 and summary["ledger"]["credits"] >= summary["ledger"]["batches"]
    assert summary["ledger"]["slashes_by_status"].get("voided", 0) == 0
    assert summary["ledger"]["verified"] is True  # signed: the log's audit; evm: the chain's records
    check_nodes(summary, cheaters)
    assert (tmp_path / "run" / "devnet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if ledger == "signed":  # the chain stops with the devnet; a signed log is audited again from the file
        log = f"signed:{tmp_path / 'run' / 'ledger.db'}"
        verify = swarmnode("ledger", "verify", "--ledger", log, timeout=120)
        assert verify.returncode == 0, verify.stdout + verify.stderr
    else:
        assert summary["ledger"]["url"].startswith("evm:http://127.0.0.1:")

    relay_versions = tmp_path / "run" / "relay-1" / "data"
    folders = sorted(p.parent for p in relay_versions.rglob("config.json"))
    assert folders, f"no checkpoint folder under {relay_versions}"
    newest = max(folders, key=lambda p: int(p.name) if p.name.isdigit() else -1)
    loaded = AutoModelForCausalLM.from_pretrained(str(newest), local_files_only=True).eval()
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    assert loaded(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.shape[-1] == vocab
