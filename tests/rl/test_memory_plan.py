"""`plan-memory`: exact parameter counts on the meta device, the per-rank plan, the CLI."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, GPT2Config, PretrainedConfig, Qwen2Config

from swarmnode.node.cli.plan import plan_memory as plan_command
from swarmnode.node.rl.memory_plan import (
    MAX_LAYERS,
    ParameterCounts,
    count_parameters,
    min_ranks,
    optimizer_bytes_per_param,
    plan_memory,
)
from swarmnode.node.rl.model import ModelRecipe, hf_config
from swarmnode.node.rl.sampling import token_logprobs

ARCHS = ("qwen2", "llama", "qwen3")
GIB = 1 << 30


def tiny_config(arch: str = "qwen2", tied: bool = False, **sizes: int) -> PretrainedConfig:
    config = hf_config(ModelRecipe(arch=arch, **sizes), eos_token_id=1, pad_token_id=0)
    config.tie_word_embeddings = tied
    return config


def qwen25_32b_config() -> PretrainedConfig:
    return Qwen2Config(hidden_size=5120, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                       intermediate_size=27648, vocab_size=152064, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def q32() -> ParameterCounts:
    return count_parameters(qwen25_32b_config())


# --- counting ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tied", [False, True])
def test_counts_equal_the_instantiated_model(arch: str, tied: bool) -> None:
    config = tiny_config(arch, tied)
    real = AutoModelForCausalLM.from_config(config)
    counts = count_parameters(config)
    assert counts.total == sum(p.numel() for p in real.parameters())
    assert counts.layers == tuple(sum(p.numel() for p in layer.parameters()) for layer in real.model.layers)
    assert counts.tied_embeddings is tied
    embedding = config.vocab_size * config.hidden_size
    assert counts.root == embedding * (1 if tied else 2) + config.hidden_size  # + the final norm


@settings(max_examples=15, deadline=None)
@given(arch=st.sampled_from(ARCHS), tied=st.booleans(), heads=st.integers(1, 4), group=st.integers(1, 2),
       head_dim=st.sampled_from([4, 8]), layers=st.integers(1, 3), intermediate=st.integers(1, 40),
       vocab=st.integers(2, 70))
def test_counts_equal_the_instantiated_model_for_any_shape(
    arch: str, tied: bool, heads: int, group: int, head_dim: int, layers: int, intermediate: int, vocab: int
) -> None:
    kv_heads = heads
    heads *= group
    config = tiny_config(arch, tied, vocab_size=vocab, hidden_size=heads * head_dim,
                         intermediate_size=intermediate, num_layers=layers, num_heads=heads,
                         num_kv_heads=kv_heads)
    with torch.random.fork_rng(devices=[]):
        real = AutoModelForCausalLM.from_config(config)
    counts = count_parameters(config)
    assert counts.total == sum(p.numel() for p in real.parameters())
    layers_real = [sum(p.numel() for p in layer.parameters()) for layer in real.model.layers]
    assert counts.largest_layer == max(layers_real)


def test_counting_leaves_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    count_parameters(tiny_config("qwen3"))
    assert torch.equal(torch.random.get_rng_state(), before)


def test_qwen25_32b_shape_counts_32_8b(q32: ParameterCounts) -> None:
    h, kv, inter, vocab = 5120, 1024, 27648, 152064
    # q, k, v carry biases in Qwen2; o_proj does not; two norms per layer
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
    assert q32.layers == (layer,) * 64
    assert q32.root == 2 * vocab * h + h
    assert q32.total == 32_763_876_352
    assert abs(q32.total - 32.8e9) < 0.05e9


def test_an_unsupported_architecture_is_refused() -> None:
    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        count_parameters(GPT2Config())


@pytest.mark.parametrize("layers", [0, -1, MAX_LAYERS + 1])
def test_a_layer_count_out_of_bounds_is_refused_before_building(layers: int) -> None:
    config = tiny_config()
    config.num_hidden_layers = layers
    with pytest.raises(ValueError, match="num_hidden_layers"):
        count_parameters(config)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("hidden_size", -64, "hidden_size"), ("intermediate_size", 0, "intermediate_size"),
    ("vocab_size", 0, "vocab_size"), ("num_attention_heads", 128, "head_dim"),
    ("pad_token_id", 512, "pad_token_id"), ("num_key_value_heads", -2, "num_key_value_heads"),
])
def test_sizes_no_model_has_are_refused_by_name(field: str, value: int, match: str) -> None:
    config = tiny_config()
    setattr(config, field, value)
    config.head_dim = config.hidden_size // config.num_attention_heads
    with pytest.raises(ValueError, match=match):
        count_parameters(config)


def test_a_negative_pad_index_counts_as_nn_embedding_takes_it() -> None:
    config = tiny_config()
    config.pad_token_id = -1  # old Llama conversions
    assert count_parameters(config).total == count_parameters(tiny_config()).total


@pytest.mark.parametrize(("field", "value"), [("hidden_act", "nonexistent"),
                                               ("rope_parameters", {"rope_type": "bogus"})])
def test_a_config_that_builds_no_model_is_refused(field: str, value: object) -> None:
    config = tiny_config()
    setattr(config, field, value)
    with pytest.raises(ValueError, match="does not build a qwen2 model"):
        count_parameters(config)


# --- the plan ---------------------------------------------------------------------------------------------


def test_state_costs_16_bytes_per_parameter_in_either_dtype() -> None:
    assert optimizer_bytes_per_param("bf16") == 12  # fp32 moments + fp32 master copy
    assert optimizer_bytes_per_param("fp32") == 8
    counts = count_parameters(tiny_config())
    for dtype in ("bf16", "fp32"):
        assert plan_memory(counts, 1, 1, dtype).single_process.state == 16 * counts.total


@settings(max_examples=60, deadline=None)
@given(nproc=st.integers(1, 4096), tokens=st.integers(1, 1 << 16), dtype=st.sampled_from(["bf16", "fp32"]))
def test_sharded_parts_scale_as_one_over_n(q32: ParameterCounts, nproc: int, tokens: int, dtype: str) -> None:
    one = plan_memory(q32, 1, tokens, dtype).per_rank
    many = plan_memory(q32, nproc, tokens, dtype).per_rank
    for part in ("weights", "gradients", "optimizer"):
        assert getattr(many, part) == math.ceil(getattr(one, part) / nproc)
    for part in ("gathered", "grad_buffer", "activations", "logits"):
        assert getattr(many, part) == getattr(one, part)
    assert many.state * nproc - one.state < 3 * nproc


def test_unsharded_transients_follow_the_largest_layer_and_the_root(q32: ParameterCounts) -> None:
    plan = plan_memory(q32, 8, 1, "bf16")
    assert plan.per_rank.gathered == (2 * q32.largest_layer + q32.root) * 2
    assert plan.per_rank.grad_buffer == q32.root * (2 + 4)  # the root is the larger group here
    assert plan_memory(q32, 8, 1, "fp32").per_rank.grad_buffer == q32.root * 4
    single = plan.single_process
    assert single.gathered == single.grad_buffer == 0


def test_32b_does_not_fit_one_80gb_device_but_fits_eight(q32: ParameterCounts) -> None:
    one, eight = plan_memory(q32, 1, 1024, "bf16"), plan_memory(q32, 8, 1024, "bf16")
    assert one.single_process.state > 80 * GIB and not one.fits(80 * GIB)
    assert eight.per_rank.state <= 80 * GIB
    assert eight.per_rank.state * 8 == pytest.approx(one.single_process.state, rel=1e-9)
    # c for Qwen2.5-32B in bf16: 16h + 4q + 4kv + 8I (+ tiny terms), over h
    assert eight.activation_bytes_per_token_layer / 5120 == pytest.approx(64.0, abs=0.05)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 1 << 14), budget_gib=st.integers(1, 200),
       dtype=st.sampled_from(["bf16", "fp32"]))
def test_min_ranks_is_the_fewest_that_fit(
    q32: ParameterCounts, tokens: int, budget_gib: int, dtype: str
) -> None:
    budget = budget_gib * GIB
    n = min_ranks(q32, tokens, dtype, budget)
    if n is None:
        unsharded = plan_memory(q32, 1 << 40, tokens, dtype).per_rank
        assert unsharded.total - unsharded.state >= budget
    else:
        assert plan_memory(q32, n, tokens, dtype).fits(budget)
        assert n == 1 or not plan_memory(q32, n - 1, tokens, dtype).fits(budget)


@pytest.mark.parametrize(("nproc", "tokens", "dtype", "match"), [
    (0, 1, "bf16", "nproc"), (-3, 1, "bf16", "nproc"), (1, 0, "bf16", "token"), (1, 1, "fp16", "dtype"),
])
def test_bad_plan_arguments_are_refused(nproc: int, tokens: int, dtype: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_memory(count_parameters(tiny_config()), nproc, tokens, dtype)


def _saved_activation_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes autograd keeps for backward over a forward and the GRPO log-probabilities (parameters aside)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(model(input_ids=ids).logits, ids, 1.0)
    return sum(saved.values())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("dtype", "name"), [(torch.bfloat16, "bf16"), (torch.float32, "fp32")])
def test_activation_estimate_matches_what_autograd_saves(arch: str, dtype: torch.dtype, name: str) -> None:
    # head_dim x heads != hidden, kv heads < heads: every term of the formula is exercised
    config = tiny_config(arch, vocab_size=700, hidden_size=96, intermediate_size=200, num_layers=2,
                         num_heads=4, num_kv_heads=2)
    config.head_dim = 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        ids = torch.randint(0, config.vocab_size, (2, 64))
    plan = plan_memory(count_parameters(config), 1, ids.numel(), name).single_process
    measured = _saved_activation_bytes(model, ids)
    assert measured == pytest.approx(plan.activations + plan.logits, rel=0.01)


# --- the CLI ----------------------------------------------------------------------------------------------


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(plan_command, [str(a) for a in args])


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    tiny_config("qwen3").save_pretrained(folder)  # config.json only: no weights needed
    return folder


def test_cli_json_prints_the_plan(tiny_folder: Path) -> None:
    result = run("--model", tiny_folder, "--nproc", 4, "--micro-batch-tokens", 128, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    counts = count_parameters(tiny_config("qwen3"))
    plan = plan_memory(counts, 4, 128, "bf16")
    assert doc["parameters"] == counts.total
    assert doc["per_rank"]["total_bytes"] == plan.per_rank.total
    assert doc["single_process"]["state_bytes"] == 16 * counts.total
    assert doc["fits"] is True and doc["min_nproc"] == 1


def test_cli_table(tiny_folder: Path) -> None:
    result = run("--model", tiny_folder, "--nproc", 2, "--param-dtype", "fp32")
    assert result.exit_code == 0, result.output
    assert "per rank (N=2)" in result.output and "fp32 parameters" in result.output
    assert f"{count_parameters(tiny_config('qwen3')).total:,} parameters" in result.output


def test_cli_says_when_a_32b_model_needs_more_ranks(tmp_path: Path) -> None:
    qwen25_32b_config().save_pretrained(tmp_path)
    doc = json.loads(run("--model", tmp_path, "--nproc", 1, "--micro-batch-tokens", 1024, "--json").output)
    assert doc["fits"] is False and doc["min_nproc"] > 8
    assert "no N fits" in run("--model", tmp_path, "--nproc", 8, "--micro-batch-tokens", 8192).output


def _usage_error(result: Result, text: str) -> None:
    assert result.exit_code == 2, result.output
    assert text in result.output
    assert isinstance(result.exception, SystemExit)  # a message, no traceback


def test_cli_refuses_bad_folders_and_counts(tmp_path: Path, tiny_folder: Path) -> None:
    _usage_error(run("--model", tmp_path / "absent", "--nproc", 1), "does not exist")
    _usage_error(run("--model", tmp_path, "--nproc", 1), "no config.json")
    GPT2Config().save_pretrained(tmp_path)
    _usage_error(run("--model", tmp_path, "--nproc", 1), "'gpt2' is not supported")
    _usage_error(run("--model", tiny_folder, "--nproc", 0), "--nproc")
    _usage_error(run("--model", tiny_folder, "--nproc", 1, "--micro-batch-tokens", 0), "--micro-batch-tokens")
    _usage_error(run("--model", tiny_folder, "--nproc", 1, "--param-dtype", "fp16"), "--param-dtype")


_hostile = st.one_of(st.integers(-(1 << 40), 1 << 40), st.floats(allow_nan=True), st.text(max_size=5),
                     st.none(), st.lists(st.integers(0, 3), max_size=2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["hidden_size", "num_hidden_layers", "num_attention_heads",
                              "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim",
                              "tie_word_embeddings", "model_type", "hidden_act", "rope_parameters",
                              "pad_token_id"]),
       value=_hostile)
def test_cli_never_tracebacks_on_a_hostile_config(field: str, value: object) -> None:
    doc = tiny_config("qwen3").to_dict()
    doc[field] = value
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(doc))
        result = run("--model", folder, "--nproc", 2, "--json")
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 0:
        assert json.loads(result.output)["parameters"] > 0
    else:
        assert isinstance(result.exception, SystemExit) and "--model" in result.output
