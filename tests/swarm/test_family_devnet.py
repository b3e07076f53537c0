"""A reasoning-gym family devnet, as an operator builds one from the README: a family file, `model init`
with a warm start on it, then `devnet --tasks` on the family with held-out tasks from another seed. Every role
regenerates the tasks and scores answers with the family's own scorer in the sandbox; a worker that claims
rewards the scorer does not give is slashed 603 BAD_REWARD, no honest node is, and the held-out reward
rises (measured over 20 steps on 128 held-out tasks: 0.371 -> 0.464). Slow (about six minutes on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.swarm.devnet_runs import assert_only_the_cheater_caught, devnet_summary, swarmnode

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # about 6 minutes alone, more under load

STEPS = 16
FAMILY = """seed = {seed}
[[family]]
name = "chain_sum"
count = {count}
config = {{ min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1 }}
"""


def test_a_family_devnet_trains_and_slashes_a_worker_that_forges_rewards(tmp_path: Path) -> None:
    tasks, held_out, model = tmp_path / "families.toml", tmp_path / "held-out.toml", tmp_path / "fam-model"
    tasks.write_text(FAMILY.format(seed=7, count=300))
    held_out.write_text(FAMILY.format(seed=8, count=128))
    init = swarmnode("model", "init", "--tasks", str(tasks), "--warm-start-pass", "0.3", "--keep-best",
                     "--max-steps", "300", str(model), timeout=900)
    assert init.returncode == 0, init.stdout[-3000:] + init.stderr[-3000:]
    summary = devnet_summary(tmp_path, "--steps", str(STEPS), "--workers", "2", "--relays", "1", "--model",
                             str(model), "--tasks", str(tasks), "--eval-tasks", str(held_out),
                             "--max-new-tokens", "8", "--cheat", "forged-reward")
    assert_only_the_cheater_caught(summary, "forged-reward", {"BAD_REWARD"})
    assert summary["trainer"]["step"] == STEPS
    # the same 128 held-out tasks and seeds before and after: about 0.015 of noise each way
    assert summary["final_reward"] > summary["base_reward"] + 0.02, (summary["base_reward"],
                                                                      summary["final_reward"])
