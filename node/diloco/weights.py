"""θ by name: a model's trainable parameters as float32 CPU tensors, and the name-and-shape check that
every tensor map DiLoCo exchanges (θ, a pseudo-gradient, a payload, an outer state) must pass.

Its own module so that both the algorithm and the payload compression (`compression`) check against θ
without importing each other. Buffers do not train and are not exchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

FINAL_FILE = "final.safetensors"  # a trainer process's θ when its run ended (`swarmnode diloco trainer`)


def trainable_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """float32 CPU copies of the trainable parameters, by name: the θ that DiLoCo exchanges."""
    return {
        name: p.detach().to("cpu", torch.float32).contiguous().clone()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def load_trainable(model: torch.nn.Module, state: Mapping[str, Tensor]) -> None:
    """Copy `state` into the model's trainable parameters in place (same names and shapes required)."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    check_like(state, params, what="outer weights")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(state[name])


def check_like(tensors: Mapping[str, Tensor], like: Mapping[str, Tensor], *, what: str = "tensors") -> None:
    """Raise ValueError unless `tensors` has exactly the names of `like`, with the same shapes."""
    missing, extra = sorted(set(like) - set(tensors)), sorted(set(tensors) - set(like))
    if missing or extra:
        raise ValueError(f"{what}: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, ref in like.items():
        if tensors[name].shape != ref.shape:
            raise ValueError(f"{what}: {name} has shape {list(tensors[name].shape)}, want {list(ref.shape)}")
