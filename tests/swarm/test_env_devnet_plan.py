"""What `devnet --env` prepares before any node starts (fast; the slow devnet tests run it): the tasks and
model each built-in environment's run needs, in every training node's [work] table, and the run on the
ledger with the terms the trainer will state."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from swarmnode.node.devnet.network import Devnet
from swarmnode.node.devnet.plan import DevnetPlan
from swarmnode.node.devnet.rl import DEVNET_CALC_TURN_TOKENS
from swarmnode.node.rl.environments.game import KIND as GUESS
from swarmnode.node.rl.run import DEVNET_CALC_MODEL
from swarmnode.node.rl.tasks import read_tasks


@pytest.mark.parametrize("environment, turn_tokens, kind",
                         [("calculator", DEVNET_CALC_TURN_TOKENS, "arithmetic"), ("guess", 6, GUESS)])
def test_an_environment_devnet_writes_its_tasks_and_registers_its_terms(tmp_path: Path, environment: str,
                                                                         turn_tokens: int, kind: str) -> None:
    plan = DevnetPlan(steps=2, ledger="signed", environment=environment, max_new_tokens=turn_tokens)
    devnet = Devnet(plan, tmp_path / "run")
    nodes = devnet.prepare()
    trainer = next(node for node in nodes if node.role == "trainer")
    work = tomllib.loads(trainer.config_path.read_text())["work"]
    assert work["environment"] == environment and work["max_new_tokens"] == turn_tokens
    tasks = read_tasks(Path(work["tasks"]))
    assert {t.kind for t in tasks} == {kind} and len(tasks) >= 128
    assert {t.kind for t in read_tasks(Path(devnet.plan.eval_tasks))} == {kind}
    assert (work.get("model") == str(DEVNET_CALC_MODEL)) == (environment == "calculator")
    for node in nodes:  # every worker and validator plays the same tasks on the same model
        if node.role in ("worker", "validator"):
            other = tomllib.loads(node.config_path.read_text())["work"]
            assert (other["tasks"], other.get("model")) == (work["tasks"], work.get("model"))
    assert devnet.ledger is not None
    ledger = devnet.ledger.open()
    try:
        run = ledger.run(plan.run)
    finally:
        ledger.close()
    assert run is not None and run.owner == devnet.identities[trainer.name].address
    validators = [devnet.identities[node.name].address for node in nodes if node.role == "validator"]
    assert list(run.validators) == validators
