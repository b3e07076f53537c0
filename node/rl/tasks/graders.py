"""The reward function of each task kind, by kind name: what a dataset's kinds are checked against."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from swarmnode.node.rl.tasks import arithmetic, code, math
from swarmnode.node.rl.tasks.core import Grade, Task

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
