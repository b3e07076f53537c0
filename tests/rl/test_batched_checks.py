"""The validator's batched paths equal the per-row functions they replace, on arbitrary inputs:
the CPU (uint32) noise hash and the int64 one, the termination check from P(EOS) at the end only, and the
submission-wide logprobs, sampling and termination scores against one completion at a time."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.node.rl.engine import Prefill
from swarmnode.node.rl.sampling import (
    _noise_bits_int64,
    check_sampling,
    check_termination,
    check_termination_at_end,
    eos_probabilities,
    gumbel_from_keys,
    noise_bits,
    token_logprobs,
)
from swarmnode.node.rl.validation import _blocks, _token_scores, sampled_tokens
from swarmnode.protocol.messages import Completion

u32 = st.integers(0, 2**32 - 1)

@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.tuples(u32, u32), min_size=1, max_size=8), vocab=st.integers(1, 600))
def test_cpu_noise_hash_equals_the_int64_hash(keys, vocab):
    k = torch.tensor(keys, dtype=torch.int64)
    assert torch.equal(noise_bits(k, vocab), _noise_bits_int64(k, vocab))
    u = ((_noise_bits_int64(k, vocab) >> 9) * 2 + 1).to(torch.float32) * 2.0**-24
    assert torch.equal(gumbel_from_keys(keys, vocab), -torch.log(-torch.log(u)))

@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 5), max_size=10),
    probs=st.lists(st.floats(0, 1, width=32), min_size=10, max_size=10),
    eos=st.sampled_from([2, (2,), (2, 4)]),
    max_len=st.integers(1, 10),
    threshold=st.floats(0, 1),
)
def test_termination_from_the_last_probability_equals_the_full_check(tokens, probs, eos, max_len, threshold):
    full = check_termination(probs[: len(tokens)], tokens, eos, max_len, threshold)
    last = float(torch.tensor(probs[len(tokens) - 1], dtype=torch.float32)) if tokens else 0.0
    assert check_termination_at_end(last, tokens, eos, max_len, threshold) == full

def _completion(tokens: list[int], seed: int) -> Completion:
    return Completion(
        token_ids=tuple(tokens), logprobs=b"\0" * 4 * len(tokens), reward=0.0, advantage=0.0, seed=seed,
        ended_with_eos=False, proofs=(),
    )

@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    vocab=st.integers(2, 40),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.3]),
    tolerance=st.sampled_from([0.0, 1e-3, 0.5]),
    rows=st.sampled_from([1, 2, 3, 5, None]),
)
def test_submission_scores_equal_one_completion_at_a_time(data, vocab, temperature, tolerance, rows):
    """Logits near ties and tokens off the sampler included, passes of any size that cut completions
    apart: the batched scores are the per-completion functions' values exactly."""
    lengths = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=6))
    completions, prefills = [], []
    for n in lengths:
        scale = data.draw(st.sampled_from([0.01, 1.0, 8.0]))
        gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
        logits = torch.randn(n, vocab, generator=gen) * scale
        tokens = data.draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
        completions.append(_completion(tokens, data.draw(st.integers(0, 2**63 - 1))))
        prefills.append(Prefill(hidden_rows=torch.zeros(n, 1), logits=logits))
    eos = data.draw(st.sampled_from([(0,), (0, 1)]))
    sampled = [sampled_tokens(c, None, 1 << 16) for c in completions]
    scores = _token_scores(sampled, prefills, temperature, tolerance, eos, rows)
    for c, pre, logp, p_eos, sampling in zip(completions, prefills, scores.logprobs.split(lengths),
                                             scores.last_eos_probs, scores.sampling, strict=True):
        assert sampling == check_sampling(pre.logits, c.token_ids, c.seed, temperature, tolerance)
        assert torch.equal(logp, token_logprobs(pre.logits, torch.tensor(c.token_ids), temperature))
        whole = eos_probabilities(pre.logits, eos, temperature)
        assert p_eos == (float(whole[-1]) if c.token_ids else 0.0)

def test_an_off_sampler_token_is_named_at_its_own_position():
    """Mismatches are numbered within their completion, not across the submission."""
    logits = torch.tensor([[0.0, 9.0], [0.0, 9.0], [0.0, 9.0]])
    completions = [_completion([1], 1), _completion([1, 0], 2)]
    prefills = [Prefill(torch.zeros(1, 1), logits[:1]), Prefill(torch.zeros(2, 1), logits[1:])]
    sampled = [sampled_tokens(c, None, 1 << 16) for c in completions]
    scores = _token_scores(sampled, prefills, 0.0, 1e-3, (0,))
    assert scores.sampling[0].passed
    assert scores.sampling[1].mismatches == (1,)
    assert scores.sampling[1].max_gap == 9.0


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), max_size=6), rows=st.integers(1, 10))
def test_scoring_passes_are_the_submission_cut_into_bounded_blocks(lengths, rows):
    """Every block holds at most `rows` rows, only the last one fewer, and together they are the
    submission's logits in order: what bounds a pass's memory loses and reorders nothing."""
    logits = [torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * i for i, n in enumerate(lengths)]
    prefills = [Prefill(torch.zeros(n, 1), lg) for n, lg in zip(lengths, logits, strict=True)]
    blocks = list(_blocks(prefills, rows))
    assert all(len(b) == rows for b in blocks[:-1])
    assert all(0 < len(b) <= rows for b in blocks)
    whole = torch.cat(logits) if logits else torch.zeros(0, 2)
    assert torch.equal(torch.cat(blocks) if blocks else torch.zeros(0, 2), whole)
