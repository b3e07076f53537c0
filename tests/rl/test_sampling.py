"""Seeded Gumbel-max sampling, the sampling check and the termination check."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from swarmnode.node.rl.sampling import (
    TerminationFailure,
    check_sampling,
    check_termination,
    derive_seed,
    eos_probabilities,
    gumbel_noise,
    perturbed_scores,
    position_key,
    sample_tokens,
    token_logprobs,
)

EOS = 2


def _mix32_ref(x: int) -> int:
    """lowbias32 on Python ints: the reference an outside implementation would write."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _gumbel_ref(seed: int, position: int, j: int) -> float:
    d = hashlib.sha256(
        b"swarmnode/sampling/gumbel/v1" + seed.to_bytes(8, "big") + position.to_bytes(4, "big")
    )
    k0, k1 = int.from_bytes(d.digest()[0:4], "big"), int.from_bytes(d.digest()[4:8], "big")
    bits = _mix32_ref(_mix32_ref((j + k0) & 0xFFFFFFFF) ^ k1)
    u = ((bits >> 9) * 2 + 1) / 2**24
    return -math.log(-math.log(u))


def test_noise_matches_pure_python_reference():
    for seed, position in [(0, 0), (1, 5), (2**63 - 1, 1000), (123456789, 2**31)]:
        noise = gumbel_noise([seed], position, 300)[0]
        for j in (0, 1, 17, 299):
            assert noise[j].item() == pytest.approx(_gumbel_ref(seed, position, j), rel=1e-6, abs=1e-6)
        assert position_key(seed, position) == position_key(seed, position)


def test_noise_is_gumbel_distributed():
    noise = gumbel_noise(list(range(64)), 3, 4096).flatten()
    assert noise.mean().item() == pytest.approx(0.5772, abs=0.01)  # Euler-Mascheroni
    assert noise.std().item() == pytest.approx(math.pi / math.sqrt(6), abs=0.01)


def test_derive_seed_is_deterministic_and_binds_every_field():
    w, t, step = b"\x01" * 20, b"\x02" * 32, (3 << 32) | 1
    base = derive_seed("run", w, step, t, 0)
    assert base == derive_seed("run", w, step, t, 0)
    assert 0 <= base < 2**63
    others = {
        derive_seed("run2", w, step, t, 0),
        derive_seed("run", b"\x03" * 20, step, t, 0),
        derive_seed("run", w, step, b"\x04" * 32, 0),
        derive_seed("run", w, step, t, 1),
        derive_seed("run", w, step + 1, t, 0),  # another counter on the same version
        derive_seed("run", w, 4 << 32 | 1, t, 0),  # the same counter on another version
        derive_seed("ru", b"n" + w, step, t, 0),
    }  # length prefixes stop field shifting
    assert base not in others and len(others) == 7


def test_sampling_follows_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    counts = torch.zeros(4)
    for seed in range(4000):
        counts[sample_tokens(logits, [seed], 0, 1.0)] += 1
    assert torch.allclose(counts / 4000, torch.softmax(logits[0], -1), atol=0.025)
    hot = torch.zeros(4)
    for seed in range(4000):
        hot[sample_tokens(logits, [seed], 0, 2.0)] += 1
    assert torch.allclose(hot / 4000, torch.softmax(logits[0] / 2, -1), atol=0.025)


def test_sampling_is_reproducible_per_seed_and_position():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    seeds = list(range(8))
    a = sample_tokens(logits, seeds, 4, 1.0)
    assert torch.equal(a, sample_tokens(logits, seeds, 4, 1.0))
    assert not torch.equal(a, sample_tokens(logits, seeds, 5, 1.0))
    assert torch.equal(sample_tokens(logits, seeds, 4, 0.0), logits.argmax(-1))  # temperature 0: greedy


def _honest(logits: torch.Tensor, seed: int, temperature: float = 1.0) -> list[int]:
    return [int(sample_tokens(logits[p : p + 1], [seed], p, temperature)) for p in range(len(logits))]


def test_check_sampling_accepts_honest_and_names_replaced_tokens():
    logits = torch.randn(20, 99, generator=torch.Generator().manual_seed(1))
    tokens = _honest(logits, seed=42)
    assert check_sampling(logits, tokens, 42, 1.0).passed
    forged = list(tokens)
    forged[3] = (tokens[3] + 1) % 99
    forged[11] = int(logits[11].argmax()) if int(logits[11].argmax()) != tokens[11] else (tokens[11] + 1) % 99
    result = check_sampling(logits, forged, 42, 1.0)
    assert not result.passed and result.mismatches == (3, 11)
    assert not check_sampling(logits, tokens, 43, 1.0).passed  # another seed re-derives other tokens
    assert not check_sampling(logits, tokens, 42, 0.7).passed  # and so does another temperature


