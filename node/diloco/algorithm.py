"""DiLoCo (Douillard et al., OpenDiLoCo): K trainers, H local AdamW steps each, one averaged outer step.

One round, on every trainer k, all starting from the same outer weights θ:
1. copy θ into the local model and take H inner AdamW steps on the trainer's own batches
   (`InnerTrainer.run_round`; the AdamW moments stay local and persist across rounds);
2. pseudo-gradient Δ_k = θ − θ_k, outer minus inner (`pseudo_gradient`);
3. compress it for the wire (`compression.Compressor.compress`: fp16, or int8 with error feedback, or raw
   fp32);
4. all trainers exchange payloads and each computes Δ = mean_k decompress(payload_k) (`average`);
5. every trainer applies the same outer step, SGD with Nesterov momentum (lr 0.7, momentum 0.9), to θ
   (`OuterOptimizer.step`), so all hold bit-identical θ for the next round.

Parts beside this module: `weights` (θ by name, `trainable_state`, and the name-and-shape check),
`compression` (payloads: encoding, error feedback, checking a peer's), `pretraining` (the reference data,
its loss, each trainer's batch order `round_batches`).

Decisions:
- The outer weights θ are the model's trainable parameters by name (`trainable_state`); buffers do not
  train and are not exchanged. Everything exchanged or stored is float32 on the CPU (or fp16/int8 payloads).
- A trainer averages the *decompressed payloads*, its own included, never its raw Δ: that is what the
  others see, and only then do all trainers compute the same float result.
- `average` adds the contributions in the order of their content digest (sha256 over names, shapes and
  bytes), then divides by K. Float addition is not associative, so the order must be fixed, and a digest
  order needs no agreement on contributor ids: any trainer holding the same set of payloads, in any order,
  gets bit-identical output, and so does `reference_diloco` in one process. (Hashing costs a pass over the
  data; a caller that already holds distinct keys, such as contributor addresses, may pass them instead.)
- `OuterOptimizer` is `torch.optim.SGD(nesterov=True)` over its own float32 copy of θ, with the averaged
  pseudo-gradient as `.grad`. Its state (θ, momentum buffers, step) is a flat dict of plain tensors, so it
  can be written with safetensors and handed to a trainer that (re)joins mid-run. The momentum buffer is
  always present (zeros before the first step, which torch's first step treats identically).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from swarmnode.node.diloco.compression import COMPRESSIONS, Compressor, decompress, payload_nbytes
from swarmnode.node.diloco.pretraining import round_batches
from swarmnode.node.diloco.weights import check_like, load_trainable, trainable_state
from swarmnode.protocol.diloco import max_delta_element

B = TypeVar("B")
LossFn = Callable[[torch.nn.Module, B], Tensor]

THETA_PREFIX = "theta."
MOMENTUM_PREFIX = "momentum."
STEP_KEY = "outer_step"


@dataclass(frozen=True)
class DilocoParams:
    """One run's DiLoCo settings; every trainer of the run must use the same ones."""

    inner_steps: int = 50  # H
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    compression: str = "fp16"  # "fp16" | "int8" | "none"
    inner_lr: float = 1e-3
    inner_betas: tuple[float, float] = (0.9, 0.95)  # the usual LM pre-training betas
    inner_weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.inner_steps, bool) or not isinstance(self.inner_steps, int):
            raise ValueError(f"inner_steps must be an int, got {self.inner_steps!r}")
        if self.inner_steps < 1:
            raise ValueError(f"inner_steps must be at least 1, got {self.inner_steps}")
        _check_range("outer_lr", self.outer_lr, low=0.0, low_open=True)
        _check_range("outer_momentum", self.outer_momentum, low=0.0, high=1.0, high_open=True)
        if not isinstance(self.nesterov, bool):
            raise ValueError(f"nesterov must be a bool, got {self.nesterov!r}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")
        _check_range("inner_lr", self.inner_lr, low=0.0, low_open=True)
        if not isinstance(self.inner_betas, tuple) or len(self.inner_betas) != 2:
            raise ValueError(f"inner_betas must be two numbers, got {self.inner_betas!r}")
        for i, beta in enumerate(self.inner_betas):
            _check_range(f"inner_betas[{i}]", beta, low=0.0, high=1.0, high_open=True)
        _check_range("inner_weight_decay", self.inner_weight_decay, low=0.0)


