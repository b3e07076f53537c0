"""Shared-prompt prefill: packing a prompt's completions into one row gives each completion the rows and
logits of its own teacher-forced forward (float noise only), in the order asked, on every architecture."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.node.rl import engine as engine_module
from swarmnode.node.rl.engine import TransformersEngine, packed_layout, plan_rows
from tests.tinymodel import tiny_engine

ARCHS = ("qwen2", "llama", "qwen3")


@pytest.fixture(scope="module", params=ARCHS)
def arch_engine(request) -> TransformersEngine:
    return tiny_engine(request.param)


def _alone(engine: TransformersEngine, pairs) -> list:
    """The reference: every sequence in its own row, no mask (what prefill did before packing)."""
    saved = engine_module.PACKED_ROW_TOKENS
    engine_module.PACKED_ROW_TOKENS = 0
    try:
        return engine.prefill_batch(pairs)
    finally:
        engine_module.PACKED_ROW_TOKENS = saved


def _submission_like(draw, vocab: int, max_len: int):
    """Groups of completions sharing a prompt, groups interleaved, lengths from 0 to `max_len`."""
    token = st.integers(3, vocab - 1)
    prompts = draw(st.lists(st.lists(token, min_size=1, max_size=12), min_size=1, max_size=4))
    picks = draw(st.lists(st.integers(0, len(prompts) - 1), min_size=1, max_size=12))
    return [(prompts[p], draw(st.lists(token, min_size=0, max_size=max_len))) for p in picks]


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_shared_rows_equal_one_forward_per_sequence(arch_engine, data):
    engine = arch_engine
    pairs = _submission_like(data.draw, engine.info.vocab_size, 40)
    shared = engine.prefill_batch(pairs, batch_size=data.draw(st.integers(1, 4)))
    alone = _alone(engine, pairs)
    assert len(shared) == len(alone) == len(pairs)
    for (_, completion), got, want in zip(pairs, shared, alone, strict=True):
        assert got.hidden_rows.shape == (len(completion), engine.info.hidden_size)
        assert got.logits.shape == (len(completion), engine.info.vocab_size)
        torch.testing.assert_close(got.hidden_rows, want.hidden_rows, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(got.logits, want.logits, atol=2e-5, rtol=1e-5)


def test_generated_rows_verify_against_the_shared_prefill(tiny_engine):
    """A group as generated (KV cache) matches its shared-prompt prefill: rows and logprobs."""
    prompt = tiny_engine.tokenizer.encode_prompt("12+7=")
    group = tiny_engine.generate_group(prompt, 8, list(range(8)), 12, 1.0)
    prefills = tiny_engine.prefill_batch([(prompt, c.tokens) for c in group])
    assert len(plan_rows([(prompt, c.tokens) for c in group], engine_module.PACKED_ROW_TOKENS)) == 1
    for c, pre in zip(group, prefills, strict=True):
        torch.testing.assert_close(c.hidden_rows, pre.hidden_rows, atol=1e-5, rtol=1e-5)
        logp = torch.log_softmax(pre.logits, -1).gather(-1, torch.tensor(c.tokens)[:, None])[:, 0]
        torch.testing.assert_close(c.logprobs, logp, atol=1e-5, rtol=1e-5)


@settings(max_examples=200, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from([(5,), (5, 6), (7, 8, 9)]), st.lists(st.integers(0, 9), max_size=30)),
        max_size=20,
    ),
    limit=st.sampled_from([0, 1, 8, 40, 256]),
)
def test_plan_rows_covers_every_pair_once_within_the_limit(pairs, limit):
    rows = plan_rows(pairs, limit)
    assert sorted(m for r in rows for m in r) == list(range(len(pairs)))
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    for row in rows:
        assert row == sorted(row)
        assert len({tuple(pairs[m][0]) for m in row}) == 1
        if len(row) > 1:
            assert len(pairs[row[0]][0]) + sum(max(len(pairs[m][1]) - 1, 0) for m in row) <= limit
    if limit == 0:
        assert all(len(r) == 1 for r in rows)


@settings(max_examples=100, deadline=None)
@given(
    completions=st.lists(st.lists(st.integers(3, 9), max_size=6), min_size=1, max_size=4),
    prompt=st.lists(st.integers(3, 9), min_size=1, max_size=5),
)
def test_layout_attends_to_the_prompt_and_the_own_segment_only(completions, prompt):
    """Against the definition, position by position: a fed token of completion i sits at its own
    sequence position and sees exactly the prompt and the earlier tokens of completion i."""
    pairs = [(prompt, c) for c in completions]
    layout = packed_layout(pairs, [list(range(len(pairs)))], pad_token_id=0)
    owner = [-1] * len(prompt)  # -1: the prompt
    for i, c in enumerate(completions):
        owner += [i] * max(len(c) - 1, 0)
    width = layout.ids.shape[1]
    assert width == len(owner)
    expected_ids = list(prompt) + [t for c in completions for t in c[:-1]]
    assert layout.ids[0].tolist() == expected_ids
    for q in range(width):
        for k in range(width):
            sees = k <= q and (owner[k] == -1 or owner[k] == owner[q])
            assert bool(layout.allowed[0, q, k]) == sees
    gather, at = [], len(prompt)
    for c in completions:
        if c:
            gather += [len(prompt) - 1, *range(at, at + len(c) - 1)]
            at += len(c) - 1
    assert layout.gather.tolist() == gather
    positions = layout.positions[0].tolist()
    assert positions[: len(prompt)] == list(range(len(prompt)))
    at = len(prompt)
    for c in completions:
        assert positions[at : at + len(c) - 1] == list(range(len(prompt), len(prompt) + len(c) - 1))
        at += max(len(c) - 1, 0)


def test_prefill_refuses_what_it_refused_before(tiny_engine):
    prompt = tiny_engine.tokenizer.encode_prompt("1+1=")
    with pytest.raises(ValueError):
        tiny_engine.prefill_batch([([], [5])])
    with pytest.raises(ValueError):
        tiny_engine.prefill_batch([(prompt, [5]), (prompt, [5] * tiny_engine.info.max_positions)])
    assert tiny_engine.prefill_batch([]) == []
