"""The worker's side of the run lifecycle: assigned tasks → groups → a RolloutSubmission.

Everything the validator re-derives is computed here by the same functions it uses: the task
assignment, the prompt tokens, the sampling seeds, the rewards and the advantages. Only the model
outputs (tokens, logprobs, hidden rows → TOPLOC proofs) come from the engine.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from swarmnode.crypto.toploc import build_proofs_batch
from swarmnode.node.rl.engine import Completion as EngineCompletion
from swarmnode.node.rl.engine import InferenceEngine, TurnRequest
from swarmnode.node.rl.environments.episodes import (
    EpisodeRules,
    ModelTurn,
    TurnAsk,
    TurnSampler,
    episode_rules,
    play_all,
)
from swarmnode.node.rl.grpo import group_advantages, length_target_reward
from swarmnode.node.rl.sampling import group_seeds
from swarmnode.node.rl.tasks import Task, assign_tasks, grade_groups, task_length_target
from swarmnode.node.rl.tokenizer import ChatTokenizer
from swarmnode.protocol.messages import Completion, RolloutGroup, RolloutSubmission, RunDescriptor
from swarmnode.protocol.runs import assignment_step


def assigned_tasks(descriptor: RunDescriptor, dataset_ids: Sequence[bytes], worker: bytes,
                   step: int) -> list[bytes]:
    return assign_tasks(dataset_ids, worker, step, descriptor.grpo.prompts_per_step)


def pack_logprobs(values: torch.Tensor) -> bytes:
    flat = values.detach().to(torch.float32).reshape(-1).tolist()
    return struct.pack(f"<{len(flat)}f", *flat)


def unpack_logprobs(data: bytes) -> torch.Tensor:
    if len(data) % 4:
        raise ValueError("logprobs must be whole float32 values")
    return torch.tensor(struct.unpack(f"<{len(data) // 4}f", data), dtype=torch.float32)


def submission_rewards(groups: Sequence[tuple[Task, Sequence[Sequence[int]]]], descriptor: RunDescriptor,
                       tokenizer: ChatTokenizer) -> list[list[float]]:
    """Task reward of each completion's text (up to its first EOS) of a submission's groups, with the
    optional length-target term (the task's own target length, else the run's). Graded together
    (`grade_groups`): a family task's reward is defined on the submission."""
    grpo = descriptor.grpo
    texts = [[tokenizer.completion_text(tokens) for tokens in token_lists] for _, token_lists in groups]
    grades = grade_groups([(task, group_texts) for (task, _), group_texts in zip(groups, texts, strict=True)])
    return [
        [
            length_target_reward(g.reward, len(tokens), task_length_target(task, grpo), grpo.length_penalty)
            for g, tokens in zip(group_grades, token_lists, strict=True)
        ]
        for group_grades, (task, token_lists) in zip(grades, groups, strict=True)
    ]


def completion_rewards(task: Task, token_lists: Sequence[Sequence[int]], descriptor: RunDescriptor,
                       tokenizer: ChatTokenizer) -> list[float]:
    """`submission_rewards` of one group."""
    return submission_rewards([(task, token_lists)], descriptor, tokenizer)[0]


def task_prompt_ids(task: Task, tokenizer: ChatTokenizer,
                    rules: EpisodeRules | None = None) -> tuple[int, ...]:
    """The run's prompt tokens for a task: its chat through the model's template (spec/rollouts.md); in a
    multi-turn run the environment's instructions come first (spec/environments.md)."""
    instructions = rules.env.instructions if rules is not None else ""
    prompt = f"{instructions}\n\n{task.prompt}" if instructions else task.prompt
    return tuple(tokenizer.encode_prompt(prompt, task.target_length))


@dataclass(frozen=True)
class GeneratedGroup:
    """A group as generated, before it is frozen into the wire message (kept for tests and cheats)."""

    task: Task
    prompt_ids: tuple[int, ...]
    completions: list[EngineCompletion]
    rewards: list[float] | None = None  # a multi-turn group's: each episode's reward, as it was played


