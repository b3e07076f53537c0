"""The run's tokenizer: prompts through the model's chat template, completion text up to the first EOS.

Every role turns a task into prompt tokens the same way (`encode_prompt`), because the validator checks that
a submission's prompt ids are exactly the run's: the task prompt is the user message of a one-turn chat, and
a task with a target length gets INTELLECT-2's system message asking for that many tokens
(spec/rollouts.md, Prompts). The template is the model folder's own (`chat_template.jinja` or the
tokenizer config's), rendered by transformers; a folder without one is refused.

`train_tokenizer` builds the byte-level BPE tokenizer of the tiny models made in code, offline with the
`tokenizers` library, with Qwen's special tokens and a Qwen-style chat template.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import cast

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from swarmnode.node.rl.model import ModelFolderError, ModelInfo, model_info, tokenizer_files
from swarmnode.node.rl.recipes import IM_END, PAD_TOKEN, SPECIAL_TOKENS

# Qwen2's pre-tokenizer split (transformers' tokenization_qwen2): digits one by one, words, punctuation runs.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
)
# Qwen's format, as short as it can be: the tiny models have 128 positions.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def length_instruction(target_length: int) -> str:
    """The system message of a task with a target length (INTELLECT-2's wording)."""
    return f"Think for {target_length} tokens before giving a response."


def prompt_messages(prompt: str, target_length: int = 0) -> list[dict[str, str]]:
    """The chat a task's prompt becomes: an optional length instruction, then the prompt as the user."""
    system = [{"role": "system", "content": length_instruction(target_length)}] if target_length > 0 else []
    return [*system, {"role": "user", "content": prompt}]


class ChatTokenizer:
    """A model folder's tokenizer with the run's EOS set (ids from the model, not constants)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Sequence[int]) -> None:
        if not tokenizer.chat_template:
            raise ModelFolderError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self._eos = frozenset(self.eos_token_ids)

    def encode_prompt(self, prompt: str, target_length: int = 0) -> list[int]:
        """Token ids of the task's chat, ending with the assistant's turn opened (generation goes on)."""
        ids = self.tokenizer.apply_chat_template(
            prompt_messages(prompt, target_length),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return [int(i) for i in cast(list[int], ids)]  # one conversation, tokenized: a flat list of ids

    def encode(self, text: str) -> list[int]:
        """Plain token ids of `text`, no special tokens (supervised targets)."""
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def is_eos(self, token: int) -> bool:
        return token in self._eos

    def completion_text(self, ids: Iterable[int]) -> str:
        """Text of a completion up to (not including) its first EOS: what reward functions grade."""
        body: list[int] = []
        for i in ids:
            if i in self._eos:
                break
            body.append(int(i))
        return cast(str, self.tokenizer.decode(body, skip_special_tokens=True))  # one sequence: one str


def load_tokenizer(folder: str | os.PathLike[str]) -> tuple[ChatTokenizer, ModelInfo]:
    """A model folder's tokenizer and facts, loaded as transformers and vLLM load them (AutoTokenizer: the
    tokenizer class is the folder's). EOS ids are the model's and the tokenizer's."""
    tokenizer_files(folder)
    raw = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    eos = [raw.eos_token_id] if raw.eos_token_id is not None else []
    info = model_info(folder, eos, raw.pad_token_id)
    return ChatTokenizer(raw, info.eos_token_ids), info


def train_tokenizer(texts: Iterable[str], vocab_size: int, out: str | os.PathLike[str]) -> Path:
    """Train a byte-level BPE tokenizer on `texts` and save it (tokenizer.json, config, chat template)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    # Qwen2's pipeline, written into tokenizer.json: transformers loads a qwen2 folder's tokenizer as
    # Qwen2Tokenizer, which applies exactly this whatever the file says, and a llama or qwen3 folder's as
    # the file says; with it in the file, every loader (and `tokenizers` alone) gives the same ids.
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=IM_END, pad_token=PAD_TOKEN, unk_token=None, bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out
