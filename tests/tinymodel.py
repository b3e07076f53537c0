"""Tiny Hugging Face model folders for tests, built once per process in a temp dir.

A folder is what `swarmnode model init` writes (tokenizer trained on arithmetic chats, random weights), so
tests walk the same path as a run on a real model. Random weights are enough for engine, proof and
validation tests; tests that need a model that has learned something use the devnet's committed folder
(`node.rl.run.DEVNET_MODEL`).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

import torch

from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.modelinit import chat_texts, init_model_folder
from swarmnode.node.rl.tasks.arithmetic import DEVNET_PARAMS, generate_tasks

_ROOT = Path(tempfile.mkdtemp(prefix="swarmnode-tiny-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@cache
def tiny_folder(arch: str = "qwen2", seed: int = 7) -> Path:
    """A random-init tiny model folder of `arch` (cached per process: do not modify it)."""
    tasks = generate_tasks(DEVNET_PARAMS, 1, 1000)
    texts = chat_texts((t.prompt, t.target) for t in tasks)
    return init_model_folder(_ROOT / f"{arch}-{seed}", texts, arch=arch, seed=seed)


def tiny_engine(arch: str = "qwen2", seed: int = 7) -> TransformersEngine:
    """A fresh engine on `tiny_folder(arch, seed)` (its own weights: tests may change them)."""
    return TransformersEngine.from_folder(tiny_folder(arch, seed))


def copy_folder(arch: str, dest: Path, seed: int = 7) -> Path:
    """A private copy of a tiny folder, for tests that edit files in it."""
    return Path(shutil.copytree(tiny_folder(arch, seed), dest))


def eos_prone(engine: TransformersEngine, scale: float = 0.8) -> TransformersEngine:
    """Point the EOS rows of `engine`'s lm_head along the mean final hidden state, in place.

    A random-init model ends a completion with P(EOS) ~ 1/vocab per token, so honest EOS endings are rare;
    the hidden rows share a common direction, and EOS logits of a few units along it make short, EOS-ended
    completions common (like a trained model's answers) while keeping every other logit the model's own.
    """
    prompt = engine.tokenizer.encode_prompt("12+7=")
    rows = engine.generate_group(prompt, 4, [0, 1, 2, 3], 8, 1.0)
    mean = torch.cat([c.hidden_rows for c in rows]).mean(0)
    with torch.no_grad():
        for eos in engine.info.eos_token_ids:
            engine.model.lm_head.weight[eos] = scale * mean / mean.norm()
    return engine
