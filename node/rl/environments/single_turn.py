"""Today's task kinds as single-turn environments: one model turn, then `Done` with its grader's reward.

The reward is the kind's own grader (`node/rl/tasks`), unchanged: a single-turn episode earns exactly
what the completion earned before environments existed. A `code` task's grader runs the completion in
the sandbox, and `GraderFault` (a machine-dependent limit) passes through: no reward, no verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swarmnode.node.rl.environments import Done, EnvBounds, EnvTurn, WrongTaskKind
from swarmnode.node.rl.tasks import GRADERS, Task


@dataclass(frozen=True)
class SingleTurn:
    """The environment of one task kind: grade the only model turn."""

    kind: str
    version: str = "1"

    @property
    def name(self) -> str:
        return self.kind

    @property
    def bounds(self) -> EnvBounds:
        return EnvBounds(max_turns=1)

    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind,)

    @property
    def instructions(self) -> str:
        return ""  # the task's prompt says it all, as before environments

    def respond(self, task: Task, seed: int, model_turns: Sequence[str]) -> EnvTurn | Done:
        if task.kind != self.kind:
            raise WrongTaskKind(self.name, task.kind, [self.kind])
        return Done(GRADERS[self.kind](task, model_turns[-1]).reward)


SINGLE_TURN = {kind: SingleTurn(kind) for kind in sorted(GRADERS)}
