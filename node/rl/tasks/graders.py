"""The reward function of each task kind, by kind name: what a dataset's kinds are checked against."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from swarmnode.node.rl.tasks import arithmetic, code, families, math
from swarmnode.node.rl.tasks.core import Grade, GraderFault, Task
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
# Kinds that only an environment plays (spec/environments.md): no single-turn grader, so a run of such tasks
# must name an environment. A task file may hold any of `TASK_KINDS`.
GUESS_KIND = "guess"
VERIFIERS_KIND = "verifiers"  # a verifiers environment's row (node/rl/environments/verifiers_adapter.py)
ENVIRONMENT_KINDS = frozenset({GUESS_KIND, VERIFIERS_KIND})
TASK_KINDS = frozenset(GRADERS) | ENVIRONMENT_KINDS


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


def grade_groups(groups: Sequence[tuple[Task, Sequence[str]]]) -> list[list[Grade]]:
    """Rewards of a submission's groups (task, completion texts), in order: what workers and validators
    compute. Family tasks are scored together, one sandbox run per dataset source (the library imports
    once), so the submission, not the completion, is the unit their rewards are defined on
    (spec/rollouts.md); every other kind grades each completion alone."""
    family = [i for i, (task, _) in enumerate(groups) if task.kind == families.KIND]
    scored = dict(zip(family, families.grade_groups([groups[i] for i in family]), strict=True))
    return [
        scored[i] if i in scored else [grade(task, text) for text in texts]
        for i, (task, texts) in enumerate(groups)
    ]


def grade_group(task: Task, completions: Sequence[str]) -> list[Grade]:
    """`grade_groups` of one group."""
    return grade_groups([(task, completions)])[0]


def measured_rewards(groups: Sequence[tuple[Task, Sequence[str]]]) -> list[list[float]]:
    """Rewards for a local measurement (the pass-rate filter, held-out evaluation), not a verdict anyone
    recomputes: graded together, and where that faults, one by one with a faulting completion at 0."""
    try:
        return [[g.reward for g in grades] for grades in grade_groups(groups)]
    except GraderFault:
        return [[_reward_or_zero(task, text) for text in texts] for task, texts in groups]


def _reward_or_zero(task: Task, text: str) -> float:
    try:
        return grade(task, text).reward
    except GraderFault:
        return 0.0


def require_sandbox_for(tasks: Iterable[Task]) -> None:
    """SandboxUnavailable (naming what to install) when some task's grader executes code and this machine
    cannot run the sandbox: a node refuses such a run at start rather than fault on every item."""
    if any(executes_completion(task.kind) for task in tasks):
        check_sandbox()
