"""Shared fixtures: a tiny random-init model folder's engine (fast, exact on fp32 CPU)."""

from __future__ import annotations

import pytest

from swarmnode.node.rl.engine import TransformersEngine
from tests.tinymodel import tiny_engine as fresh_engine


@pytest.fixture(scope="module")
def tiny_engine() -> TransformersEngine:
    return fresh_engine()


