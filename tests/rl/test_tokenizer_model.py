"""Tokenizer round trips; model build is seeded, side-effect free, and checkpoints are self-describing."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from node.rl.engine import TransformersEngine
from node.rl.model import (
    ModelConfig,
    build_model,
    config_json,
    file_sha256,
    load_checkpoint,
    load_model,
    model_config_hash,
    save_checkpoint,
    state_dict_of,
)
from node.rl.tokenizer import (
    BOS_ID,
    EOS_ID,
    UNK_ID,
    VOCAB_SIZE,
    completion_text,
    decode,
    encode,
    encode_prompt,
)

from .conftest import TINY


def test_tokenizer_round_trip_and_specials():
    text = "12+7=19 \\boxed{\\frac{1}{2}} def f(x): return x**2"
    assert decode(encode(text)) == text
    assert encode_prompt("1+1=")[0] == BOS_ID
    assert encode("7", eos=True)[-1] == EOS_ID
    assert max(encode("~ ")) < VOCAB_SIZE == 99
    assert encode("é") == [UNK_ID] and decode([UNK_ID]) == "\ufffd"
    assert completion_text(encode("19", eos=True) + encode("junk")) == "19"
    with pytest.raises(ValueError):
        decode([VOCAB_SIZE])


def test_config_hash_is_canonical_and_pinned():
    assert config_json(ModelConfig()) == json.dumps(
        json.loads(config_json(ModelConfig())), sort_keys=True, separators=(",", ":")
    )
    # Pinned: changing the default architecture must be a deliberate act (it invalidates base.safetensors).
    assert model_config_hash(ModelConfig()).hex() == PINNED_CONFIG_HASH
    assert model_config_hash(TINY) != model_config_hash(ModelConfig())


PINNED_CONFIG_HASH = "2028c38f9692ddbc284c4f5df4270a222808a2c58148be5443127c105b9b91d0"


def test_build_is_seeded_and_leaves_global_rng_alone():
    before = torch.random.get_rng_state()
    a, b, c = build_model(TINY, 1), build_model(TINY, 1), build_model(TINY, 2)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (name, pa), (_, pb), (_, pc) in zip(
        a.named_parameters(), b.named_parameters(), c.named_parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if pa.ndim == 2:
            assert not torch.equal(pa, pc), name
    assert a.dtype == torch.float32 and not a.config.tie_word_embeddings


def test_checkpoint_round_trip(tmp_path):
    model = build_model(TINY, 3)
    path = tmp_path / "m.safetensors"
    digest = save_checkpoint(state_dict_of(model), TINY, path)
    assert digest == file_sha256(path)
    cfg, state = load_checkpoint(path)
    assert cfg == TINY and all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    cfg2, loaded = load_model(path)
    ids = torch.tensor([encode_prompt("3+4=")])
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_checkpoint_without_or_with_tampered_config_is_refused(tmp_path):
    state = state_dict_of(build_model(TINY, 3))
    bare = tmp_path / "bare.safetensors"
    save_file(state, str(bare))
    with pytest.raises(ValueError, match="no swarmnode.model_config"):
        load_checkpoint(bare)
    forged = tmp_path / "forged.safetensors"
    save_file(
        state,
        str(forged),
        metadata={"swarmnode.model_config": config_json(TINY), "swarmnode.model_config_hash": "00" * 32},
    )
    with pytest.raises(ValueError, match="does not match"):
        load_checkpoint(forged)


def test_engine_refuses_checkpoint_of_another_config(tmp_path):
    other = ModelConfig(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    path = tmp_path / "other.safetensors"
    save_checkpoint(state_dict_of(build_model(other, 0)), other, path)
    with pytest.raises(ValueError, match="another model config"):
        TransformersEngine.from_seed(TINY, 0).load_weights(path)


def test_hf_dir_loads_in_transformers_with_the_same_weights(tmp_path):
    """The layout VLLMEngine hands to vLLM: config.json naming the architecture plus model.safetensors."""
    from transformers import AutoModelForCausalLM

    from node.rl.model import write_hf_dir

    state = state_dict_of(build_model(TINY, 4))
    directory = write_hf_dir(state, TINY, tmp_path / "hf")
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    loaded = AutoModelForCausalLM.from_pretrained(str(directory))
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
