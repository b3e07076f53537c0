"""The validator's replay: re-run the environment on the transcript's model turns, require every
environment span byte for byte (spec/environments.md, Replay).

The model turns are the worker's claim (the model checks judge them); the environment turns are not a
claim at all, they follow from the model turns. So any environment span that differs from the replay is
fabricated (`FabricatedTurn`, a slashable reject), and a transcript whose shape is not the one the
environment dictates (a missing or extra span, a span past the end) is malformed (`MalformedTranscript`).
Replay walks the spans in order and stops at the first fault, so the error names the first bad span.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmnode.node.rl.environments import (
    Ended,
    EndedBy,
    EnvBounds,
    Environment,
    Transcript,
    next_step,
    span_bytes,
)
from swarmnode.node.rl.tasks import Task

CLIP = 80  # characters of a span an error message shows


class ReplayError(ValueError):
    """A transcript the environment does not reproduce: the validator rejects the submission."""


class FabricatedTurn(ReplayError):
    """An environment span that is not what the environment says after the model turns before it."""

    def __init__(self, index: int, expected: str, claimed: str) -> None:
        self.index, self.expected, self.claimed = index, expected, claimed
        super().__init__(f"span {index}: the environment says {expected[:CLIP]!r}, "
                         f"the transcript claims {claimed[:CLIP]!r}")


class MalformedTranscript(ReplayError):
    """A transcript whose spans are not in the shape the environment dictates."""

    def __init__(self, index: int, problem: str) -> None:
        self.index, self.problem = index, problem
        super().__init__(f"span {index}: {problem}")


@dataclass(frozen=True)
class Replayed:
    """The replay's outcome: the reward the transcript earns and why its episode ended."""

    reward: float
    ended_by: EndedBy


def replay(env: Environment, task: Task, seed: int, transcript: Transcript,
           bounds: EnvBounds | None = None) -> Replayed:
    """The reward of `transcript`, found by replaying `env` on its model turns; FabricatedTurn or
    MalformedTranscript at the first span that disagrees. GraderFault passes through (no verdict)."""
    bounds = bounds or env.bounds
    spans = transcript.spans
    if not spans:
        raise MalformedTranscript(0, "empty transcript: the model turn is missing")
    model_turns: list[str] = []
    used = 0
    index = 0
    while True:
        span = spans[index]
        if span.kind != "model":
            raise MalformedTranscript(index, "an environment span where a model turn must be")
        model_turns.append(span.text)
        used += span_bytes(span.text)
        step = next_step(env, task, seed, bounds, model_turns, used)
        index += 1
        if isinstance(step, Ended):
            if index != len(spans):
                raise MalformedTranscript(index, f"a span after the end of the episode ({step.by})")
            return Replayed(step.reward, step.by)
        if index == len(spans):
            raise MalformedTranscript(index, "the episode is not over: the environment's turn is missing")
        claimed = spans[index]
        if claimed.kind != "env":
            raise MalformedTranscript(index, "a model turn where the environment's turn must be")
        if claimed.text != step.text:
            raise FabricatedTurn(index, step.text, claimed.text)
        used += span_bytes(step.text)
        index += 1
        if index == len(spans):
            raise MalformedTranscript(index, "the transcript ends on an environment turn: a model turn "
                                             "must follow")
