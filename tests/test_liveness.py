"""The learning-signal rule (spec/rollouts.md, Learning signal): when a waiting step is starved, and what
the trainer says about it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from swarmnode.node.trainer.inbox import InboxRow
from swarmnode.node.trainer.liveness import SignalCheck, diagnosis, mean_reward, starved, usable_counts


def row(id: int, version: int, groups: int, signal: int) -> InboxRow:
    return InboxRow(id=id, digest=bytes([id]) * 32, worker=b"w" * 20, checkpoint_version=version,
                    groups=groups, signal_groups=signal)  # fmt: skip


def test_only_rows_the_step_could_take_are_counted() -> None:
    pending = [row(1, 0, 32, 0), row(2, 2, 32, 1), row(3, 3, 32, 5), row(4, 4, 32, 7)]
    assert usable_counts(pending, step=3, async_level=1) == (64, 6)  # versions 2 and 3


def test_a_step_s_worth_of_groups_without_signal_is_starved_only_after_the_wait() -> None:
    check = SignalCheck(step=0, waited_s=119.0, groups=48, signal_groups=0, need=24)
    assert not starved(check, after_s=120.0)
    assert starved(replace_waited(check, 120.0), after_s=120.0)
    assert not starved(replace_waited(check, 1e9), after_s=0.0)  # 0 turns the report off


def replace_waited(check: SignalCheck, waited_s: float) -> SignalCheck:
    return SignalCheck(check.step, waited_s, check.groups, check.signal_groups, check.need)


@given(
    groups=st.integers(0, 10_000),
    signal=st.integers(0, 10_000),
    need=st.integers(1, 1_000),
    waited=st.floats(0, 1e6),
    after=st.floats(0.001, 1e5),
)
def test_starved_means_waited_enough_on_enough_groups_with_too_little_signal(
    groups: int, signal: int, need: int, waited: float, after: float
) -> None:
    signal = min(signal, groups)
    check = SignalCheck(step=5, waited_s=waited, groups=groups, signal_groups=signal, need=need)
    assert starved(check, after) == (waited >= after and groups >= need and signal < need)


def test_the_diagnosis_names_the_cause_and_what_to_do() -> None:
    check = SignalCheck(step=0, waited_s=130.4, groups=48, signal_groups=0, need=24)
    never = diagnosis(check, 0.0)
    assert "48 groups and 0 had signal (a step needs 24)" in never and "waited 130s" in never
    assert "never solves" in never and "swarmnode tasks filter" in never and "--warm-start-pass" in never
    assert "always solves" in diagnosis(check, 1.0)
    assert "always or never solved" in diagnosis(check, 0.5)
    assert "mean reward" not in diagnosis(check, None)
    assert mean_reward([]) is None and mean_reward([0.0, 1.0]) == 0.5
