"""Environments a swarm can verify: multi-turn rollouts a validator checks by replay (spec/environments.md).

An environment is ONE pure function of (task, seed, the model's turns so far): after each model turn it
says either the next environment turn (text appended to the conversation: a tool's result, a game's
reply) or `Done(reward)`. No clock, no I/O, no randomness except derived from (task, seed) by hashing:
so a validator re-running it on the claimed model turns must get every environment turn byte for byte,
and a turn it does not get was fabricated (`replay.py`).

A completion is a `Transcript` of spans, each the model's or the environment's, model first and last,
alternating. This slice works on text; on the wire a span will carry its token ids (model spans sampled,
environment spans tokenized and masked out of the loss and of the logprob and sampling checks).

`episode` runs one under `EnvBounds` (turns, bytes per environment turn, bytes in all: run parameters,
each at most a protocol maximum); `next_step` is the one rule it and `replay` share, so a worker and a
validator end every episode at the same span with the same reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from swarmnode.node.rl.tasks import Task
from swarmnode.protocol.messages import MAX_ENV_TURN_BYTES, MAX_ENV_TURNS, MAX_TRANSCRIPT_BYTES

# Protocol maxima of the bounds (defined with the wire messages): a run's bounds MUST NOT exceed them.
MAX_TURNS = MAX_ENV_TURNS  # model turns per episode
MAX_ENV_BYTES = MAX_ENV_TURN_BYTES  # UTF-8 bytes of one environment turn
MAX_TOTAL_BYTES = MAX_TRANSCRIPT_BYTES  # UTF-8 bytes of all spans of a transcript

SpanKind = Literal["model", "env"]
# The last two are the token rule's (`episodes.after_model_turn`), which only episodes in tokens apply.
EndedBy = Literal["done", "max_turns", "max_env_bytes", "max_total_bytes", "max_completion_tokens",
                  "empty_env_turn"]


@dataclass(frozen=True)
class EnvTurn:
    """The environment's next message: the model's next turn follows it."""

    text: str


@dataclass(frozen=True)
class Done:
    """The episode is over; `reward` in [0, 1] is the completion's reward."""

    reward: float