def _check_range(
    name: str,
    value: float,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (low_open and value == low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")


# --- pseudo-gradients ---------------------------------------------------------------------------------


def pseudo_gradient(outer: Mapping[str, Tensor], inner: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Δ = outer − inner in float32: the direction the outer optimizer descends along."""
    check_like(inner, outer, what="inner weights")
    return {name: outer[name].float() - inner[name].float() for name in outer}


# --- averaging ----------------------------------------------------------------------------------------


def content_digest(tensors: Mapping[str, Tensor]) -> bytes:
    """sha256 over names, dtypes, shapes and bytes in name order: a contribution's place in `average`."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{len(name)}:{name}:{t.dtype}:{list(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


def content_digest_items(items: Iterable[tuple[str, Tensor]]) -> bytes:
    """`content_digest` of tensors handed over one at a time in ascending name order.

    A group whose ranks each hold part of a payload streams it through here, so no rank holds it whole.
    """
    h = hashlib.sha256()
    last: str | None = None
    for name, tensor in items:
        if last is not None and name <= last:
            raise ValueError(f"tensor {name!r} comes after {last!r}: names must ascend")
        last = name
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{len(name)}:{name}:{t.dtype}:{list(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


def average(
    deltas: Sequence[Mapping[str, Tensor]], *, keys: Sequence[bytes | str] | None = None
) -> dict[str, Tensor]:
    """Mean of float32 pseudo-gradients, summed in a fixed order: identical on every trainer.

    The order is ascending `keys` (one per contribution, distinct, e.g. contributor addresses or payload
    hashes a caller already has) or, by default, `content_digest` of each contribution. Every trainer must
    use the same rule; `reference_diloco` uses the default.
    """
    if not deltas:
        raise ValueError("nothing to average")
    for i, d in enumerate(deltas[1:], start=1):
        check_like(d, deltas[0], what=f"contribution {i}")
    if keys is None:
        keys = [content_digest(d) for d in deltas]  # equal digests: equal tensors, their order is moot
    elif len(keys) != len(deltas) or len(set(keys)) != len(keys):
        raise ValueError(f"need {len(deltas)} distinct order keys, got {len(set(keys))} of {len(keys)}")
    ordered = [d for _, d in sorted(zip(keys, deltas, strict=True), key=lambda kd: kd[0])]
    out = {}
    for name in sorted(ordered[0]):
        acc = ordered[0][name].to(torch.float32).clone()
        for d in ordered[1:]:
            acc.add_(d[name].to(torch.float32))
        out[name] = acc.div_(len(ordered))
    return out


# --- outer optimizer ----------------------------------------------------------------------------------


class OuterOptimizer:
    """θ in float32 and SGD with (Nesterov) momentum over it; the same on every trainer of a run."""

    def __init__(self, outer: Mapping[str, Tensor], params: DilocoParams) -> None:
        if not outer:
            raise ValueError("no outer weights")
        self.params = params
        self._theta = {
            name: torch.nn.Parameter(outer[name].detach().to("cpu", torch.float32).clone())
            for name in sorted(outer)
        }
        self._sgd = torch.optim.SGD(
            list(self._theta.values()),
            lr=params.outer_lr,
            momentum=params.outer_momentum,
            nesterov=params.nesterov and params.outer_momentum > 0,
        )
        self.steps = 0

    def theta(self) -> dict[str, Tensor]:
        """Copies of the current outer weights."""
        return {name: p.detach().clone() for name, p in self._theta.items()}

    def step(self, avg_delta: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """One outer step with `avg_delta` as the gradient; returns the new θ (copies)."""
        check_like(avg_delta, self._theta, what="averaged pseudo-gradient")
        for name, p in self._theta.items():
            p.grad = avg_delta[name].detach().to("cpu", torch.float32).clone()
        self._sgd.step()
        self._sgd.zero_grad(set_to_none=True)
        self.steps += 1
        return self.theta()

    def _momentum(self, p: torch.nn.Parameter) -> Tensor:
        buf = self._sgd.state.get(p, {}).get("momentum_buffer")
        return torch.zeros_like(p.detach()) if buf is None else buf.detach().clone()

    def state_dict(self) -> dict[str, Tensor]:
        """`theta.<name>`, `momentum.<name>` (float32) and `outer_step` (0-d int64): safetensors-ready."""
        state = {THETA_PREFIX + name: p.detach().clone() for name, p in self._theta.items()}
        state.update({MOMENTUM_PREFIX + name: self._momentum(p) for name, p in self._theta.items()})
        state[STEP_KEY] = torch.tensor(self.steps, dtype=torch.int64)
        return state

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Restore θ, the momentum buffers and the step count written by `state_dict` (checked first)."""
        check_like(state, self.state_dict(), what="outer optimizer state")
        for name, t in state.items():
            if name != STEP_KEY and (t.dtype != torch.float32 or not bool(torch.isfinite(t).all())):
                raise ValueError(f"outer optimizer state: {name} must be finite float32")
        if state[STEP_KEY].dtype != torch.int64 or int(state[STEP_KEY]) < 0:
            raise ValueError("outer optimizer state: outer_step must be a non-negative int64")
        with torch.no_grad():
            for name, p in self._theta.items():
                p.copy_(state[THETA_PREFIX + name])
                if self.params.outer_momentum > 0:
                    self._sgd.state[p]["momentum_buffer"] = state[MOMENTUM_PREFIX + name].clone()
        self.steps = int(state[STEP_KEY])

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Tensor], params: DilocoParams) -> OuterOptimizer:
        """An outer optimizer continuing from a downloaded state (a trainer joining mid-run)."""
        theta = {k[len(THETA_PREFIX) :]: v for k, v in state.items() if k.startswith(THETA_PREFIX)}
        outer = cls(theta, params)
        outer.load_state_dict(state)
        return outer


# --- inner trainer ------------------------------------------------------------------------------------


class InnerTrainer:
    """A trainer's local model and its AdamW, whose moments persist across rounds."""

    def __init__(self, model: torch.nn.Module, params: DilocoParams) -> None:
        self.model = model
        self.params = params
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=params.inner_lr,
            betas=params.inner_betas,
            weight_decay=params.inner_weight_decay,
        )
        self.steps = 0
        self.rounds = 0
        self.last_losses: list[float] = []

    def run_round(
        self, outer: Mapping[str, Tensor], batches: Iterable[B], loss_fn: LossFn[B]
    ) -> dict[str, Tensor]:
        """Load θ, take one AdamW step per batch (exactly H of them), return the inner weights."""
        batches = list(batches)
        if len(batches) != self.params.inner_steps:
            raise ValueError(f"a round takes {self.params.inner_steps} batches, got {len(batches)}")
        load_trainable(self.model, outer)
        was_training = self.model.training
        self.model.train()
        losses = []
        try:
            for batch in batches:
                self.optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(self.model, batch)
                loss.backward()
                self.optimizer.step()
                losses.append(float(loss.detach()))
        finally:
            self.model.train(was_training)
        self.steps += len(batches)
        self.rounds += 1
        self.last_losses = losses
        return trainable_state(self.model)

    def statistics(self) -> dict[str, float | int]:
        last = self.last_losses
        return {
            "steps": self.steps,
            "rounds": self.rounds,
            "last_round_mean_loss": sum(last) / len(last) if last else float("nan"),
        }


# --- the whole algorithm in one process ---------------------------------------------------------------


@dataclass(frozen=True)
class RoundRecord:
    """What `reference_diloco` reports after each outer step."""

    round: int
    theta: dict[str, Tensor]
    inner_loss: float  # mean over trainers and inner steps of this round
    payload_bytes: int  # one trainer's payload (raw tensor bytes)


def reference_diloco(
    model_factory: Callable[[], torch.nn.Module],
    data_per_trainer: Sequence[Sequence[B]],
    params: DilocoParams,
    rounds: int,
    loss_fn: LossFn[B],
    *,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Tensor]:
    """DiLoCo for K = len(data_per_trainer) trainers in one process; returns the final θ.

    `model_factory` must build the same initial model every call (e.g. `node.diloco.plan.fresh_model(folder,
    seed)`); θ starts from the first trainer's. Trainer k uses `round_batches(data_per_trainer[k], r, H)` in
    round r and its own compressor, and θ is updated from the digest-ordered average of the decompressed
    payloads: the networked trainers must match this within float tolerance (bit-exactly with the same torch
    threads).
    """
    if not data_per_trainer:
        raise ValueError("need at least one trainer")
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    trainers = [InnerTrainer(model_factory(), params) for _ in data_per_trainer]
    compressors = [Compressor(params.compression) for _ in data_per_trainer]
    theta = trainable_state(trainers[0].model)
    outer = OuterOptimizer(theta, params)
    bound = max_delta_element(params.inner_steps, params.inner_lr)  # every trainer's check of the others'
    for r in range(rounds):
        received, losses, nbytes = [], [], 0
        for trainer, compressor, data in zip(trainers, compressors, data_per_trainer, strict=True):
            inner = trainer.run_round(theta, round_batches(data, r, params.inner_steps), loss_fn)
            payload = compressor.compress(pseudo_gradient(theta, inner))
            received.append(decompress(payload, params.compression, like=theta, max_abs=bound))
            losses.extend(trainer.last_losses)
            nbytes = payload_nbytes(payload)
        theta = outer.step(average(received))
        if on_round is not None:
            on_round(RoundRecord(r, theta, sum(losses) / len(losses), nbytes))
    return theta
