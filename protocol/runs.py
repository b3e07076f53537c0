"""Pure rules of a run descriptor (spec/rollouts.md, Accepted rollouts; spec/discovery.md, Value records).

A run has one lead trainer (`RunDescriptor.trainer`), which signs the descriptor and every checkpoint
manifest, and up to 15 `co_trainers`: the other trainers of a multi-trainer (DiLoCo) run, which may pull
accepted rollouts from validators but sign no manifest. The codec checks field types and the list's length;
`check_descriptor` checks what spans fields. An assignment's `step` packs the checkpoint version and
the worker's counter on it (`assignment_step`); credit is per (run, worker, step).
"""

from __future__ import annotations

from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.messages import EnvironmentTerms, RunDescriptor


def run_trainers(descriptor: RunDescriptor) -> tuple[bytes, ...]:
    """Every trainer of the run, the lead first: those a validator serves ACCEPTED to."""
    return (descriptor.trainer, *descriptor.co_trainers)


def run_environment(descriptor: RunDescriptor) -> EnvironmentTerms | None:
    """The environment a multi-turn run plays (spec/environments.md); None for a single-turn run."""
    return descriptor.environment[0] if descriptor.environment else None


def check_descriptor(descriptor: RunDescriptor) -> None:
    """Raise Reject unless the trainers are distinct: no co-trainer repeated, none the lead itself."""
    if descriptor.trainer in descriptor.co_trainers:
        raise Reject(Reason.RULE_VIOLATION, f"co_trainers name the lead trainer 0x{descriptor.trainer.hex()}")
    if len(set(descriptor.co_trainers)) != len(descriptor.co_trainers):
        raise Reject(Reason.RULE_VIOLATION, "co_trainers name an address more than once")


# --- assignment steps ----------------------------------------------------------------------------

ASSIGNMENT_STEP_BITS = 32


def assignment_step(checkpoint_version: int, counter: int) -> int:
    """The `step` fed to task assignment and sampling seeds: a worker's n-th submission on a version.

    Binding the version in means a worker cannot replay an old easy assignment on a new policy;
    the counter lets one worker submit several batches per version (the run caps how many:
    `RunDescriptor.max_submissions_per_version`).
    """
    if not 0 <= counter < 2**ASSIGNMENT_STEP_BITS:
        raise ValueError(f"submission counter {counter} out of range")
    return (checkpoint_version << ASSIGNMENT_STEP_BITS) | counter


def step_counter(step: int) -> int:
    """The counter part of an assignment step (its low 32 bits)."""
    return step & ((1 << ASSIGNMENT_STEP_BITS) - 1)


def step_version(step: int) -> int:
    """The checkpoint version an assignment step is bound to (its high bits)."""
    return step >> ASSIGNMENT_STEP_BITS
