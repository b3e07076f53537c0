"""An honest generation's TOPLOC proofs verify against the engine's own teacher-forced prefill."""

from __future__ import annotations

import pytest
import torch

toploc = pytest.importorskip("swarmnode.crypto.toploc")


@pytest.fixture(scope="module")
def prompt(tiny_engine) -> list[int]:
    return tiny_engine.tokenizer.encode_prompt("40+2=")


def test_honest_generation_proofs_verify_against_prefill(tiny_engine, prompt):
    group = tiny_engine.generate_group(prompt, 4, [11, 12, 13, 14], 40, 1.0)
    assert any(len(c.tokens) > 32 for c in group)  # some long enough for 2 chunks
    prefills = tiny_engine.prefill_batch([(prompt, c.tokens) for c in group])
    for c, pre in zip(group, prefills, strict=True):
        proofs = toploc.build_proofs(c.hidden_rows, k=128, chunk=32)
        checks = toploc.verify_proofs(pre.hidden_rows, proofs, k=128, chunk=32)
        assert len(checks) == -(-len(c.tokens) // 32)
        assert all(ch.passed and ch.exp_mismatches == 0 for ch in checks)


def test_proofs_from_another_model_fail(tiny_engine, prompt):
    c = tiny_engine.generate_group(prompt, 1, [3], 32, 1.0)[0]
    fake_rows = c.hidden_rows + 0.5 * torch.randn(
        c.hidden_rows.shape, generator=torch.Generator().manual_seed(0)
    )
    proofs = toploc.build_proofs(fake_rows, k=128, chunk=32)
    pre = tiny_engine.prefill(prompt, c.tokens)
    assert not all(ch.passed for ch in toploc.verify_proofs(pre.hidden_rows, proofs, k=128, chunk=32))