class Environment(Protocol):
    """A named, versioned, deterministic environment (a run will commit to `name` and `version`)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def bounds(self) -> EnvBounds:
        """The bounds a run uses unless it sets its own."""
        ...

    @property
    def kinds(self) -> tuple[str, ...]:
        """The task kinds it plays (a run's tasks must all be of these)."""
        ...

    @property
    def instructions(self) -> str:
        """What the model is told before each task's prompt (how to call a tool, the reply's form); ""."""
        ...

    def respond(self, task: Task, seed: int, model_turns: Sequence[str]) -> EnvTurn | Done:
        """What follows the last of `model_turns` (never empty). Pure: same arguments, same answer."""
        ...


class WrongTaskKind(ValueError):
    """A task of a kind the environment does not play: a run's configuration error, not a model's."""

    def __init__(self, environment: str, kind: str, accepted: Sequence[str]) -> None:
        super().__init__(f"environment {environment!r} takes tasks of kind {' or '.join(accepted)}, "
                         f"got {kind!r}")


@dataclass(frozen=True)
class EnvBounds:
    """A run's bounds on an episode: model turns, bytes of one environment turn, bytes of all spans."""

    max_turns: int
    max_env_bytes: int = MAX_ENV_BYTES
    max_total_bytes: int = MAX_TOTAL_BYTES

    def __post_init__(self) -> None:
        for field, value, maximum in (("max_turns", self.max_turns, MAX_TURNS),
                                      ("max_env_bytes", self.max_env_bytes, MAX_ENV_BYTES),
                                      ("max_total_bytes", self.max_total_bytes, MAX_TOTAL_BYTES)):
            if type(value) is not int or not 1 <= value <= maximum:
                raise ValueError(f"{field} must be an integer 1 ... {maximum} (protocol maximum), "
                                 f"got {value!r}")


@dataclass(frozen=True)
class Span:
    """One turn of a transcript: the model's text or the environment's."""

    kind: SpanKind
    text: str

    def __post_init__(self) -> None:
        if self.kind not in ("model", "env"):
            raise ValueError(f"span kind must be 'model' or 'env', got {self.kind!r}")
        if not isinstance(self.text, str):
            raise ValueError(f"span text must be a string, got {type(self.text).__name__}")


@dataclass(frozen=True)
class Transcript:
    """A completion as spans (the task's prompt precedes it and is not a span)."""

    spans: tuple[Span, ...] = ()

    @property
    def model_turns(self) -> list[str]:
        return [s.text for s in self.spans if s.kind == "model"]

    def total_bytes(self) -> int:
        return sum(span_bytes(s.text) for s in self.spans)

    def then(self, span: Span) -> Transcript:
        return Transcript((*self.spans, span))


@dataclass(frozen=True)
class Ended:
    """Why and with what reward an episode ended."""

    reward: float
    by: EndedBy


@dataclass(frozen=True)
class Episode:
    transcript: Transcript
    reward: float
    ended_by: EndedBy


class BadReward(ValueError):
    """An environment returned a reward outside [0, 1] or not finite: a bug in the environment."""


def span_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def next_step(env: Environment, task: Task, seed: int, bounds: EnvBounds,
              model_turns: Sequence[str], used_bytes: int) -> EnvTurn | Ended:
    """What follows the last model turn, under `bounds`: the environment's next turn, or the end.

    `used_bytes` counts every span so far, the last model turn included. A bound ends the episode with
    reward 0 (as a length cut does): a transcript past the byte budget, a reply at the turn bound, a reply
    too long for a turn or for the budget. The worker's driver and the validator's replay both call this.
    """
    if used_bytes > bounds.max_total_bytes:
        return Ended(0.0, "max_total_bytes")
    reply = env.respond(task, seed, model_turns)
    if isinstance(reply, Done):
        return Ended(checked_reward(env, reply.reward), "done")
    if len(model_turns) >= bounds.max_turns:
        return Ended(0.0, "max_turns")
    size = span_bytes(reply.text)
    if size > bounds.max_env_bytes:
        return Ended(0.0, "max_env_bytes")
    if used_bytes + size > bounds.max_total_bytes:
        return Ended(0.0, "max_total_bytes")
    return reply


EnvCall = tuple[Task, int, tuple[str, ...]]  # (task, seed, model turns so far): what `respond` answers


def prefetch(env: Environment, calls: Sequence[EnvCall]) -> None:
    """Let an environment that answers many calls at once (`respond_many`: a verifiers environment, one
    sandbox run) answer `calls` before `respond` asks for each; any other answers as it is asked."""
    respond_many = getattr(env, "respond_many", None)
    if respond_many is not None and calls:
        respond_many(calls)


def checked_reward(env: Environment, reward: float) -> float:
    if not isinstance(reward, float | int) or not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        raise BadReward(f"environment {env.name!r} returned reward {reward!r}, not in [0, 1]")
    return float(reward)


def episode(env: Environment, task: Task, seed: int, next_model_turn: Callable[[Transcript], str],
            bounds: EnvBounds | None = None) -> Episode:
    """Run one episode: ask `next_model_turn` (given the transcript so far) for each model turn, append the
    environment's turns, stop at `Done` or a bound (`next_step`)."""
    bounds = bounds or env.bounds
    transcript = Transcript()
    used = 0
    while True:
        text = next_model_turn(transcript)
        transcript = transcript.then(Span("model", text))
        used += span_bytes(text)
        step = next_step(env, task, seed, bounds, transcript.model_turns, used)
        if isinstance(step, Ended):
            return Episode(transcript, step.reward, step.by)
        transcript = transcript.then(Span("env", step.text))
        used += span_bytes(step.text)
