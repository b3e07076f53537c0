"""Verifiable tasks: ids, dataset files, deterministic assignment and exact reward functions per task kind."""

from __future__ import annotations

from swarmnode.node.rl.tasks.core import (
    MAX_TARGET_LENGTH,
    Grade,
    GraderFault,
    Task,
    assign_tasks,
    canonical_json,
    dataset_hash,
    read_jsonl,
    task_from_json,
    task_id,
    task_length_target,
    task_to_json,
    write_jsonl,
)
from swarmnode.node.rl.tasks.files import TaskFileError, read_tasks, write_tasks
from swarmnode.node.rl.tasks.graders import (
    ENVIRONMENT_KINDS,
    GRADERS,
    GUESS_KIND,
    PARSING_KINDS,
    TASK_KINDS,
    VERIFIERS_KIND,
    executes_completion,
    grade,
    grade_group,
    grade_groups,
    require_sandbox_for,
)

__all__ = [
    "ENVIRONMENT_KINDS",
    "GRADERS",
    "GUESS_KIND",
    "TASK_KINDS",
    "VERIFIERS_KIND",
    "MAX_TARGET_LENGTH",
    "PARSING_KINDS",
    "Grade",
    "GraderFault",
    "Task",
    "TaskFileError",
    "assign_tasks",
    "canonical_json",
    "dataset_hash",
    "executes_completion",
    "grade",
    "grade_group",
    "grade_groups",
    "read_jsonl",
    "read_tasks",
    "require_sandbox_for",
    "task_from_json",
    "task_id",
    "task_length_target",
    "task_to_json",
    "write_jsonl",
    "write_tasks",
]
