"""A devnet whose tasks include code: every honest code reward is a program run in the sandbox, and a
worker that injects `import os;os.kill(os.getppid(),9)` as a completion (its rows and logprobs the model's
own, only its tokens chosen) is slashed by the sampling check before any grader sees its text.

Before issue #29 that payload killed every validator at the reward check, and again at each restart (it
stays in the durable queue). Slow (about two minutes on 2 cores); `-m slow` runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmnode.node.rl.run import devnet_dataset, devnet_eval_tasks
from swarmnode.node.rl.tasks import write_tasks
from tests.code_tasks import mixed
from tests.swarm.devnet_runs import assert_only_the_cheater_caught, devnet_summary

pytestmark = pytest.mark.slow

CODE_EVERY = 4  # one task in four is a code task: grading in the sandbox costs ~40 ms a completion here


def test_a_devnet_with_code_tasks_trains_and_slashes_a_code_injector(tmp_path: Path) -> None:
    write_tasks(mixed(devnet_dataset(), CODE_EVERY), tmp_path / "train.jsonl")
    write_tasks(mixed(devnet_eval_tasks(), CODE_EVERY), tmp_path / "held-out.jsonl")
    summary = devnet_summary(tmp_path, "--steps", "8", "--workers", "2", "--relays", "1", "--cheat",
                             "code-injection", "--max-new-tokens", "32", "--tasks",
                             str(tmp_path / "train.jsonl"), "--eval-tasks", str(tmp_path / "held-out.jsonl"),
                             timeout=1200)
    assert summary["final_reward"] > summary["base_reward"], (summary["base_reward"], summary["final_reward"])
    assert_only_the_cheater_caught(summary, "code-injection")
