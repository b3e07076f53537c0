"""Devnet-only dishonest workers: each cheat is one small pure function applied at one point of the honest
pipeline (`node.rl.rollouts`), so the submission stays well-formed and signed and only a validator check
(`node.rl.validation`) can catch it. `conduct_for(name)` gives the worker's `Conduct` (node.worker.conduct)
for a cheat: the composition root hands it to a worker whose `[work] cheat` names one.

| cheat             | applied                                     | claims                 | caught by      |
|-------------------|---------------------------------------------|------------------------|----------------|
| `perturbed-model` | to every loaded checkpoint's weights        | the trainer's weights  | BAD_PROOF      |
| `tampered-prompt` | to the first group's prompt, before it is   | the assigned task id   | BAD_ASSIGNMENT |
|                   | generated: an easier task's prompt tokens   |                        |                |
| `forged-reward`   | to one group's rewards, after scoring       | full marks for wrong   | BAD_REWARD     |
|                   |                                             | answers                |                |
| `code-injection`  | to one completion, after generation: a      | the model sampled it,  | BAD_SAMPLING   |
|                   | program that kills the grader's parent,     | full marks             | (never run)    |
|                   | with the model's own rows and logprobs      |                        |                |
| `fabricated-env-  | to a multi-turn run's episodes, as they are | the environment said   | FABRICATED_ENV_|
| turn`             | played: every environment reply becomes one | so                     | TURN (replay)  |
|                   | that hands the model the task's target      |                        |                |
| `greedy`          | to the worker's pacing (`paced` False):     | nothing false: honest  | nobody: fair   |
|                   | every counter up to the run's               | rollouts, within the   | judging bounds |
|                   | `max_submissions_per_version`, at once      | run's bound            | its share      |

Decisions:
- The perturbation is Gaussian noise of `PERTURB_FRACTION` (5%) of each tensor's own standard deviation, from
  a `torch.Generator` seeded with the checkpoint version: small enough that the model still answers in
  plausible digits, large enough that the hidden rows TOPLOC commits to move far outside the run's bounds.
- The forged group's advantages are recomputed from the forged rewards (`to_wire_group`), so the submission
  is internally consistent and only the reward recomputation, not the advantage check, can object.
- The tampered group keeps the assigned task's rewards (scored against the assigned target): the only lie is
  the prompt, which the assignment check compares with the task's own prompt.
- The injected program is teacher-forced through the worker's own engine, so its TOPLOC proofs and logprobs
  are the model's: only the sampling re-derivation (or the termination check) can tell it was not sampled,
  and a validator runs those before any grader. The worker never grades it (it would run it), it claims full
  marks. It goes into the first code task's group where there is one, else the first group.
- The fabricated environment turns are played, not edited afterwards: the model's later turns are sampled
  honestly on them, so every model check passes and only the validator's replay of the environment sees
  the lie. A run without an environment has nothing to fabricate: the cheat is refused there.
- The greedy worker breaks no rule a validator checks: it is the role abuse that fair judging
  (`node.validator.fairness`, round-robin per worker) and the per-worker queue bound must contain, so it
  is never slashed (tests/swarm/test_role_abuse_devnet.py measures what it costs honest workers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from swarmnode.node.rl.engine import Completion as EngineCompletion
from swarmnode.node.rl.engine import InferenceEngine
from swarmnode.node.rl.environments import Done, EnvBounds, EnvCall, Environment, EnvTurn, prefetch
from swarmnode.node.rl.environments.episodes import episode_rules
from swarmnode.node.rl.rollouts import (
    GeneratedGroup,
    assigned_tasks,
    assignment_step,
    generate_group,
    play_groups,
    submission_rewards,
    task_prompt_ids,
    to_wire_group,
)
from swarmnode.node.rl.sampling import group_seeds, token_logprobs
from swarmnode.node.rl.tasks import VERIFIERS_KIND, Task
from swarmnode.node.rl.tasks.verifiers_rows import parse_task
from swarmnode.node.rl.tokenizer import ChatTokenizer
from swarmnode.node.worker.conduct import HONEST
from swarmnode.protocol.messages import RolloutSubmission, RunDescriptor

PERTURBED_MODEL = "perturbed-model"
TAMPERED_PROMPT = "tampered-prompt"
FORGED_REWARD = "forged-reward"
CODE_INJECTION = "code-injection"
FABRICATED_ENV_TURN = "fabricated-env-turn"
GREEDY = "greedy"  # ignores pacing (`Cheat.paced`): honest weights and submissions
# applied by build_dishonest_submission
SUBMISSION_CHEATS = (TAMPERED_PROMPT, FORGED_REWARD, CODE_INJECTION, FABRICATED_ENV_TURN)
# What killed a validator before grading ran in the sandbox and after the model checks (issue #29).
KILL_PAYLOAD = "import os;os.kill(os.getppid(),9)"

PERTURB_FRACTION = 0.05
FULL_MARKS = 1.0


# --- perturbed-model ---------------------------------------------------------------------------------


def perturb_weights(
    state: Mapping[str, torch.Tensor], *, seed: int, fraction: float = PERTURB_FRACTION
) -> dict[str, torch.Tensor]:
    """A copy of `state` with N(0, (fraction * std)^2) noise added to every floating-point tensor."""
    generator = torch.Generator().manual_seed(seed)
    noisy: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            noisy[name] = tensor.clone()
            continue
        values = tensor.detach().to(torch.float32)
        spread = values.std() if values.numel() > 1 else values.abs().reshape(())
        noise = torch.randn(values.shape, generator=generator) * (fraction * spread)
        noisy[name] = (values + noise).to(tensor.dtype)
    return noisy


def tamper_weights(cheat: str, state: Mapping[str, torch.Tensor], version: int) -> Mapping[str, torch.Tensor]:
    """The weights a worker with this `cheat` actually loads for checkpoint `version`."""
    return perturb_weights(state, seed=version) if cheat == PERTURBED_MODEL else state


# --- tampered-prompt ---------------------------------------------------------------------------------


def easier_task(task: Task, dataset: Mapping[bytes, Task]) -> Task:
    """The dataset's easiest other task: the smallest answer, then the shortest prompt."""
    others = [t for t in dataset.values() if t.task_id != task.task_id]
    if not others:
        raise ValueError("the dataset has no other task to swap in")
    return min(others, key=lambda t: (len(t.target), t.target, len(t.prompt), t.prompt))


