"""GRPO as INTELLECT-2 runs it: group-normalised advantages, two-sided clipped token-level ratios.

Pure tensor functions, no I/O, so the trainer, the synchronous baseline and the tests share them.

- advantage of a completion: `(r - mean(group)) / (std(group) + 1e-6)`, population std (a group is the
  whole population of samples for its prompt, not a sample of one);
- ratio `r = exp(logp - logp_old)` per token; `coef1 = clamp(r, 0, delta)` bounds the update when a
  token became far more likely than under the policy that sampled it (the async/off-policy risk);
  `coef2 = clamp(coef1, 1 - eps, 1 + eps)`; per-token loss `max(-coef1 A, -coef2 A)`;
- the loss is the sum over tokens divided by a constant token budget, so long and short completions are
  weighted per token and the scale of a step does not depend on how many tokens a batch happened to hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ADVANTAGE_EPS = 1e-6


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Advantages of one group's rewards (shape (G,)); all-equal rewards give all-zero advantages."""
    rewards = rewards.to(torch.float32)
    return (rewards - rewards.mean()) / (rewards.std(correction=0) + ADVANTAGE_EPS)


def length_target_reward(task_reward: float, length: int, target: int, penalty: float = 0.0003) -> float:
    """INTELLECT-2's optional length control: `r_task - penalty * |target - length|`; target 0 disables it."""
    if target <= 0:
        return task_reward
    return task_reward - penalty * abs(target - length)


def has_signal(rewards: torch.Tensor) -> bool:
    """Online filtering: a group whose rewards are all equal has zero advantage and teaches nothing."""
    return bool(rewards.numel() > 1 and (rewards != rewards[0]).any())


@dataclass(frozen=True)
class GrpoLoss:
    loss: torch.Tensor
    clipped_fraction: float
    mean_ratio: float
    tokens: int


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_epsilon: float = 0.2,
    clip_delta: float = 4.0,
    token_budget: int,
) -> GrpoLoss:
    """The two-sided clipped GRPO objective over a padded batch.

    logprobs, old_logprobs, mask: (B, T); advantages: (B,) per completion, broadcast over its tokens.
    `logprobs` carries the gradient; `old_logprobs` are those of the policy that generated the tokens.
    """
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs.detach())
    coef1 = torch.clamp(ratio, 0.0, clip_delta)
    coef2 = torch.clamp(coef1, 1.0 - clip_epsilon, 1.0 + clip_epsilon)
    adv = advantages.detach().to(logprobs.dtype).unsqueeze(1)
    per_token = torch.maximum(-coef1 * adv, -coef2 * adv)
    loss = (per_token * mask).sum() / token_budget
    with torch.no_grad():
        tokens = int(mask.sum().item())
        clipped = ((coef1 != coef2) | (ratio > clip_delta)).to(mask.dtype) * mask
        clipped_fraction = float(clipped.sum().item() / max(tokens, 1))
        mean_ratio = float((ratio * mask).sum().item() / max(tokens, 1))
    return GrpoLoss(loss, clipped_fraction, mean_ratio, tokens)
