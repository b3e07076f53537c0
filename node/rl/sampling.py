"""Reproducible sampling: seeded Gumbel-max that a validator can re-derive from its own logits.

A worker samples token t at generated position p as `argmax(logits_p / temperature + g(seed, p))`, where the
Gumbel noise `g` depends only on (seed, position, vocabulary index). A validator recomputes `logits_p` by
teacher-forced prefill, adds the same noise and checks that the claimed token is the argmax, up to a
tolerance for near ties (its logits differ from the prover's in the last bits). The seed itself comes from
`derive_seed(run, worker, step, task, index)`, so the worker cannot shop for lucky seeds, and it binds the
whole assignment: the step (`checkpoint_version << 32 | counter`) is hashed in, so completions generated
for one assignment carry the wrong seeds in any other and cannot be sold twice (spec/rollouts.md).

Decisions:
- The noise is a counter-based hash, not a `torch.Generator` stream. A torch generator per (seed,
  position) was the first plan, but torch's CPU (mt19937) and CUDA (Philox) streams differ, so a CPU
  validator could not re-derive a GPU prover's noise, and drawing a 150k-vocabulary stream per token on the
  CPU costs about as much as vLLM's whole decode step. The hash is integer arithmetic in int64 tensors
  (exact on every device, 32-bit products kept below 2**63), vectorised over the vocabulary, and a few
  lines long, so an outside implementation can match it bit for bit (`tests/rl/test_sampling.py` pins a
  pure-Python reference):
      (k0, k1) = big-endian u32 at bytes 0 and 4 of
                 sha256("swarmnode/sampling/gumbel/v1" || seed u64 BE || position u32 BE)
      bits_j   = mix32(mix32((j + k0) mod 2**32) xor k1),   mix32 = "lowbias32" (Wellons)
      u_j      = (2 * (bits_j >> 9) + 1) / 2**24             (exact in fp32, never 0 or 1)
      g_j      = -log(-log(u_j))                             (fp32; devices may differ in the last ulp)
- Temperature 0 means greedy: no noise, plain argmax of the logits.
- Logprobs and P(EOS) are taken under the temperature-scaled distribution softmax(logits / temperature),
  the one tokens are actually drawn from (raw logits when temperature is 0).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt
import torch

SEED_DOMAIN = b"swarmnode/sampling/seed/v2"  # v2: the assignment step is hashed in
NOISE_DOMAIN = b"swarmnode/sampling/gumbel/v1"
SEED_BITS = 63  # fits an int64 everywhere (torch, vLLM's SamplingParams.seed, msgpack int)
MASK32 = 0xFFFFFFFF

DEFAULT_SAMPLING_TOLERANCE = 1e-3  # fp32 CPU prover vs fp32 CPU validator; calibrate for bf16 / GPU
DEFAULT_EOS_THRESHOLD = 1e-4


# ---------------------------------------------------------------------------- seeds


def _lp(data: bytes) -> bytes:
    """Length-prefixed field (u32 BE length), so concatenated fields cannot be re-split differently."""
    return len(data).to_bytes(4, "big") + data


def derive_seed(run_id: str, worker: bytes, step: int, task_id: bytes, index: int) -> int:
    """The sampling seed of completion `index` of the group for `task_id` in assignment `step`: sha256
    over length-prefixed run, worker and task, the step (u64 BE) and the index (u32 BE), 63 bits."""
    if not 0 <= step < 2**64:
        raise ValueError(f"assignment step {step} outside u64")
    if not 0 <= index < 2**32:
        raise ValueError(f"completion index {index} outside u32")
    msg = (
        SEED_DOMAIN
        + _lp(run_id.encode())
        + _lp(worker)
        + step.to_bytes(8, "big")
        + _lp(task_id)
        + index.to_bytes(4, "big")
    )
    return int.from_bytes(hashlib.sha256(msg).digest()[:8], "big") >> (64 - SEED_BITS)


def group_seeds(run_id: str, worker: bytes, step: int, task_id: bytes, n: int) -> list[int]:
    """`derive_seed` of completions 0 .. n - 1: the seeds of one group."""
    return [derive_seed(run_id, worker, step, task_id, i) for i in range(n)]


def position_key(seed: int, position: int) -> tuple[int, int]:
    """The two 32-bit hash keys of one (seed, generated position)."""
    if not 0 <= seed < 2**64 or not 0 <= position < 2**32:
        raise ValueError(f"seed {seed} or position {position} out of range")
    d = hashlib.sha256(NOISE_DOMAIN + seed.to_bytes(8, "big") + position.to_bytes(4, "big")).digest()
    return int.from_bytes(d[0:4], "big"), int.from_bytes(d[4:8], "big")


# ---------------------------------------------------------------------------- noise


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x < 2**32 in int64, split in 16-bit halves so no product reaches 2**63."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer finaliser: every input bit flips about half the output bits."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _mix32_u32(x: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    """`_mix32` in numpy uint32, in place: products wrap mod 2**32 by definition, so one multiply each."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def _noise_bits_u32(keys: npt.NDArray[np.int64], vocab_size: int) -> npt.NDArray[np.uint32]:
    """`noise_bits` on the CPU: the same values as uint32 (a third of the int64 path's work)."""
    k0 = keys[:, 0:1].astype(np.uint32)
    k1 = keys[:, 1:2].astype(np.uint32)
    x = np.arange(vocab_size, dtype=np.uint32)[None, :] + k0  # wraps mod 2**32, as `& MASK32` does
    x = _mix32_u32(x)
    x ^= k1
    return _mix32_u32(x)


