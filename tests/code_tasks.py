"""Code tasks a tiny arithmetic model can solve: the devnet's questions, graded by running the completion.

The completion is a Python expression (`57`); its program is the completion, a blank line, then the tests
(spec/rollouts.md), so the tests read the program's first paragraph from `__file__` and check its value.
Every reward of such a task is a real program run in the sandbox.
"""

from __future__ import annotations

from swarmnode.node.rl.tasks import Task


def as_code(task: Task) -> Task:
    """An arithmetic task as a code task with the same prompt and answer."""
    tests = f'assert eval(open(__file__).read().split("\\n\\n")[0]) == {task.target}'
    return Task("code", task.prompt, tests)


def mixed(tasks: list[Task], every: int) -> list[Task]:
    """Every `every`-th task (the first included) as a code task, the rest unchanged, in order."""
    return [as_code(t) if i % every == 0 else t for i, t in enumerate(tasks)]
