"""What a run's model is made of, as plain values: the architectures we run, the named sizes and the
vocabulary of `model init`, the chat's special tokens and the warm-start recipe.

No torch, transformers or tokenizers here: the CLI declares its options from these at import, and a
command that loads no model (`keys`, `ledger`, `tasks`, `--help`) must not pay seconds for the ML stack.
The modules that build and train models (`model`, `modelinit`, `tokenizer`, `warmstart`) take them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
PARAM_DTYPES = {"bf16": 2, "fp32": 4}  # the trainer's parameter dtypes: bytes per element

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)


@dataclass(frozen=True)
class ModelRecipe:
    """A small model of a supported architecture, built from code (tests, the devnet, `model init`)."""

    arch: str = "qwen2"
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 2  # heads of 32: the smallest size vLLM's CPU attention takes (16 is refused)
    num_kv_heads: int = 1
    max_positions: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02


# Named sizes for `model init --size`; `tiny` is the devnet's (about 0.2M parameters).
SIZES: Mapping[str, ModelRecipe] = {
    "tiny": ModelRecipe(),
    "small": ModelRecipe(
        hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=8, num_kv_heads=4, max_positions=1024
    ),
}
DEFAULT_VOCAB_SIZE = 512


@dataclass(frozen=True)
class WarmStartRecipe:
    """Everything besides the folder and the tasks that determines a warm start."""

    data_seed: int = 1
    batch_size: int = 128
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.98)
    max_steps: int = 3000
    eval_every: int = 50
    eval_samples: int = 2
    target_pass_rate: float = 0.3
    max_new_tokens: int = 6
    temperature: float = 1.0

    def check(self) -> None:
        """Refuse a recipe that cannot run (ValueError naming the field)."""
        for name in ("batch_size", "max_steps", "eval_every", "eval_samples", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"warm-start {name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.target_pass_rate <= 1.0:
            raise ValueError(f"warm-start target pass rate {self.target_pass_rate} is not in [0, 1]")
        if not self.lr > 0 or not self.temperature > 0:
            raise ValueError("warm-start lr and temperature must be positive")
