"""The run's tokenizer (chat prompts, EOS from the model) and model building blocks (seeded build, weights
files tagged with their config, facts read from a folder)."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.model import (
    ModelFolderError,
    ModelMismatch,
    ModelRecipe,
    build_model,
    file_sha256,
    hf_config,
    load_model,
    load_weights,
    model_info,
    save_weights,
    state_dict_of,
    weight_files,
)
from swarmnode.node.rl.tokenizer import (
    IM_END,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    length_instruction,
    load_tokenizer,
    train_tokenizer,
)
from tests.tinymodel import copy_folder, tiny_folder

TINY = ModelRecipe(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)


def _config(recipe: ModelRecipe = TINY):  # type: ignore[no-untyped-def]
    return hf_config(recipe, eos_token_id=2, pad_token_id=0)


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return load_tokenizer(tiny_folder("qwen2"))


# --- tokenizer ------------------------------------------------------------------------------------------


def test_prompt_is_the_chat_with_the_assistant_turn_open(tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok, _ = tokenizer
    raw = tok.tokenizer
    chat = "<|im_start|>user\n12+7=<|im_end|>\n<|im_start|>assistant\n"
    assert raw.decode(tok.encode_prompt("12+7=")) == chat
    with_length = raw.decode(tok.encode_prompt("12+7=", target_length=50))
    assert with_length == f"<|im_start|>system\n{length_instruction(50)}<|im_end|>\n" + chat


def test_eos_and_pad_come_from_the_folder(tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok, info = tokenizer
    raw = tok.tokenizer
    assert info.eos_token_ids == (raw.convert_tokens_to_ids(IM_END),) == tok.eos_token_ids
    assert info.pad_token_id == raw.convert_tokens_to_ids(PAD_TOKEN)
    assert info.max_positions == 128 and info.vocab_size == len(raw)
    assert info.config_hash == file_sha256(tiny_folder("qwen2") / "config.json")
    assert tok.is_eos(info.eos_token_ids[0]) and not tok.is_eos(info.pad_token_id)


def test_generation_config_eos_ids_come_first_and_count(tmp_path: Path) -> None:
    """Instruct models list several EOS ids in generation_config.json: each one ends a completion."""
    folder = copy_folder("qwen2", tmp_path / "m")
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(generation | {"eos_token_id": [5, 2]}))
    tok, info = load_tokenizer(folder)
    assert info.eos_token_ids == (5, 2)
    assert tok.completion_text(tok.encode("19") + [5] + tok.encode("7")) == "19"


def test_special_ids_outside_the_vocabulary_are_refused(tmp_path: Path) -> None:
    folder = copy_folder("qwen2", tmp_path / "m")
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(generation | {"eos_token_id": 10**6}))
    with pytest.raises(ModelFolderError, match="outside the vocabulary"):
        model_info(folder)


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=40), st.text(max_size=10))
def test_completion_text_is_the_text_up_to_the_first_eos(tokenizer, body: str, tail: str) -> None:  # type: ignore[no-untyped-def]
    tok, info = tokenizer
    if any(s in body + tail for s in SPECIAL_TOKENS):
        return  # a special token's text is that token, not its characters
    ids = tok.encode(body)
    assert all(0 <= i < info.vocab_size for i in ids)
    text = unicodedata.normalize("NFC", body)  # byte-level: any text round-trips, after Qwen2's NFC
    assert tok.tokenizer.decode(ids) == text
    assert tok.completion_text(ids + [info.eos_token_ids[0]] + tok.encode(tail)) == text
    assert tok.completion_text(ids) == text


def test_trained_tokenizer_has_the_special_tokens_first_and_respects_the_vocab_bound(tmp_path: Path) -> None:
    out = train_tokenizer(["<|im_start|>user\n1+1=<|im_end|>\n2"] * 20 + ["héllo wörld"] * 5, 270, tmp_path)
    tok = json.loads((out / "tokenizer.json").read_text())
    assert [t["content"] for t in tok["added_tokens"]] == list(SPECIAL_TOKENS)
    assert [t["id"] for t in tok["added_tokens"]] == [0, 1, 2]
    assert len(tok["model"]["vocab"]) <= 270


# --- model building blocks ------------------------------------------------------------------------------


def test_build_is_seeded_and_leaves_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    a, b, c = build_model(_config(), 1), build_model(_config(), 1), build_model(_config(), 2)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (name, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters(),
                                            strict=True):
        assert torch.equal(pa, pb), name
        if pa.ndim == 2:
            assert not torch.equal(pa, pc), name
    assert a.dtype == torch.float32 and not a.config.tie_word_embeddings


def test_unknown_arch_is_refused() -> None:
    with pytest.raises(ValueError, match="'gpt2'"):
        _config(ModelRecipe(arch="gpt2"))


def test_weights_file_round_trip_and_refusal_of_another_config(tmp_path: Path) -> None:
    folder = tiny_folder("qwen2")
    model = load_model(folder)
    _, info = load_tokenizer(folder)
    path = tmp_path / "w.safetensors"
    assert save_weights(state_dict_of(model), info.config_hash, path) == file_sha256(path)
    state = load_weights(path, info.config_hash)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ModelMismatch, match="weights for model config"):
        load_weights(path, bytes(32))

    other = build_model(_config(), 0)
    foreign = tmp_path / "other.safetensors"
    save_weights(state_dict_of(other), info.config_hash, foreign)  # tagged with our hash, other shapes
    engine = TransformersEngine.from_folder(folder)
    with pytest.raises(RuntimeError, match="size mismatch"):
        engine.load_weights(foreign)


def test_loaded_folder_reproduces_the_saved_model(tmp_path: Path) -> None:
    folder = tiny_folder("qwen3")
    model = load_model(folder)
    tok, _ = load_tokenizer(folder)
    ids = torch.tensor([tok.encode_prompt("3+4=")])
    again = load_model(folder)
    assert torch.equal(model(ids).logits, again(ids).logits)


@pytest.mark.parametrize("shard", ["../model.safetensors", "sub/model.safetensors"])
def test_an_index_naming_paths_outside_the_folder_is_refused(tmp_path: Path, shard: str) -> None:
    folder = copy_folder("qwen2", tmp_path / "m")
    index = {"weight_map": {"lm_head.weight": shard}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFolderError, match="plain file names"):
        weight_files(folder)


def test_an_index_that_is_not_one_is_refused(tmp_path: Path) -> None:
    folder = copy_folder("qwen2", tmp_path / "m")
    (folder / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(ModelFolderError, match="not a safetensors index"):
        weight_files(folder)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_every_loader_tokenizes_as_the_file_says(arch):
    """transformers picks the tokenizer class from the folder's model_type (Qwen2Tokenizer rebuilds its own
    pipeline); the trained tokenizer.json states that pipeline, so `tokenizers` alone gives the same ids."""
    from tokenizers import Tokenizer

    from swarmnode.node.rl.tokenizer import load_tokenizer
    from tests.tinymodel import tiny_folder

    folder = tiny_folder(arch)
    ours, _ = load_tokenizer(folder)
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in ("12+34=", "What is 123+456? \\boxed{579}", "déjà vu, 1e5", "def f(x):\n    return x+1\n"):
        assert ours.encode(text) == raw.encode(text, add_special_tokens=False).ids, text
    assert ours.encode("123") == [ours.encode(d)[0] for d in "123"]  # digits one by one, as Qwen2 splits
