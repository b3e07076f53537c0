"""Errors an operator can fix end a node with one `Error:` line, wherever in the node they were raised
(node/errors.py); any other exception keeps its traceback, and so does every error at log level DEBUG."""

from __future__ import annotations

import click
import pytest
import trio

from swarmnode.ledger.errors import LedgerError, RunExists
from swarmnode.node.cli.run import operator_error, serve_node
from swarmnode.node.errors import OperatorError, RunMismatch
from swarmnode.node.rl.tasks import TaskFileError
from swarmnode.node.worker.eligibility import NotEligible


class FailingRuntime:
    """A node whose work raises `error` two nurseries deep, after it reported started (as a role does)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async def work() -> None:
            async with trio.open_nursery() as inner:
                inner.start_soon(trio.sleep_forever)
                raise self.error

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            task_status.started()
            await work()


MISMATCH = RunMismatch("/m/config.json differs from the run's model config: use the run's model folder")


def test_a_mismatch_deep_in_the_node_is_one_line_naming_the_fix() -> None:
    with pytest.raises(click.ClickException) as caught:
        serve_node(FailingRuntime(MISMATCH), "worker", "INFO")  # type: ignore[arg-type]
    assert caught.value.message == f"the worker stopped: {MISMATCH}"


def test_at_debug_the_traceback_stays() -> None:
    with pytest.raises(BaseExceptionGroup) as caught:
        serve_node(FailingRuntime(MISMATCH), "worker", "debug")  # type: ignore[arg-type]
    assert operator_error(caught.value) is MISMATCH


def test_a_bug_keeps_its_traceback() -> None:
    with pytest.raises(BaseExceptionGroup) as caught:
        serve_node(FailingRuntime(KeyError("bug")), "worker", "INFO")  # type: ignore[arg-type]
    assert operator_error(caught.value) is None


@pytest.mark.parametrize(
    "error",
    [
        MISMATCH,
        NotEligible("0xab is not staked: swarmnode stake deposit"),
        TaskFileError("tasks.jsonl", "repeats the task of row 1", row=2),
        RunExists("run 'r' is registered by 0xcd"),
    ],
)
def test_operator_errors_are_found_in_groups_and_chains(error: Exception) -> None:
    assert isinstance(error, OperatorError | LedgerError)
    try:
        try:
            raise error
        except Exception as exc:
            raise RuntimeError("while starting the work") from exc
    except RuntimeError as chained:
        group = BaseExceptionGroup("node", [trio.Cancelled._create(), ExceptionGroup("role", [chained])])
    assert operator_error(group) is error
