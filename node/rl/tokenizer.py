"""Character-level tokenizer for the project's verifiable tasks.

Decisions:
- One token per printable ASCII character (space through `~`), so arithmetic, `\\boxed{...}` answers and short
  Python all encode without a trained vocabulary, and the vocabulary is a constant that the model config and
  every peer agree on without shipping a tokenizer file.
- Special ids come first (PAD=0, BOS=1, EOS=2, UNK=3); anything outside printable ASCII maps to UNK, so
  encoding never fails on untrusted text, but decoding UNK gives U+FFFD so a lossy round trip is visible.
"""

from __future__ import annotations

from collections.abc import Iterable

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
NUM_SPECIAL = 4

FIRST_CHAR = 0x20  # ' '
LAST_CHAR = 0x7E  # '~'
VOCAB_SIZE = NUM_SPECIAL + (LAST_CHAR - FIRST_CHAR + 1)  # 99

_SPECIAL_TEXT = {PAD_ID: "", BOS_ID: "", EOS_ID: "", UNK_ID: "\ufffd"}


def char_id(ch: str) -> int:
    """Token id of one character (UNK outside printable ASCII)."""
    code = ord(ch)
    if FIRST_CHAR <= code <= LAST_CHAR:
        return NUM_SPECIAL + code - FIRST_CHAR
    return UNK_ID


def encode(text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
    """Token ids of `text`, optionally framed by BOS and EOS."""
    ids = [char_id(ch) for ch in text]
    return ([BOS_ID] if bos else []) + ids + ([EOS_ID] if eos else [])


def encode_prompt(text: str) -> list[int]:
    """A prompt as the engines expect it: BOS then the characters (generation continues from there)."""
    return encode(text, bos=True)


def decode(ids: Iterable[int]) -> str:
    """Text of `ids`; PAD/BOS/EOS vanish, UNK becomes U+FFFD. Raises on ids outside the vocabulary."""
    out = []
    for i in ids:
        if not 0 <= i < VOCAB_SIZE:
            raise ValueError(f"token id {i} outside vocabulary of {VOCAB_SIZE}")
        out.append(_SPECIAL_TEXT[i] if i < NUM_SPECIAL else chr(FIRST_CHAR + i - NUM_SPECIAL))
    return "".join(out)


def completion_text(ids: Iterable[int]) -> str:
    """Text of a completion up to (not including) its first EOS: what reward functions grade."""
    body = []
    for i in ids:
        if i == EOS_ID:
            break
        body.append(i)
    return decode(body)
