"""Conformance cases for multi-turn rollouts (spec/environments.md, On the wire): validators' verdicts on
signed submissions of a run that plays the guess-the-number game.

Part of the `rollouts` suite (node/conformance.py): the same validation handler as tests/rl/cases_rollouts.py,
on a descriptor that names the `guess` environment. The devnet's committed model plays 6 short games, 1 prompt
x 2 completions per submission; honest episodes, the `fabricated-env-turn` cheat of
`swarmnode.testing.cheats` (its later model turns sampled honestly on the lie, so only the replay objects),
and single-field edits of an honest one, each signed by the worker key.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from swarmnode.crypto.hashing import sha256
from swarmnode.node.rl.conformance import check_validation
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.environments.game import generate_tasks
from swarmnode.node.rl.model import model_commitment
from swarmnode.node.rl.rollouts import build_submission
from swarmnode.node.rl.run import DEVNET_MODEL, describe_run, devnet_grpo, devnet_policy, environment_for
from swarmnode.node.rl.tasks import Task
from swarmnode.protocol.envelope import seal
from swarmnode.protocol.messages import EnvSpan, RolloutSubmission, RunDescriptor
from swarmnode.testing.cheats import FABRICATED_ENV_TURN, build_dishonest_submission
from tests.conformance.keys import NOW_MS, RUN, vector_identity
from tests.rl.cases_rollouts import WORKER, validation_input

Vector = dict[str, Any]

TRAINER = vector_identity(1)
COUNTER = 0


def _games() -> list[Task]:
    return list({t.task_id: t for t in generate_tasks(8, seed=3, max_low=20, max_size=16)}.values())


@dataclasses.dataclass(frozen=True)
class _Setup:
    descriptor: RunDescriptor
    engine: TransformersEngine
    weights_root: bytes
    root: bytes

    @property
    def dataset(self) -> dict[bytes, Task]:
        return {t.task_id: t for t in _games()}

    def submission(self, counter: int, cheat: str = "") -> RolloutSubmission:
        args = (self.engine, self.descriptor, self.dataset, list(self.dataset), WORKER.address, 0, self.root,
                counter)
        return build_dishonest_submission(cheat, *args) if cheat else build_submission(*args)


@cache
def _setup() -> _Setup:
    engine = TransformersEngine.from_folder(DEVNET_MODEL)
    base = devnet_grpo(engine.info)
    grpo = dataclasses.replace(base, prompts_per_step=1, group_size=2, token_budget=2 * base.max_new_tokens)
    commitment = model_commitment(DEVNET_MODEL)
    terms = environment_for("guess", _games(), engine.tokenizer, engine.info, grpo.max_new_tokens)
    descriptor = describe_run(run=RUN, trainer=TRAINER.address, model=commitment, tasks=_games(), grpo=grpo,
                              policy=devnet_policy(), created_ms=NOW_MS, environment=terms)
    return _Setup(descriptor, engine, commitment.weights_root, sha256(b"the v0 manifest"))


def _with_completion(sub: RolloutSubmission, index: int, **changes: Any) -> RolloutSubmission:
    group = sub.groups[0]
    completions = list(group.completions)
    completions[index] = dataclasses.replace(completions[index], **changes)
    return dataclasses.replace(sub, groups=(dataclasses.replace(group, completions=tuple(completions)),))


def _first_with_spans(sub: RolloutSubmission) -> int:
    return next(i for i, c in enumerate(sub.groups[0].completions) if c.env_spans)


def _submissions(s: _Setup) -> Iterator[tuple[str, str, RolloutSubmission]]:
    honest = s.submission(COUNTER)
    i = _first_with_spans(honest)
    c = honest.groups[0].completions[i]
    yield ("accept/multi-turn-honest", "honest episodes with environment turns: accepted, credited for the "
           "model's tokens only", honest)
    forged = s.submission(COUNTER, FABRICATED_ENV_TURN)
    yield ("reject/fabricated-env-turn", "check 5: the worker played a game that said "
           "`<result>TARGET</result>` where the real one says higher or lower, and sampled its next turns on "
           "that: every model check passes, the replay rejects 611", forged)
    at = c.env_spans[0].start
    logprobs = c.logprobs[: 4 * at] + struct.pack("<f", -1.0) + c.logprobs[4 * at + 4 :]
    yield ("reject/env-logprob-not-zero", "check 2b: an environment token claims logprob -1.0 (609)",
           _with_completion(honest, i, logprobs=logprobs))
    last = c.env_spans[-1]
    past_end = EnvSpan(last.start, len(c.token_ids) - last.start)
    spans = (*c.env_spans[:-1], past_end)
    yield ("reject/env-span-ends-the-completion", "check 2b: the last environment span runs to the end, no "
           "model turn after it (609)", _with_completion(honest, i, env_spans=spans))
    yield ("reject/env-span-dropped", "check 2b: the first environment span left out, its tokens claimed as "
           "the model's: the EOS that ended the model's turn before it now stands inside a turn (609)",
           _with_completion(honest, i, env_spans=c.env_spans[1:]))


def episode_cases() -> Iterator[Vector]:
    s = _setup()
    for seq, (name, description, sub) in enumerate(_submissions(s), start=1):
        envelope = seal(WORKER, sub, run=RUN, seq=seq, ts=NOW_MS)
        inp = validation_input(s.descriptor, _games(), s.root, s.weights_root, envelope)
        yield {"name": f"validation/episodes/{name}", "kind": "validation", "description": description,
               "input": inp, "expect": check_validation(inp)}


SUITES: dict[str, Callable[[], Iterator[Vector]]] = {"rollouts-episodes": episode_cases}
