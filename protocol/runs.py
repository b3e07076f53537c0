"""Pure rules of a run descriptor (spec/rollouts.md, Accepted rollouts; spec/discovery.md, Value records).

A run has one lead trainer (`RunDescriptor.trainer`), which signs the descriptor and every checkpoint
manifest, and up to 15 `co_trainers`: the other trainers of a multi-trainer (DiLoCo) run, which may pull
accepted rollouts from validators but sign no manifest. The codec checks field types and the list's length;
`check_descriptor` checks what spans fields.
"""

from __future__ import annotations

from protocol.errors import Reason, Reject
from protocol.messages import RunDescriptor


def run_trainers(descriptor: RunDescriptor) -> tuple[bytes, ...]:
    """Every trainer of the run, the lead first: those a validator serves ACCEPTED to."""
    return (descriptor.trainer, *descriptor.co_trainers)


def check_descriptor(descriptor: RunDescriptor) -> None:
    """Raise Reject unless the trainers are distinct: no co-trainer repeated, none the lead itself."""
    if descriptor.trainer in descriptor.co_trainers:
        raise Reject(Reason.RULE_VIOLATION, f"co_trainers name the lead trainer 0x{descriptor.trainer.hex()}")
    if len(set(descriptor.co_trainers)) != len(descriptor.co_trainers):
        raise Reject(Reason.RULE_VIOLATION, "co_trainers name an address more than once")
