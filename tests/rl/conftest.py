"""Shared fixtures: a tiny random model (fast, exact on fp32 CPU) and the committed base checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.rl.engine import TransformersEngine
from node.rl.model import ModelConfig

ASSETS = Path(__file__).resolve().parents[2] / "node" / "rl" / "assets"
TINY = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module")
def tiny_engine() -> TransformersEngine:
    return TransformersEngine.from_seed(TINY, seed=7)


@pytest.fixture(scope="module")
def base_engine() -> TransformersEngine:
    return TransformersEngine.from_checkpoint(ASSETS / "base.safetensors")
