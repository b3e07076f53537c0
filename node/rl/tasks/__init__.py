"""Verifiable tasks: ids, datasets, deterministic assignment and exact reward functions per task kind."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from node.rl.tasks import arithmetic, code, math
from node.rl.tasks.core import (
    Grade,
    GraderFault,
    Task,
    assign_tasks,
    canonical_json,
    read_jsonl,
    task_from_json,
    task_id,
    task_to_json,
    write_jsonl,
)

GRADERS: Mapping[str, Callable[[Task, str], Grade]] = MappingProxyType(
    {arithmetic.KIND: arithmetic.grade, math.KIND: math.grade, code.KIND: code.grade}
)


def grade(task: Task, completion: str) -> Grade:
    """Reward of a completion's text (up to EOS) for `task`, by the grader of its kind.

    Deterministic for a given task and text, or GraderFault (no reward: a machine-dependent limit hit).
    """
    grader = GRADERS.get(task.kind)
    if grader is None:
        raise ValueError(f"no grader for task kind {task.kind!r}")
    return grader(task, completion)


__all__ = [
    "GRADERS",
    "Grade",
    "GraderFault",
    "Task",
    "assign_tasks",
    "canonical_json",
    "grade",
    "read_jsonl",
    "task_from_json",
    "task_id",
    "task_to_json",
    "write_jsonl",
]
