"""Fair judging (spec/validation.md): a validator's judge serves workers round-robin, oldest first per
worker, so identities flooding its queue cannot push an honest worker's submission to the back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.node.validator.fairness import RoundRobin
from swarmnode.node.validator.store_rows import PendingItem


def item(i: int, worker: int) -> PendingItem:
    return PendingItem(i, i.to_bytes(32, "big"), worker.to_bytes(20, "big"), 0, 1, 0, 100)


def drain(queue: list[PendingItem], turns: RoundRobin) -> list[PendingItem]:
    order = []
    while queue:
        chosen = turns.pick(queue)
        turns.served(chosen.worker)
        queue.remove(chosen)
        order.append(chosen)
    return order


def test_a_flood_from_four_identities_does_not_push_an_honest_submission_back() -> None:
    """Issue #31: 4 identities x 10 submissions put an honest submission 33rd in line (FIFO)."""
    queue = [item(i, 1 + i % 4) for i in range(40)] + [item(40, 99)]
    order = drain(queue, RoundRobin())
    assert [x.worker for x in order].index((99).to_bytes(20, "big")) <= 4


@settings(max_examples=100, deadline=None)
@given(workers=st.lists(st.integers(1, 12), min_size=1, max_size=120))
def test_each_round_serves_every_waiting_worker_once_oldest_first(workers: list[int]) -> None:
    queue = [item(i, w) for i, w in enumerate(workers)]
    order = drain(list(queue), RoundRobin())
    assert sorted(x.id for x in order) == list(range(len(workers)))
    for w in set(workers):  # per worker: arrival order
        ids = [x.id for x in order if x.worker == w.to_bytes(20, "big")]
        assert ids == sorted(ids)
    # no worker gets a second turn while another that had items from the start still waits for its first
    first_turn = {}
    for position, x in enumerate(order):
        first_turn.setdefault(x.worker, position)
    assert max(first_turn.values()) == len(first_turn) - 1


def test_memory_of_turns_is_bounded() -> None:
    turns = RoundRobin(capacity=8)
    for w in range(100):
        turns.served(w.to_bytes(20, "big"))
    assert len(turns._last) == 8
