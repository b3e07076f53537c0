"""protocol/runs.py and the RunDescriptor's appended fields (`co_trainers`, `max_submissions_per_version`):
the codec round trip, the bounds and the trainer rules."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from swarmnode.protocol.codec import decode, encode, to_wire
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.messages import (
    DEFAULT_MAX_SUBMISSIONS_PER_VERSION,
    MAX_SUBMISSIONS_PER_VERSION_LIMIT,
    RunDescriptor,
)
from swarmnode.protocol.runs import check_descriptor, run_trainers
from tests.conformance.keys import vector_identity
from tests.conformance.samples import every_message

LEAD, CO_A, CO_B = (vector_identity(n).address for n in (1, 3, 4))


def descriptor(*co_trainers: bytes) -> RunDescriptor:
    sample = next(x for x in every_message() if isinstance(x, RunDescriptor))
    assert sample.trainer == LEAD
    return dataclasses.replace(sample, co_trainers=co_trainers)


# --- codec ---------------------------------------------------------------------------------------


def test_co_trainers_round_trip_after_created_ms():
    message = descriptor(CO_A, CO_B)
    data = encode(message)
    assert decode(RunDescriptor, data) == message
    assert list(to_wire(message))[-3:] == ["created_ms", "co_trainers", "max_submissions_per_version"]


def test_a_descriptor_without_co_trainers_round_trips_and_encodes_an_empty_list():
    sample = descriptor()
    before = [getattr(sample, f.name) for f in dataclasses.fields(sample)][:-2]  # the fields up to created_ms
    positional = RunDescriptor(*before)
    assert positional == sample and positional.co_trainers == ()
    assert positional.max_submissions_per_version == DEFAULT_MAX_SUBMISSIONS_PER_VERSION
    data = encode(positional)
    assert decode(RunDescriptor, data) == positional
    assert to_wire(positional)["co_trainers"] == []
    assert to_wire(positional)["max_submissions_per_version"] == DEFAULT_MAX_SUBMISSIONS_PER_VERSION


@pytest.mark.parametrize("field", ["co_trainers", "max_submissions_per_version"])
def test_the_field_is_required_on_the_wire(field):
    """The default serves constructors only: canonical bytes always carry the field (one spelling)."""
    wire = to_wire(descriptor())
    del wire[field]
    with pytest.raises(Reject) as err:
        decode(RunDescriptor, msgpack.packb(wire, use_bin_type=True))
    assert err.value.reason == Reason.MISSING_FIELD


@pytest.mark.parametrize("bound", [1, 64, MAX_SUBMISSIONS_PER_VERSION_LIMIT])
def test_submissions_per_version_within_its_range_round_trip(bound):
    message = dataclasses.replace(descriptor(), max_submissions_per_version=bound)
    assert decode(RunDescriptor, encode(message)) == message


@pytest.mark.parametrize("bound", [0, MAX_SUBMISSIONS_PER_VERSION_LIMIT + 1, 2**32, 2**64 - 1])
def test_submissions_per_version_outside_its_range_is_refused(bound):
    """Zero would forbid every submission; beyond the limit, per-version records stop being bounded."""
    with pytest.raises(Reject) as err:
        encode(dataclasses.replace(descriptor(), max_submissions_per_version=bound))
    assert err.value.reason == Reason.OUT_OF_RANGE
    wire = to_wire(descriptor())
    wire["max_submissions_per_version"] = bound
    with pytest.raises(Reject) as err:
        decode(RunDescriptor, msgpack.packb(wire, use_bin_type=True))
    assert err.value.reason == Reason.OUT_OF_RANGE


def test_at_most_fifteen_co_trainers():
    many = tuple(vector_identity(n).address for n in range(10, 26))
    assert len(many) == 16
    with pytest.raises(Reject) as err:
        encode(descriptor(*many))
    assert err.value.reason == Reason.OVERSIZED
    check_descriptor(descriptor(*many[:15]))


# --- rules ---------------------------------------------------------------------------------------


def test_run_trainers_is_the_lead_then_the_co_trainers():
    assert run_trainers(descriptor()) == (LEAD,)
    assert run_trainers(descriptor(CO_A, CO_B)) == (LEAD, CO_A, CO_B)


def test_distinct_co_trainers_pass():
    check_descriptor(descriptor())
    check_descriptor(descriptor(CO_A))
    check_descriptor(descriptor(CO_B, CO_A))  # any order


@pytest.mark.parametrize(
    "co_trainers,detail",
    [
        ((CO_A, CO_A), "more than once"),
        ((CO_A, CO_B, CO_A), "more than once"),
        ((LEAD,), "lead trainer"),
        ((CO_A, LEAD), "lead trainer"),
        ((LEAD, LEAD), "lead trainer"),
    ],
)
def test_a_repeated_or_lead_co_trainer_is_rejected(co_trainers, detail):
    message = descriptor(*co_trainers)
    assert decode(RunDescriptor, encode(message)) == message  # well-formed: the codec lets it through
    with pytest.raises(Reject) as err:
        check_descriptor(message)
    assert err.value.reason == Reason.RULE_VIOLATION and detail in err.value.detail