def generate_group(engine: InferenceEngine, task: Task, descriptor: RunDescriptor, worker: bytes, step: int,
                   prompt_ids: Sequence[int] | None = None) -> GeneratedGroup:
    """G completions of one task with the seeds the run prescribes for this worker's assignment `step`."""
    grpo = descriptor.grpo
    rules = episode_rules(descriptor)
    prompt = tuple(prompt_ids) if prompt_ids is not None else task_prompt_ids(task, engine.tokenizer, rules)
    seeds = group_seeds(descriptor.run, worker, step, task.task_id, grpo.group_size)
    if rules is not None:
        return play_group(engine, task, rules, prompt, seeds, grpo.temperature)
    completions = engine.generate_group(list(prompt), grpo.group_size, seeds, grpo.max_new_tokens,
                                        grpo.temperature)
    return GeneratedGroup(task, prompt, completions)


def model_turn(turn: EngineCompletion) -> ModelTurn:
    """An engine's completion as one model turn of an episode."""
    return ModelTurn(turn.tokens, turn.logprobs, turn.hidden_rows, turn.ended_with_eos)


def turn_sampler(engine: InferenceEngine, prompt: Sequence[int], seed: int,
                 temperature: float) -> TurnSampler:
    """One episode's model turns, each a request on the prompt and the episode so far, sampled with the
    noise of its positions in the completion."""

    def sample_turn(so_far: Sequence[int], budget: int) -> ModelTurn:
        [turn] = engine.generate_group([*prompt, *so_far], 1, [seed], budget, temperature, len(so_far))
        return model_turn(turn)

    return sample_turn


def play_groups(engine: InferenceEngine, tasks: Sequence[Task], rules: EpisodeRules,
                prompts: Sequence[Sequence[int]], seeds: Sequence[Sequence[int]],
                temperature: float) -> list[GeneratedGroup]:
    """Multi-turn groups, one episode per seed, played together (`play_all`). A group's first turns share
    the prompt as their context: they are sampled as one group (every group in one batch where the engine
    can). Each later round, the turns of every episode still going are one batch (`generate_turns`), each
    a request on its prompt and episode so far with the noise of its positions in the completion."""
    first_budget, size = rules.turn_budget(0), len(seeds[0]) if seeds else 0
    if any(len(s) != size for s in seeds):
        raise ValueError("every group of an assignment has the run's group size")
    batched = getattr(engine, "generate_groups", None)
    if batched is not None:
        firsts = batched([list(p) for p in prompts], size, seeds, first_budget, temperature)
    else:
        firsts = [engine.generate_group(list(p), size, s, first_budget, temperature)
                  for p, s in zip(prompts, seeds, strict=True)]
    contexts = [(tuple(p), seed) for p, group in zip(prompts, seeds, strict=True) for seed in group]

    def sample_turns(asks: Sequence[TurnAsk]) -> list[ModelTurn]:
        requests = [TurnRequest((*contexts[i][0], *so_far), contexts[i][1], len(so_far), budget)
                    for i, so_far, budget in asks]
        return [model_turn(c) for c in engine.generate_turns(requests, temperature)]

    episodes = [(task, seed) for task, group in zip(tasks, seeds, strict=True) for seed in group]
    played = play_all(rules, episodes, engine.tokenizer, sample_turns,
                      [model_turn(c) for group in firsts for c in group])
    groups = []
    for g, (task, prompt, seeds_of_group) in enumerate(zip(tasks, prompts, seeds, strict=True)):
        mine = played[g * size : (g + 1) * size]
        completions = [
            EngineCompletion(p.tokens, p.logprobs(), p.hidden_rows(), seed, p.turns[-1].ended_with_eos,
                             p.env_spans)
            for p, seed in zip(mine, seeds_of_group, strict=True)
        ]
        groups.append(GeneratedGroup(task, tuple(prompt), completions, [p.reward for p in mine]))
    return groups


def play_group(engine: InferenceEngine, task: Task, rules: EpisodeRules, prompt: Sequence[int],
               seeds: Sequence[int], temperature: float) -> GeneratedGroup:
    """`play_groups` of one group."""
    return play_groups(engine, [task], rules, [prompt], [seeds], temperature)[0]


def completion_proofs(completions: Sequence[EngineCompletion],
                      descriptor: RunDescriptor) -> list[list[bytes]]:
    """TOPLOC proofs of every completion (a group's, or a whole submission's) in one vectorised pass."""
    policy = descriptor.policy
    rows = [c.hidden_rows for c in completions]
    return build_proofs_batch(rows, k=policy.toploc_k, chunk=policy.toploc_chunk)