def tampered_prompt(task: Task, dataset: Mapping[bytes, Task], tokenizer: ChatTokenizer) -> tuple[int, ...]:
    """Prompt tokens to generate on instead of `task`'s own: an easier task's."""
    return task_prompt_ids(easier_task(task, dataset), tokenizer)


# --- forged-reward -----------------------------------------------------------------------------------


def forge_rewards(rewards: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per-group rewards with the first group that has a wrong answer claimed at full marks throughout.

    With no wrong answer anywhere, the first completion claims more than full marks: the cheat always lies.
    """
    forged = [list(group) for group in rewards]
    for group in forged:
        if any(r < FULL_MARKS for r in group):
            group[:] = [FULL_MARKS] * len(group)
            return forged
    if forged and forged[0]:
        forged[0][0] += FULL_MARKS
    return forged


# --- code-injection ----------------------------------------------------------------------------------


def forced_completion(engine: InferenceEngine, prompt_ids: Sequence[int], tokens: Sequence[int], seed: int,
                      temperature: float) -> EngineCompletion:
    """`tokens` as a completion the model could have produced: its hidden rows and logprobs are the engine's
    own, teacher-forced; only the tokens were chosen, not sampled. Anyone holding the checkpoint can do this
    for any text, which is why a validator grades nothing before the sampling check."""
    forced = engine.prefill(list(prompt_ids), list(tokens))
    logprobs = token_logprobs(forced.logits, torch.tensor(tokens), temperature)
    ended = engine.tokenizer.is_eos(tokens[-1])
    return EngineCompletion(tuple(tokens), logprobs, forced.hidden_rows, seed, ended)


def injected_completion(engine: InferenceEngine, prompt_ids: Sequence[int], seed: int,
                        max_new_tokens: int, temperature: float) -> EngineCompletion:
    """`KILL_PAYLOAD` + EOS, teacher-forced (`forced_completion`)."""
    tokenizer = engine.tokenizer
    tokens = (*tokenizer.encode(KILL_PAYLOAD), tokenizer.eos_token_ids[0])
    if len(tokens) > max_new_tokens:
        raise ValueError(f"the code-injection payload takes {len(tokens)} tokens, the run allows "
                         f"{max_new_tokens}: run the devnet with --max-new-tokens {len(tokens)} or more")
    return forced_completion(engine, prompt_ids, tokens, seed, temperature)


def inject_code(engine: InferenceEngine, generated: list[GeneratedGroup], descriptor: RunDescriptor) -> int:
    """Replace the first completion of the first code group (else of the first group) by the payload;
    returns the group's index."""
    index = next((i for i, g in enumerate(generated) if g.task.kind == "code"), 0)
    group = generated[index]
    grpo = descriptor.grpo
    seed = group.completions[0].seed
    injected = injected_completion(engine, group.prompt_ids, seed, grpo.max_new_tokens, grpo.temperature)
    generated[index] = GeneratedGroup(group.task, group.prompt_ids, [injected, *group.completions[1:]])
    return index


# --- fabricated-env-turn ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fabricating:
    """The environment as the cheat tells it: wherever the real one replies, the reply hands the model the
    task's target (a tool that "computed" the answer); the episode's end and reward are the real one's."""

    inner: Environment

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def version(self) -> str:
        return self.inner.version

    @property
    def bounds(self) -> EnvBounds:
        return self.inner.bounds

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.inner.kinds

    @property
    def instructions(self) -> str:
        return self.inner.instructions

    def respond_many(self, calls: Sequence[EnvCall]) -> None:
        prefetch(self.inner, calls)

    def respond(self, task: Task, seed: int, model_turns: Sequence[str]) -> EnvTurn | Done:
        reply = self.inner.respond(task, seed, model_turns)
        return EnvTurn(f"<result>{_answer(task)}</result>") if isinstance(reply, EnvTurn) else reply


def _answer(task: Task) -> str:
    """What a lying tool would hand the model: the task's target, or a verifiers row's answer (its target is
    the whole row)."""
    if task.kind == VERIFIERS_KIND:
        return str(parse_task(task).row.get("answer", ""))
    return task.target


def fabricated_groups(engine: InferenceEngine, tasks: Sequence[Task], descriptor: RunDescriptor,
                      worker: bytes, step: int) -> list[GeneratedGroup]:
    """An assignment's groups played together, as an honest worker plays them (`play_groups`: a round of
    turns is one batch, one sandbox run for a verifiers environment), with `Fabricating` in place of the
    run's environment."""
    rules = episode_rules(descriptor)
    if rules is None:
        raise ValueError("fabricated-env-turn needs a run that plays an environment (devnet --env NAME)")
    grpo = descriptor.grpo
    seeds = [group_seeds(descriptor.run, worker, step, task.task_id, grpo.group_size) for task in tasks]
    prompts = [task_prompt_ids(task, engine.tokenizer, rules) for task in tasks]
    lying = dataclasses.replace(rules, env=Fabricating(rules.env))
    return play_groups(engine, tasks, lying, prompts, seeds, grpo.temperature)


# --- the dishonest submission --------------------------------------------------------------------------


def build_dishonest_submission(
    cheat: str,
    engine: InferenceEngine,
    descriptor: RunDescriptor,
    dataset: Mapping[bytes, Task],
    dataset_ids: Sequence[bytes],
    worker: bytes,
    checkpoint_version: int,
    checkpoint_root: bytes,
    counter: int,
) -> RolloutSubmission:
    """`build_submission` with a submission-time cheat (`SUBMISSION_CHEATS`) applied."""
    if cheat not in SUBMISSION_CHEATS:
        raise ValueError(f"{cheat!r} is not a submission-time cheat")
    step = assignment_step(checkpoint_version, counter)
    tasks = [dataset[task_id] for task_id in assigned_tasks(descriptor, dataset_ids, worker, step)]
    generated: list[GeneratedGroup] = []
    if cheat == FABRICATED_ENV_TURN:
        generated = fabricated_groups(engine, tasks, descriptor, worker, step)
    for i, task in enumerate(tasks if cheat != FABRICATED_ENV_TURN else ()):
        tamper = cheat == TAMPERED_PROMPT and i == 0
        prompt = tampered_prompt(task, dataset, engine.tokenizer) if tamper else None
        generated.append(generate_group(engine, task, descriptor, worker, step, prompt))
    injected = inject_code(engine, generated, descriptor) if cheat == CODE_INJECTION else -1
    # graded together, as an honest worker grades (a family's answers in one sandbox run); the payload is
    # never run here
    graded = [(g.task, [c.tokens for c in (g.completions[1:] if i == injected else g.completions)])
              for i, g in enumerate(generated) if g.rewards is None]
    scored = iter(submission_rewards(graded, descriptor, engine.tokenizer))
    rewards = []
    for i, g in enumerate(generated):
        group_rewards = g.rewards if g.rewards is not None else next(scored)
        rewards.append([FULL_MARKS, *group_rewards] if i == injected else group_rewards)
    if cheat == FORGED_REWARD:
        rewards = forge_rewards(rewards)
    groups = tuple(
        to_wire_group(g, descriptor, engine.tokenizer, r) for g, r in zip(generated, rewards, strict=True)
    )
    return RolloutSubmission(descriptor.run, step, checkpoint_version, checkpoint_root, groups)


# --- the worker's conduct -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cheat:
    """A worker's `Conduct` (node.worker.conduct): one named cheat where it applies, honest elsewhere."""

    name: str

    @property
    def paced(self) -> bool:
        return self.name != GREEDY

    def weights(self, state: Mapping[str, torch.Tensor], version: int) -> Mapping[str, torch.Tensor]:
        return tamper_weights(self.name, state, version)

    def build(
        self,
        engine: InferenceEngine,
        descriptor: RunDescriptor,
        dataset: Mapping[bytes, Task],
        dataset_ids: Sequence[bytes],
        worker: bytes,
        version: int,
        root: bytes,
        counter: int,
    ) -> RolloutSubmission:
        if self.name in SUBMISSION_CHEATS:
            return build_dishonest_submission(
                self.name, engine, descriptor, dataset, dataset_ids, worker, version, root, counter
            )
        return HONEST.build(engine, descriptor, dataset, dataset_ids, worker, version, root, counter)


CHEATS = (PERTURBED_MODEL, TAMPERED_PROMPT, FORGED_REWARD, CODE_INJECTION, FABRICATED_ENV_TURN, GREEDY)


def conduct_for(name: str) -> Cheat:
    """The conduct of the cheat `name` (ValueError for a name that is none)."""
    if name not in CHEATS:
        raise ValueError(f"no cheat named {name!r}: one of {', '.join(CHEATS)}")
    return Cheat(name)
