"""A tool-using devnet (spec/environments.md): `devnet --env calculator` trains the committed calculator model
on two-digit products (the devnet writes them), every completion an episode (a `<calc>` call, the tool's
`<result>`, the boxed answer) that the validator replays, and a worker that fabricates the tool's results
(sampling its later turns honestly on them, so every model check passes) is slashed 611
FABRICATED_ENV_TURN. The held-out reward rises: measured 0.46 -> 0.69 over 20 steps, about 0.54 by step 8.
Slow (about four minutes on 2 cores); `-m slow` runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.swarm.devnet_runs import assert_only_the_cheater_caught, devnet_summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # about 5 minutes alone, more under load

STEPS = 12


def test_a_calculator_devnet_trains_and_slashes_a_worker_that_fabricates_tool_results(tmp_path: Path) -> None:
    summary = devnet_summary(tmp_path, "--steps", str(STEPS), "--workers", "2", "--relays", "1", "--env",
                             "calculator", "--cheat", "fabricated-env-turn")
    assert_only_the_cheater_caught(summary, "fabricated-env-turn", {"FABRICATED_ENV_TURN"})
    assert summary["trainer"]["step"] == STEPS
    # the same 128 held-out products and seeds before and after: about 0.016 of noise each way
    assert summary["final_reward"] > summary["base_reward"] + 0.03, (summary["base_reward"],
                                                                      summary["final_reward"])
