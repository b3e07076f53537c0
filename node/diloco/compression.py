"""A DiLoCo pseudo-gradient on the wire: compressed by its trainer, checked and decompressed by everyone.

Decisions:
- Three kinds (`COMPRESSIONS`): raw float32 ("none"), fp16, and int8. fp16 has no residual: its relative
  error (2^-11) is far below the pseudo-gradient's noise.
- int8 is symmetric per tensor: scale = max|x|/127 (a float32 0-d tensor sent as `"<name>.scale"`),
  q = round(x/scale). The quantisation error is fed back: the compressor keeps
  residual = (Δ + residual) − decompress(payload) and adds it to the next round's Δ, so what was sent sums
  to what should have been sent up to one residual (at most scale/2 per element).
- Payloads come from peers, so `decompress` checks dtypes, the scale entries, finiteness and (optionally)
  names and shapes against the model, and raises `ValueError` with the reason; nothing is unpickled.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from swarmnode.node.diloco.weights import check_like

COMPRESSIONS = ("none", "fp16", "int8")
SCALE_SUFFIX = ".scale"
INT8_MAX = 127


def _check_kind(kind: str) -> None:
    if kind not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {kind!r}")


def _dequantize(q: Tensor, scale: Tensor) -> Tensor:
    return q.to(torch.float32) * scale


class Compressor:
    """One trainer's encoder of its pseudo-gradient; holds the int8 error-feedback residual."""

    def __init__(self, kind: str) -> None:
        _check_kind(kind)
        self.kind = kind
        self.residual: dict[str, Tensor] = {}

    def compress(self, delta: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Tensors ready for safetensors: fp32 ("none"), fp16, or int8 + a 0-d float32 `<name>.scale`."""
        for name, t in delta.items():
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"pseudo-gradient {name} is not finite")
        if self.kind == "none":
            return {name: t.to(torch.float32).contiguous().clone() for name, t in delta.items()}
        if self.kind == "fp16":
            out = {name: t.to(torch.float16).contiguous() for name, t in delta.items()}
            for name, t in out.items():
                if not bool(torch.isfinite(t).all()):
                    raise ValueError(
                        f"pseudo-gradient {name} overflows fp16 (max |x| {delta[name].abs().max()})"
                    )
            return out
        return self._compress_int8(delta)

    def _compress_int8(self, delta: Mapping[str, Tensor]) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for name, t in delta.items():
            if name + SCALE_SUFFIX in delta:
                raise ValueError(
                    f"tensor names {name!r} and {name + SCALE_SUFFIX!r} collide in an int8 payload"
                )
            x = t.to(torch.float32)
            if name in self.residual:
                x = x + self.residual[name]
            scale = (x.abs().max() / INT8_MAX).reshape(())
            if float(scale) > 0:
                q = torch.round(x / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
            else:
                q = torch.zeros(x.shape, dtype=torch.int8)
            self.residual[name] = x - _dequantize(q, scale)
            out[name] = q.contiguous()
            out[name + SCALE_SUFFIX] = scale.contiguous()
        return out

    def reset(self) -> None:
        """Forget the residual (a trainer that rejoins starts without one)."""
        self.residual = {}


def decompress(
    payload: Mapping[str, Tensor],
    kind: str,
    *,
    like: Mapping[str, Tensor] | None = None,
    max_abs: float | None = None,
) -> dict[str, Tensor]:
    """float32 pseudo-gradient of a payload (maybe a peer's); ValueError on anything malformed.

    With `like` (e.g. θ), the names and shapes must also match it exactly; with `max_abs` (the run's
    `protocol.diloco.max_delta_element`), no element may exceed it in magnitude: finite but huge values
    would move every trainer's θ as far as NaN does.
    """
    _check_kind(kind)
    if kind == "int8":
        out = _decompress_int8(payload)
    else:
        want = torch.float32 if kind == "none" else torch.float16
        out = {}
        for name in sorted(payload):
            if payload[name].dtype != want:
                raise ValueError(f"{kind} payload: {name} is {payload[name].dtype}, want {want}")
            out[name] = payload[name].to(torch.float32)
    for name, t in out.items():
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{kind} payload: {name} is not finite")
        if max_abs is not None and t.numel() and (peak := float(t.abs().max())) > max_abs:
            raise ValueError(f"{kind} payload: {name} holds |x| = {peak:.4g}, above the run's bound "
                             f"{max_abs:.4g} (DELTA_STEP_BOUND x inner_steps x inner_lr)")
    if like is not None:
        check_like(out, like, what=f"{kind} payload")
    return out


def _decompress_int8(payload: Mapping[str, Tensor]) -> dict[str, Tensor]:
    quantised = sorted(name for name, t in payload.items() if t.dtype == torch.int8)
    scales = {name + SCALE_SUFFIX for name in quantised}
    stray = sorted(set(payload) - set(quantised) - scales)
    if stray:
        raise ValueError(f"int8 payload: {stray[:3]} are neither int8 tensors nor their scales")
    out = {}
    for name in quantised:
        scale = payload.get(name + SCALE_SUFFIX)
        if scale is None:
            raise ValueError(f"int8 payload: {name} has no {name + SCALE_SUFFIX}")
        if scale.dtype != torch.float32 or scale.shape != ():
            raise ValueError(f"int8 payload: {name + SCALE_SUFFIX} must be a 0-d float32 tensor")
        if not (float(scale) >= 0 and bool(torch.isfinite(scale))):
            raise ValueError(f"int8 payload: {name + SCALE_SUFFIX} is {float(scale)}, want finite >= 0")
        if bool((payload[name] == -128).any()):
            raise ValueError(f"int8 payload: {name} holds -128, outside the symmetric range")
        out[name] = _dequantize(payload[name], scale)
    return out


def payload_nbytes(payload: Mapping[str, Tensor]) -> int:
    """Raw tensor bytes of a payload (the safetensors file adds a small JSON header)."""
    return sum(t.numel() * t.element_size() for t in payload.values())
