"""VLLMEngine on a GPU (skipped without CUDA and vllm): our sampler inside vLLM, rows that match a prefill.

Never run on the machine this was written on (no GPU, no vllm); run it on the lent GPU per
../shared/gpu/VLLM.md with `pytest -m gpu tests/rl/test_vllm_engine.py`.
"""

from __future__ import annotations

import pytest
import torch

from node.rl.sampling import check_sampling
from node.rl.tokenizer import encode_prompt

from .conftest import ASSETS

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("vllm")

from node.rl.vllm_engine import VLLMEngine  # noqa: E402

PROMPT = encode_prompt("12+7=")
BF16_SAMPLING_TOLERANCE = 0.1  # bf16 logits; to be replaced by the calibrated value once measured


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> VLLMEngine:
    return VLLMEngine(ASSETS / "base.safetensors", workdir=tmp_path_factory.mktemp("vllm"))


def test_same_seeds_same_tokens_and_rows_match_prefill(engine):
    seeds = list(range(16))
    a = engine.generate_group(PROMPT, 16, seeds, 16, 1.0)
    b = engine.generate_group(PROMPT, 16, seeds, 16, 1.0)
    assert [c.tokens for c in a] == [c.tokens for c in b]
    prefills = engine.prefill_batch([(PROMPT, c.tokens) for c in a])
    for c, pre in zip(a, prefills, strict=True):
        assert c.hidden_rows.shape == pre.hidden_rows.shape
        rel = (c.hidden_rows - pre.hidden_rows).norm() / pre.hidden_rows.norm()
        assert rel < 0.02, rel
        assert check_sampling(pre.logits, c.tokens, c.seed, 1.0, BF16_SAMPLING_TOLERANCE).passed


def test_toploc_proofs_from_vllm_rows_verify(engine):
    toploc = pytest.importorskip("crypto.toploc")
    for c in engine.generate_group(PROMPT, 8, list(range(8)), 16, 1.0):
        pre = engine.prefill(PROMPT, c.tokens)
        checks = toploc.verify_proofs(pre.hidden_rows, toploc.build_proofs(c.hidden_rows))
        assert all(ch.passed for ch in checks)


def test_hot_swap_changes_outputs(engine):
    from node.rl.model import build_model, state_dict_of

    before = [c.tokens for c in engine.generate_group(PROMPT, 8, list(range(8)), 16, 1.0)]
    engine.load_weights(state_dict_of(build_model(engine.config, seed=123)))
    after = [c.tokens for c in engine.generate_group(PROMPT, 8, list(range(8)), 16, 1.0)]
    assert before != after
    engine.load_weights(ASSETS / "base.safetensors")
    assert [c.tokens for c in engine.generate_group(PROMPT, 8, list(range(8)), 16, 1.0)] == before
