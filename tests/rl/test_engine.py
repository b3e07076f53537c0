"""TransformersEngine: generation rows and logprobs equal a teacher-forced prefill; hot swap; speed."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.node.rl.engine import InferenceEngine, TransformersEngine, TurnRequest, truncate_at_eos
from swarmnode.node.rl.model import ModelMismatch, build_model, save_weights, state_dict_of
from swarmnode.node.rl.sampling import check_sampling, check_termination, eos_probabilities
from tests.tinymodel import eos_prone
from tests.tinymodel import tiny_engine as fresh_engine

ARCHS = ("qwen2", "llama", "qwen3")


@pytest.fixture(scope="module")
def prompt(tiny_engine) -> list[int]:
    return tiny_engine.tokenizer.encode_prompt("12+7=")


@pytest.fixture(scope="module", params=ARCHS)
def arch_engine(request) -> TransformersEngine:
    """Every supported architecture, EOS-prone so that groups mix EOS endings with full-length ones."""
    return eos_prone(fresh_engine(request.param))


def _lm_head_inputs(engine: TransformersEngine, ids: list[int]) -> torch.Tensor:
    """What lm_head receives in a plain full forward, captured by a hook (independent of our code path)."""
    seen: list[torch.Tensor] = []
    handle = engine.model.lm_head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            engine.model(input_ids=torch.tensor([ids]))
    finally:
        handle.remove()
    return seen[0][0]


def test_engine_satisfies_the_protocol(tiny_engine):
    assert isinstance(tiny_engine, InferenceEngine)
    info = tiny_engine.info
    assert info.eos_token_ids and tiny_engine.tokenizer.eos_token_ids == info.eos_token_ids


def test_generated_rows_are_the_lm_head_input_of_a_full_forward(arch_engine):
    engine = arch_engine
    prompt = engine.tokenizer.encode_prompt("12+7=")
    group = engine.generate_group(prompt, 4, [1, 2, 3, 4], 12, 1.0)
    for c in group:
        full = _lm_head_inputs(engine, prompt + list(c.tokens))
        expected = full[len(prompt) - 1 : len(prompt) - 1 + len(c.tokens)]
        assert c.hidden_rows.shape == (len(c.tokens), engine.info.hidden_size)
        assert c.hidden_rows.dtype == torch.float32
        torch.testing.assert_close(c.hidden_rows, expected, atol=1e-5, rtol=1e-5)


def test_generation_matches_prefill_and_passes_the_checks(arch_engine):
    engine = arch_engine
    prompt = engine.tokenizer.encode_prompt("12+7=")
    eos = engine.info.eos_token_ids
    group = engine.generate_group(prompt, 8, list(range(100, 108)), 16, 1.0)
    assert any(c.ended_with_eos for c in group) and not all(c.ended_with_eos for c in group)
    prefills = engine.prefill_batch([(prompt, c.tokens) for c in group])
    for c, pre in zip(group, prefills, strict=True):
        assert c.ended_with_eos == (c.tokens[-1] in eos)
        assert not set(c.tokens[:-1]) & set(eos)
        assert c.ended_with_eos or len(c.tokens) == 16
        torch.testing.assert_close(c.hidden_rows, pre.hidden_rows, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            c.logprobs,
            torch.log_softmax(pre.logits, -1).gather(-1, torch.tensor(c.tokens)[:, None])[:, 0],
            atol=1e-5,
            rtol=1e-5,
        )
        assert check_sampling(pre.logits, c.tokens, c.seed, 1.0).passed
        assert check_termination(eos_probabilities(pre.logits, eos, 1.0), c.tokens, eos, 16).passed
    single = engine.prefill(prompt, group[0].tokens)
    torch.testing.assert_close(single.logits, prefills[0].logits, atol=1e-5, rtol=1e-5)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_turns_of_different_contexts_in_one_batch_are_each_turn_alone(arch_engine, data):
    """`generate_turns` left-pads contexts of different lengths into one batch: each row samples what
    `generate_group` samples for its request alone (its seed, noise positions, budget), with the same rows
    and logprobs up to float noise."""
    vocab = arch_engine.info.vocab_size
    requests = [
        TurnRequest(tuple(data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40))),
                    data.draw(st.integers(0, 2**63 - 1)), data.draw(st.integers(0, 60)),
                    data.draw(st.integers(1, 10)))
        for _ in range(data.draw(st.integers(1, 6)))
    ]
    temperature = data.draw(st.sampled_from([0.0, 0.7, 1.0]))
    together = arch_engine.generate_turns(requests, temperature)
    for r, got in zip(requests, together, strict=True):
        [alone] = arch_engine.generate_group(list(r.context), 1, [r.seed], r.max_new_tokens, temperature,
                                             r.first_position)
        assert (got.tokens, got.seed, got.ended_with_eos) == (alone.tokens, alone.seed, alone.ended_with_eos)
        torch.testing.assert_close(got.hidden_rows, alone.hidden_rows, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.logprobs, alone.logprobs, atol=1e-4, rtol=1e-4)


def test_completions_end_at_any_of_the_models_eos_ids():
    """Instruct models have several EOS ids: generation stops at the first of any of them."""
    engine = eos_prone(fresh_engine())
    prompt = engine.tokenizer.encode_prompt("12+7=")
    group = engine.generate_group(prompt, 8, list(range(100, 108)), 16, 1.0)
    ended = [c for c in group if c.ended_with_eos]
    assert ended
    (eos,) = engine.info.eos_token_ids
    other = next(t for c in group for t in c.tokens if t != eos)  # a token the model does emit
    with torch.no_grad():  # `other` becomes as likely as EOS wherever EOS was
        engine.model.lm_head.weight[other] = engine.model.lm_head.weight[eos]
    two = TransformersEngine(dataclasses.replace(engine.info, eos_token_ids=(eos, other)), engine.tokenizer,
                             engine.model)
    regrouped = two.generate_group(prompt, 8, list(range(100, 108)), 16, 1.0)
    assert any(c.tokens[-1] == other for c in regrouped)
    for c in regrouped:
        assert c.ended_with_eos == (c.tokens[-1] in (eos, other))
        assert not {eos, other} & set(c.tokens[:-1])


def test_truncate_at_eos():
    assert truncate_at_eos([5, 6, 2, 7, 2], (2,)) == (5, 6, 2)
    assert truncate_at_eos([5, 9, 2], (2, 9)) == (5, 9)
    assert truncate_at_eos([5, 6], (2,)) == (5, 6)
    assert truncate_at_eos([], (2,)) == ()


def test_forged_token_fails_the_sampling_check(tiny_engine, prompt):
    c = tiny_engine.generate_group(prompt, 1, [9], 10, 1.0)[0]
    forged = list(c.tokens)
    forged[0] = (forged[0] + 1) % tiny_engine.info.vocab_size
    pre = tiny_engine.prefill(prompt, forged)
    assert 0 in check_sampling(pre.logits, forged, c.seed, 1.0).mismatches


def test_group_is_reproducible_from_its_seeds(tiny_engine, prompt):
    a = tiny_engine.generate_group(prompt, 4, [5, 6, 7, 8], 10, 1.0)
    b = tiny_engine.generate_group(prompt, 4, [5, 6, 7, 8], 10, 1.0)
    c = tiny_engine.generate_group(prompt, 4, [15, 16, 17, 18], 10, 1.0)
    assert [x.tokens for x in a] == [x.tokens for x in b] != [x.tokens for x in c]
    assert tiny_engine.generate_group(prompt, 1, [6], 10, 1.0)[0].tokens == a[1].tokens  # batch-independent


def test_logprobs_for_the_trainer_carry_grad_and_match_generation(tiny_engine, prompt):
    group = tiny_engine.generate_group(prompt, 3, [1, 2, 3], 8, 0.8)
    out = tiny_engine.logprobs([prompt] * 3, [c.tokens for c in group], temperature=0.8, grad=True)
    assert out.values.shape == out.mask.shape == (3, max(len(c.tokens) for c in group))
    for i, c in enumerate(group):
        torch.testing.assert_close(out.values[i, : len(c.tokens)].detach(), c.logprobs, atol=1e-5, rtol=1e-5)
        assert int(out.mask[i].sum()) == len(c.tokens)
    out.values.sum().backward()
    assert tiny_engine.model.lm_head.weight.grad is not None
    tiny_engine.model.zero_grad(set_to_none=True)
    assert not tiny_engine.logprobs([prompt], [group[0].tokens]).values.requires_grad


def test_hot_swap_changes_outputs(tmp_path, prompt):
    engine = fresh_engine()
    original = state_dict_of(engine.model)
    before = engine.prefill(prompt, [5, 6, 7]).logits
    engine.load_weights(state_dict_of(build_model(engine.model.config, 2)))
    swapped = engine.prefill(prompt, [5, 6, 7]).logits
    assert not torch.allclose(before, swapped)
    path = tmp_path / "one.safetensors"
    save_weights(original, engine.info.config_hash, path)
    engine.load_weights(path)
    torch.testing.assert_close(engine.prefill(prompt, [5, 6, 7]).logits, before)


def test_hot_swap_refuses_weights_of_another_model_config(tmp_path, prompt):
    engine = fresh_engine()
    before = engine.prefill(prompt, [5, 6, 7]).logits
    path = tmp_path / "other.safetensors"
    save_weights(state_dict_of(build_model(engine.model.config, 2)), b"\x07" * 32, path)
    with pytest.raises(ModelMismatch, match="weights for model config"):
        engine.load_weights(path)
    torch.testing.assert_close(engine.prefill(prompt, [5, 6, 7]).logits, before)  # nothing changed
    wrong_shape = {k: v[..., :1] for k, v in state_dict_of(engine.model).items()}
    with pytest.raises(RuntimeError):  # strict: a state dict of other shapes is refused by torch
        engine.load_weights(wrong_shape)


def test_input_validation(tiny_engine, prompt):
    with pytest.raises(ValueError):
        tiny_engine.generate_group(prompt, 2, [1], 4, 1.0)
    with pytest.raises(ValueError):
        tiny_engine.generate_group(prompt, 1, [1], tiny_engine.info.max_positions, 1.0)
    with pytest.raises(ValueError):
        tiny_engine.generate_group(prompt, 1, [1], 0, 1.0)
    with pytest.raises(ValueError):
        tiny_engine.generate_group([], 1, [1], 4, 1.0)
    with pytest.raises(ValueError):
        tiny_engine.prefill([], [5])
    with pytest.raises(ValueError):
        tiny_engine.prefill(prompt, [5] * tiny_engine.info.max_positions)
    with pytest.raises(ValueError):
        tiny_engine.logprobs([prompt], [[5], [6]])


def test_group_of_eight_is_fast_on_the_default_model(prompt):
    """8 x 16 tokens took 19 ms idle and 26 ms on a loaded 2-core box with one torch thread (two threads
    spin against other processes: 220 ms median there), so the bound has a wide margin; best of 5."""
    engine = fresh_engine()  # the devnet's default size (`model init --size tiny`)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine.generate_group(prompt, 8, list(range(8)), 16, 1.0)  # warm-up
        times = []
        for _ in range(5):
            start = time.perf_counter()
            engine.generate_group(prompt, 8, list(range(8)), 16, 1.0)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    assert min(times) < 0.5