def to_wire_group(generated: GeneratedGroup, descriptor: RunDescriptor, tokenizer: ChatTokenizer,
                  rewards: Sequence[float] | None = None,
                  proofs: Sequence[Sequence[bytes]] | None = None) -> RolloutGroup:
    """Score the group, compute advantages and TOPLOC proofs, and freeze it as a RolloutGroup.

    `proofs` (one list per completion) are the group's when the caller built a whole submission's at once.
    """
    tokens = [c.tokens for c in generated.completions]
    if rewards is None:
        rewards = generated.rewards or completion_rewards(generated.task, tokens, descriptor, tokenizer)
    advantages = group_advantages(torch.tensor(rewards)).tolist()
    if proofs is None:
        proofs = completion_proofs(generated.completions, descriptor)
    if len(proofs) != len(generated.completions):
        raise ValueError(f"{len(proofs)} proof lists for {len(generated.completions)} completions")
    completions = tuple(
        Completion(
            token_ids=c.tokens,
            logprobs=pack_logprobs(c.logprobs),
            reward=float(r),
            advantage=float(a),
            seed=c.seed,
            ended_with_eos=c.ended_with_eos,
            proofs=tuple(p),
            env_spans=c.env_spans,
        )
        for c, r, a, p in zip(generated.completions, rewards, advantages, proofs, strict=True)
    )
    return RolloutGroup(generated.task.task_id, generated.prompt_ids, completions)


def build_submission(engine: InferenceEngine, descriptor: RunDescriptor, dataset: Mapping[bytes, Task],
                     dataset_ids: Sequence[bytes], worker: bytes, checkpoint_version: int,
                     checkpoint_root: bytes, counter: int) -> RolloutSubmission:
    """An honest worker's submission for its `counter`-th assignment on `checkpoint_version`.

    A counter the run does not allow is refused (ValueError): validators would reject it 602 and slash.
    """
    allowed = descriptor.max_submissions_per_version
    if counter >= allowed:
        raise ValueError(f"counter {counter}: the run allows {allowed} submissions per version")
    step = assignment_step(checkpoint_version, counter)
    tasks = [dataset[task_id] for task_id in assigned_tasks(descriptor, dataset_ids, worker, step)]
    generated = generate_groups(engine, tasks, descriptor, worker, step)
    proofs = completion_proofs([c for g in generated for c in g.completions], descriptor)
    starts = [0]
    for g in generated:
        starts.append(starts[-1] + len(g.completions))
    played = [g.rewards for g in generated if g.rewards is not None]  # a multi-turn run's, as played
    rewards = played if descriptor.environment else submission_rewards(
        [(g.task, [c.tokens for c in g.completions]) for g in generated], descriptor, engine.tokenizer)
    groups = tuple(
        to_wire_group(g, descriptor, engine.tokenizer, rewards=r, proofs=proofs[a:b])
        for g, r, a, b in zip(generated, rewards, starts[:-1], starts[1:], strict=True)
    )
    return RolloutSubmission(descriptor.run, step, checkpoint_version, checkpoint_root, groups)


def generate_groups(engine: InferenceEngine, tasks: Sequence[Task], descriptor: RunDescriptor, worker: bytes,
                    step: int) -> list[GeneratedGroup]:
    """`generate_group` for every task of an assignment; in one batch where the engine can (vLLM)."""
    grpo, rules = descriptor.grpo, episode_rules(descriptor)
    if rules is not None:  # every episode of the assignment, played round by round
        prompts = [task_prompt_ids(task, engine.tokenizer, rules) for task in tasks]
        seeds = [group_seeds(descriptor.run, worker, step, t.task_id, grpo.group_size) for t in tasks]
        return play_groups(engine, tasks, rules, prompts, seeds, grpo.temperature)
    batched = getattr(engine, "generate_groups", None)
    if batched is None:
        return [generate_group(engine, task, descriptor, worker, step) for task in tasks]
    prompts = [task_prompt_ids(task, engine.tokenizer) for task in tasks]
    seeds = [group_seeds(descriptor.run, worker, step, t.task_id, grpo.group_size) for t in tasks]
    made = batched(prompts, grpo.group_size, seeds, grpo.max_new_tokens, grpo.temperature)
    return [GeneratedGroup(t, p, c) for t, p, c in zip(tasks, prompts, made, strict=True)]
