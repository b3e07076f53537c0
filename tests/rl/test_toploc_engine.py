"""An honest generation's TOPLOC proofs verify against the engine's own teacher-forced prefill."""

from __future__ import annotations

import pytest
import torch

from node.rl.tokenizer import encode_prompt

toploc = pytest.importorskip("crypto.toploc")

PROMPT = encode_prompt("40+2=")


def test_honest_generation_proofs_verify_against_prefill(tiny_engine):
    group = tiny_engine.generate_group(PROMPT, 4, [11, 12, 13, 14], 40, 1.0)  # some long enough for 2 chunks
    prefills = tiny_engine.prefill_batch([(PROMPT, c.tokens) for c in group])
    for c, pre in zip(group, prefills, strict=True):
        proofs = toploc.build_proofs(c.hidden_rows, k=128, chunk=32)
        checks = toploc.verify_proofs(pre.hidden_rows, proofs, k=128, chunk=32)
        assert len(checks) == -(-len(c.tokens) // 32)
        assert all(ch.passed and ch.exp_mismatches == 0 for ch in checks)


def test_proofs_from_another_model_fail(tiny_engine):
    c = tiny_engine.generate_group(PROMPT, 1, [3], 32, 1.0)[0]
    fake_rows = c.hidden_rows + 0.5 * torch.randn(
        c.hidden_rows.shape, generator=torch.Generator().manual_seed(0)
    )
    proofs = toploc.build_proofs(fake_rows, k=128, chunk=32)
    pre = tiny_engine.prefill(PROMPT, c.tokens)
    assert not all(ch.passed for ch in toploc.verify_proofs(pre.hidden_rows, proofs, k=128, chunk=32))
