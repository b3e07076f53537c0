"""Conformance cases for spec/rollouts.md, Task files: ids and dataset hashes of tasks with a length target.

They join the `rollouts-tasks` suite (`tests.rl.cases_rollouts.task_cases` yields them), in the same format:
the input is the task's fields, `target_length` only where the case gives one, and the expectation is what
the real handler (`node.rl.conformance.check_task_id`, `check_dataset_hash`) computes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from swarmnode.node.rl.conformance import check_dataset_hash, check_task_id
from swarmnode.node.rl.tasks import Task

Vector = dict[str, Any]


def _task_json(task: Task, explicit_zero: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": task.kind, "prompt": task.prompt, "target": task.target}
    if task.target_length or explicit_zero:
        body["target_length"] = task.target_length
    return body


def _case(name: str, kind: str, description: str, inp: dict[str, Any],
          check: Callable[[dict[str, Any]], dict[str, Any]]) -> Vector:
    return {"name": name, "kind": kind, "description": description, "input": inp, "expect": check(inp)}


def target_length_cases() -> Iterator[Vector]:
    plain = Task("math", "What is 6*7? Put the answer in \\boxed{}.", "42")
    long = Task(plain.kind, plain.prompt, plain.target, 512)
    yield _case("task-id/target-length", "task_id",
                "a length target enters the canonical JSON as an integer, after target (sorted keys)",
                _task_json(long), check_task_id)
    yield _case("task-id/target-length-zero", "task_id",
                "target_length 0 means none: it is left out, so the id is that of the task without the field",
                _task_json(plain, explicit_zero=True), check_task_id)
    tasks = [plain, long, Task("code", "Write inc(x).", "assert inc(1) == 2", 4096)]
    yield _case("dataset-hash/target-lengths", "dataset_hash",
                "the same prompt with and without a length target are two tasks",
                {"tasks": [_task_json(t) for t in tasks]}, check_dataset_hash)