def _noise_bits_int64(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`noise_bits` in int64 torch arithmetic, on any device."""
    j = torch.arange(vocab_size, dtype=torch.int64, device=keys.device)
    return _mix32(_mix32((j[None, :] + keys[:, 0:1]) & MASK32) ^ keys[:, 1:2])


def noise_bits(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B, V) int64 hash values in [0, 2**32) for a (B, 2) int64 tensor of position keys."""
    if keys.device.type == "cpu":
        return torch.from_numpy(_noise_bits_u32(keys.numpy(), vocab_size).astype(np.int64))
    return _noise_bits_int64(keys, vocab_size)


def _uniform(bits: torch.Tensor | npt.NDArray[np.uint32]) -> torch.Tensor:
    """u = (2 * (bits >> 9) + 1) / 2**24, exact in fp32 (23-bit integers), never 0 or 1."""
    if isinstance(bits, np.ndarray):
        odd = (bits >> np.uint32(9)) * np.uint32(2) + np.uint32(1)
        return torch.from_numpy(odd.astype(np.float32)) * 2.0**-24
    return ((bits >> 9) * 2 + 1).to(torch.float32) * 2.0**-24


def gumbel_from_keys(
    keys: Sequence[tuple[int, int]], vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(B, V) fp32 Gumbel noise, one row per position key (hashed in numpy when it is wanted on the CPU)."""
    k = torch.tensor(list(keys), dtype=torch.int64).reshape(-1, 2)
    if torch.device(device).type == "cpu":
        u = _uniform(_noise_bits_u32(k.numpy(), vocab_size))
    else:
        u = _uniform(_noise_bits_int64(k.to(device), vocab_size))
    return -torch.log(-torch.log(u))


def gumbel_noise(
    seeds: Sequence[int], position: int, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(B, V) noise for one generated position, one row per seed (the batched generation layout)."""
    return gumbel_from_keys([position_key(s, position) for s in seeds], vocab_size, device)


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits / temperature (unchanged when temperature is 0: greedy uses raw logits)."""
    if temperature < 0:
        raise ValueError(f"negative temperature {temperature}")
    logits = logits.to(torch.float32)
    return logits / temperature if temperature > 0 else logits


def keyed_scores(logits: torch.Tensor, keys: Sequence[tuple[int, int]], temperature: float) -> torch.Tensor:
    """(B, V) scores whose argmax is the sampled token, row b with the noise of position key `keys[b]`:
    logits/T + Gumbel noise (no noise when T is 0)."""
    scaled = scale_logits(logits, temperature)
    if temperature == 0:
        return scaled
    return scaled + gumbel_from_keys(keys, scaled.shape[-1], scaled.device)


def perturbed_scores(
    logits: torch.Tensor, seeds: Sequence[int], position: int, temperature: float
) -> torch.Tensor:
    """`keyed_scores` of rows at one generated position, one seed per row."""
    return keyed_scores(logits, [position_key(s, position) for s in seeds], temperature)


def sample_tokens(
    logits: torch.Tensor, seeds: Sequence[int], position: int, temperature: float
) -> torch.Tensor:
    """(B,) int64 tokens for (B, V) logits at one generated position, one seed per row."""
    return perturbed_scores(logits, seeds, position, temperature).argmax(dim=-1)


def sample_rows(
    logits: torch.Tensor, seeds: Sequence[int], positions: Sequence[int], temperature: float
) -> torch.Tensor:
    """(B,) int64 tokens for (B, V) logits, row b with the noise of (seeds[b], positions[b]): rows of
    completions that stand at different positions (the turns of several episodes in one batch)."""
    keys = [position_key(s, p) for s, p in zip(seeds, positions, strict=True)]
    return keyed_scores(logits, keys, temperature).argmax(dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 log-probabilities of `tokens` (...) under softmax(logits / temperature), logits (..., V)."""
    logp = torch.log_softmax(scale_logits(logits, temperature), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1).to(torch.int64)).squeeze(-1)


def eos_probabilities(logits: torch.Tensor, eos_ids: int | Sequence[int], temperature: float) -> torch.Tensor:
    """(T,) P(EOS) at each position under the temperature-scaled distribution, for `check_termination`:
    the probability of ending, summed over the model's EOS ids (instruct models have several)."""
    ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids)
    probs = torch.softmax(scale_logits(logits, temperature), dim=-1)
    return probs[..., ids].sum(-1)


