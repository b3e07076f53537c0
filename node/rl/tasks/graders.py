"""The reward function of each task kind, by kind name: what a dataset's kinds are checked against."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from swarmnode.node.rl.tasks import arithmetic, code, families, math
from swarmnode.node.rl.tasks.core import Grade, Task
from swarmnode.node.sandbox.run import check_sandbox

GRADERS: Mapping[str, Callable[[Task, str], Grade]] = MappingProxyType(
    {
        arithmetic.KIND: arithmetic.grade,
        math.KIND: math.grade,
        code.KIND: code.grade,
        families.KIND: families.grade,
    }
)
# Kinds whose grader only parses the completion's text (pure Python, nothing of the worker's runs). Every
# other kind (today `code`) executes it, in the sandbox: a validator grades it only after the model checks,
# and a node takes a run with it only where the sandbox works (spec/validation.md).
PARSING_KINDS = frozenset({arithmetic.KIND, math.KIND})


def executes_completion(kind: str) -> bool:
    """Whether grading a completion of this task kind executes its text (spec/validation.md, Sampling).

    An allowlist of parsing kinds: a kind not known to only parse counts as executing, so a new grader is
    never run on unchecked text, nor without the sandbox, before someone classifies it.
    """
    return kind not in PARSING_KINDS


def reference_completion(task: Task) -> str:
    """What a supervised warm start trains a model to write for `task`: a completion its grader accepts
    (math: the answer boxed). For code it is the target, the task's tests, as before: no solution is known."""
    if task.kind == math.KIND:
        return math.reference_completion(task.target)
    if task.kind == families.KIND:
        return families.reference_completion(task)
    return task.target


def grade(task: Task, completion: str) -> Grade:
    """Reward of a completion's text (up to EOS) for `task`, by the grader of its kind.

    Deterministic for a given task and text, or GraderFault (no reward: a machine-dependent limit hit).
    """
    grader = GRADERS.get(task.kind)
    if grader is None:
        raise ValueError(f"no grader for task kind {task.kind!r}")
    return grader(task, completion)


def grade_group(task: Task, completions: Sequence[str]) -> list[Grade]:
    """Rewards of one group's completions for `task`, in order: what workers and validators compute.

    A family task's group is scored in one sandbox run (its library imports once: about 1 s), so the
    group, not the completion, is the unit a reward is defined on (spec/rollouts.md); every other kind
    grades each completion alone.
    """
    if task.kind == families.KIND:
        return families.grade_group(task, completions)
    return [grade(task, completion) for completion in completions]


def require_sandbox_for(tasks: Iterable[Task]) -> None:
    """SandboxUnavailable (naming what to install) when some task's grader executes code and this machine
    cannot run the sandbox: a node refuses such a run at start rather than fault on every item."""
    if any(executes_completion(task.kind) for task in tasks):
        check_sandbox()
