"""Model folders built in code: a byte-level BPE tokenizer trained on the task text and a small model.

What `swarmnode model init` writes, what the devnet's built-in model starts from, and what tests run on:
a real Hugging Face folder (config.json, model.safetensors, tokenizer files with a chat template), so every
role walks the path a run on a downloaded Qwen or Llama takes. Reproducible from (recipe, texts, seed).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from transformers import AutoTokenizer

from swarmnode.node.rl.model import build_model, hf_config, save_model_folder
from swarmnode.node.rl.recipes import DEFAULT_VOCAB_SIZE, SIZES
from swarmnode.node.rl.tokenizer import CHAT_TEMPLATE, prompt_messages, train_tokenizer


def chat_texts(prompts_and_answers: Iterable[tuple[str, str]]) -> list[str]:
    """The text a tokenizer is trained on: each task as the chat the model will see, answer included."""
    from jinja2 import Template

    template = Template(CHAT_TEMPLATE)
    return [
        template.render(messages=prompt_messages(prompt), add_generation_prompt=True) + answer
        for prompt, answer in prompts_and_answers
    ]


def init_model_folder(
    out: str | os.PathLike[str],
    texts: Iterable[str],
    *,
    arch: str = "qwen2",
    size: str = "tiny",
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Path:
    """Train a tokenizer on `texts`, build a `size` model of `arch` with its vocabulary, save the folder."""
    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of {', '.join(SIZES)}")
    with tempfile.TemporaryDirectory() as scratch:
        train_tokenizer(texts, vocab_size, scratch)
        tokenizer = AutoTokenizer.from_pretrained(scratch, local_files_only=True)
        recipe = replace(SIZES[size], arch=arch, vocab_size=len(tokenizer))
        config = hf_config(recipe, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        model = build_model(config, seed, recipe.init_std)
        return save_model_folder(model, scratch, out)