def test_check_sampling_tolerates_near_ties_only():
    logits = torch.randn(30, 99, generator=torch.Generator().manual_seed(2))
    tokens = _honest(logits, seed=5)
    wobble = logits + 1e-4 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(3))
    assert check_sampling(wobble, tokens, 5, 1.0, tolerance=1e-3).passed
    # Build an exact near tie at position 0: the runner-up sits 5e-4 below the winner.
    scores = perturbed_scores(logits[:1], [5], 0, 1.0)[0]
    runner_up = int(scores.topk(2).indices[1])
    tied = logits.clone()
    tied[0, runner_up] += float(scores.max() - scores[runner_up]) - 5e-4
    alt = [runner_up] + tokens[1:]
    assert check_sampling(tied, alt, 5, 1.0, tolerance=1e-3).passed
    assert check_sampling(tied, alt, 5, 1.0, tolerance=1e-4).mismatches == (0,)


def test_check_sampling_shape_errors():
    with pytest.raises(ValueError):
        check_sampling(torch.zeros(3, 5), [1, 2], 0, 1.0)
    assert check_sampling(torch.zeros(0, 5), [], 0, 1.0).passed


def test_logprobs_and_eos_probability_use_the_scaled_distribution():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert token_logprobs(logits, torch.tensor([2]), 2.0).item() == pytest.approx(
        math.log(math.exp(1.5) / (math.exp(0.5) + math.exp(1.0) + math.exp(1.5)))
    )
    assert eos_probabilities(logits, 2, 1.0).item() == pytest.approx(torch.softmax(logits, -1)[0, 2].item())


@pytest.mark.parametrize(
    ("tokens", "probs", "max_len", "expected"),
    [
        ([5, 6, EOS], [0.0, 0.0, 0.3], 8, ()),  # honest EOS
        ([5, 6, 7, 8], [0.0] * 4, 4, ()),  # ran to max length
        ([5, EOS], [0.0, 1e-7], 8, ((1, TerminationFailure.EOS_UNLIKELY),)),  # premature EOS
        (
            [5, EOS, 6],
            [0.0, 0.5, 0.0],
            8,
            ((1, TerminationFailure.EOS_NOT_LAST), (3, TerminationFailure.STOPPED_EARLY)),
        ),
        ([5, 6], [0.0, 0.0], 8, ((2, TerminationFailure.STOPPED_EARLY),)),  # cut short without EOS
        ([5, 6, 7], [0.0] * 3, 2, ((2, TerminationFailure.TOO_LONG),)),
        ([], [], 4, ((0, TerminationFailure.STOPPED_EARLY),)),
    ],
)
def test_check_termination(tokens, probs, max_len, expected):
    result = check_termination(torch.tensor(probs), tokens, EOS, max_len, threshold=1e-4)
    assert result.failures == expected and result.passed == (not expected)


def test_eos_probability_sums_over_every_eos_id():
    """Instruct models end on any of several ids: P(EOS) is the probability of ending, summed over them."""
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(4))
    probs = torch.softmax(logits / 0.7, -1)
    both = eos_probabilities(logits, (EOS, 7), 0.7)
    torch.testing.assert_close(both, probs[:, EOS] + probs[:, 7])
    torch.testing.assert_close(eos_probabilities(logits, [EOS], 0.7), eos_probabilities(logits, EOS, 0.7))
    torch.testing.assert_close(eos_probabilities(logits, (EOS, EOS), 0.7), 2 * probs[:, EOS])  # ids as given


OTHER_EOS = 9


@pytest.mark.parametrize(
    ("tokens", "probs", "expected"),
    [
        ([5, 6, OTHER_EOS], [0.0, 0.0, 0.3], ()),  # the second EOS id ends a completion too
        ([5, EOS], [0.0, 0.3], ()),
        (
            [5, OTHER_EOS, 6],
            [0.0, 0.5, 0.0],
            ((1, TerminationFailure.EOS_NOT_LAST), (3, TerminationFailure.STOPPED_EARLY)),
        ),
        ([5, EOS, OTHER_EOS], [0.0, 0.5, 0.5], ((1, TerminationFailure.EOS_NOT_LAST),)),
        ([5, OTHER_EOS], [0.0, 1e-7], ((1, TerminationFailure.EOS_UNLIKELY),)),
        ([5, 6], [0.0, 0.0], ((2, TerminationFailure.STOPPED_EARLY),)),
    ],
)
def test_check_termination_with_two_eos_ids(tokens, probs, expected):
    result = check_termination(torch.tensor(probs), tokens, (EOS, OTHER_EOS), 8, threshold=1e-4)
    assert result.failures == expected and result.passed == (not expected)
    # with only the first id, the second is an ordinary token: a completion cut short after it
    single = check_termination(torch.tensor(probs), tokens, EOS, 8, threshold=1e-4)
    if tokens[-1] == OTHER_EOS and EOS not in tokens:
        assert single.failures == ((len(tokens), TerminationFailure.STOPPED_EARLY),)
