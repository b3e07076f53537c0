"""A tiny model folder whose completions end at random lengths, for tests that need groups with signal.

A random-init tiny model samples almost uniformly from its whole vocabulary: EOS comes about once in 500
tokens, so every completion runs to `max_new_tokens`, no answer is ever right, and every group's rewards
are equal (no signal: the trainer filters it out). Training the tiny model costs minutes; instead this
folder's weights are set so that the next token hardly depends on the input: one embedding coordinate is
large for every token, so after the final RMS norm the hidden state is that coordinate's direction, and
the lm_head's column for it sets a fixed distribution: EOS with probability `EOS_PROBABILITY`, the ten
digits sharing the rest. With a run's length target, completions of different lengths get different
rewards, so groups have signal; everything else (tokenizer, template, architecture) is the tiny folder's.
"""

from __future__ import annotations

import atexit
import math
import shutil
import tempfile
from functools import cache
from pathlib import Path

import torch

from swarmnode.node.rl.model import load_model, save_model_folder
from swarmnode.node.rl.tokenizer import load_tokenizer
from tests.tinymodel import tiny_folder

EOS_PROBABILITY = 0.3
_CONSTANT = 10.0  # the shared embedding coordinate: far above the other coordinates (std 0.02)

_ROOT = Path(tempfile.mkdtemp(prefix="swarmnode-eos-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@cache
def eos_folder(arch: str = "qwen2", seed: int = 7) -> Path:
    """`tiny_folder(arch, seed)` with the weights described above (cached per process: do not modify)."""
    source = tiny_folder(arch, seed)
    tokenizer, info = load_tokenizer(source)
    model = load_model(source)
    digits = [tokenizer.encode(str(d)) for d in range(10)]
    if any(len(ids) != 1 for ids in digits):
        raise ValueError(f"{source}: digits are not single tokens: {digits}")
    eos = info.eos_token_ids[0]
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = _CONSTANT
        head = model.get_output_embeddings().weight
        scale = math.sqrt(head.shape[1])  # the normed hidden state's coordinate 0: about sqrt(hidden size)
        head[:, 0] = -1.0  # every other token: e^-scale below a digit
        for (digit,) in digits:
            head[digit, 0] = 0.0
        head[eos, 0] = math.log(10 * EOS_PROBABILITY / (1 - EOS_PROBABILITY)) / scale
    return save_model_folder(model, source, _ROOT / f"{arch}-{seed}")