# ---------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class SamplingCheck:
    """Outcome of re-deriving every token: the positions whose token is not (near) the argmax."""

    mismatches: tuple[int, ...]
    max_gap: float  # largest (best score - claimed token's score) over all positions

    @property
    def passed(self) -> bool:
        return not self.mismatches


def check_sampling(
    logits: torch.Tensor,
    tokens: Sequence[int] | torch.Tensor,
    seed: int,
    temperature: float,
    tolerance: float = DEFAULT_SAMPLING_TOLERANCE,
) -> SamplingCheck:
    """Re-derive each token from the validator's (T, V) logits; a token is accepted when its perturbed score
    is within `tolerance` of the best (near ties flip under tiny logit differences)."""
    tok = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
    if logits.ndim != 2 or logits.shape[0] != tok.shape[0]:
        raise ValueError(f"logits {tuple(logits.shape)} do not match {tok.shape[0]} tokens")
    if tok.numel() == 0:
        return SamplingCheck(mismatches=(), max_gap=0.0)
    scores = scale_logits(logits, temperature)
    if temperature > 0:
        keys = [position_key(seed, p) for p in range(len(tok))]
        scores = scores + gumbel_from_keys(keys, scores.shape[-1], scores.device)
    gaps = scores.max(dim=-1).values - scores.gather(-1, tok.to(scores.device).unsqueeze(-1)).squeeze(-1)
    bad = torch.nonzero(gaps > tolerance).flatten().tolist()
    return SamplingCheck(mismatches=tuple(bad), max_gap=float(gaps.max()))


class TerminationFailure(StrEnum):
    """Why a completion's ending is not one an honest sampler produces."""

    EOS_NOT_LAST = "eos_not_last"  # tokens continue after an EOS
    EOS_UNLIKELY = "eos_unlikely"  # EOS where the validator's P(EOS) is below the threshold
    STOPPED_EARLY = "stopped_early"  # no EOS, yet shorter than max_len
    TOO_LONG = "too_long"  # more tokens than max_len


@dataclass(frozen=True)
class TerminationCheck:
    """Outcome of the termination rule: (position, reason) for each violation."""

    failures: tuple[tuple[int, TerminationFailure], ...]

    @property
    def passed(self) -> bool:
        return not self.failures


def check_termination(
    eos_probs: torch.Tensor | Sequence[float],
    tokens: Sequence[int] | torch.Tensor,
    eos_ids: int | Sequence[int],
    max_len: int,
    threshold: float = DEFAULT_EOS_THRESHOLD,
) -> TerminationCheck:
    """A completion may end with EOS only where the validator's P(EOS) >= threshold, else it must run to
    exactly `max_len` tokens. `eos_probs[p]` is P(EOS) at generated position p; any of `eos_ids` ends."""
    tok = [int(t) for t in torch.as_tensor(tokens).reshape(-1).tolist()]
    probs = torch.as_tensor(eos_probs, dtype=torch.float32).reshape(-1)
    if probs.shape[0] != len(tok):
        raise ValueError(f"{probs.shape[0]} EOS probabilities for {len(tok)} tokens")
    return check_termination_at_end(float(probs[-1]) if tok else 0.0, tok, eos_ids, max_len, threshold)


def check_termination_at_end(
    last_eos_prob: float,
    tokens: Sequence[int],
    eos_ids: int | Sequence[int],
    max_len: int,
    threshold: float = DEFAULT_EOS_THRESHOLD,
) -> TerminationCheck:
    """`check_termination` given only what it reads of the probabilities: P(EOS) at the last position.

    A validator computes that one value per completion instead of a softmax at every position.
    """
    eos = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
    failures: list[tuple[int, TerminationFailure]] = []
    if len(tokens) > max_len:
        failures.append((max_len, TerminationFailure.TOO_LONG))
    last = len(tokens) - 1
    failures += [(p, TerminationFailure.EOS_NOT_LAST) for p, t in enumerate(tokens) if t in eos and p != last]
    if tokens and tokens[last] in eos:
        if last_eos_prob < threshold:
            failures.append((last, TerminationFailure.EOS_UNLIKELY))
    elif len(tokens) < max_len:
        failures.append((len(tokens), TerminationFailure.STOPPED_EARLY))
    return TerminationCheck(failures=tuple(failures))
