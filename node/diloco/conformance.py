"""The DiLoCo suite's handlers: the pure rules' (protocol/diloco_conformance.py) and the payload kind.

A payload is judged by decompressing its tensors (node/diloco/compression.py), which is node code, so this
one kind cannot sit beside the pure rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from safetensors.torch import load as load_safetensors

from swarmnode.node.diloco.compression import decompress
from swarmnode.protocol import diloco as rules
from swarmnode.protocol.codec import decode
from swarmnode.protocol.diloco_conformance import DILOCO_RULE_HANDLERS
from swarmnode.protocol.messages import DilocoRun


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.removeprefix("0x"))


def check_payload_case(inp: dict[str, Any]) -> dict[str, Any]:
    """A peer's payload (safetensors bytes) judged under a run's compression and pseudo-gradient bound."""
    plan = decode(DilocoRun, _hex(inp["plan"]))
    bound = rules.max_delta_element(plan.inner_steps, plan.inner_lr)
    try:
        delta = decompress(load_safetensors(_hex(inp["payload"])), plan.compression, max_abs=bound)
    except ValueError as exc:
        return {"valid": False, "bound": bound, "above_bound": "above the run's bound" in str(exc)}
    return {"valid": True, "bound": bound, "max_abs": max(float(t.abs().max()) for t in delta.values())}


DILOCO_HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    **DILOCO_RULE_HANDLERS,
    "diloco-payload": check_payload_case,
}
