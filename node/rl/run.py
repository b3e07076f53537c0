"""A run's fixed facts: the devnet's defaults, its dataset and the signed RunDescriptor.

Everything a validator needs to recompute a verdict is derivable from the descriptor: the dataset
hash names the task list, the model digests the model folder (config, tokenizer files, base weights),
the policy the TOPLOC bounds. `load_run_setup` is where every role checks its own model folder and task
file against them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from swarmnode.node.errors import RunMismatch
from swarmnode.node.rl.environments.episodes import (
    UnknownEnvironment,
    default_terms,
    episode_rules,
    rules_from_terms,
)
from swarmnode.node.rl.learner import OptimizerParams
from swarmnode.node.rl.model import ModelCommitment, ModelInfo, check_commitment, model_commitment
from swarmnode.node.rl.rollouts import task_prompt_ids
from swarmnode.node.rl.tasks import GRADERS, Task, dataset_hash
from swarmnode.node.rl.tasks.arithmetic import DEVNET_PARAMS, ArithmeticParams, generate_tasks
from swarmnode.node.rl.tokenizer import ChatTokenizer, load_tokenizer
from swarmnode.protocol.messages import (
    MAX_COMPLETION_TOKENS,
    EnvironmentTerms,
    GrpoParams,
    RunDescriptor,
    ValidatorPolicy,
)

ASSETS = Path(__file__).resolve().parent / "assets"
DEVNET_MODEL = ASSETS / "devnet-model"
# The calculator devnet's model (`devnet --env calculator`): warm-started on calculator episodes of
# `arithmetic.DEVNET_PRODUCTS` by scripts/make_devnet_model.py --env calculator.
DEVNET_CALC_MODEL = ASSETS / "calc-model"
DEVNET_RUN = "devnet"
DEVNET_DATASET_SEED = 2026
DEVNET_DATASET_SIZE = 512
DEVNET_EVAL_SEED = 2027
DEVNET_EVAL_SIZE = 128


DEVNET_MAX_NEW_TOKENS = 6


def devnet_grpo(info: ModelInfo, max_new_tokens: int = DEVNET_MAX_NEW_TOKENS) -> GrpoParams:
    """The devnet's GRPO recipe for the committed tiny model (node/rl/assets/devnet-model: a Qwen2 of 159k
    parameters, a 281-token BPE vocabulary, warm-started on two-digit additions to ~0.31 at temperature 1).

    Measured with the synchronous baseline, 30 steps, reward at temperature 1 on a fixed held-out set
    (128 tasks x 8 samples, same seeds before and after), `benchmarks/bench_rl.py` (2 threads, TOPLOC
    proofs on): base 0.314 -> 0.443 (1.41x); per-step reward of the trained groups 0.32 (first 5 steps) ->
    0.48 (last 5); a step is ~0.5 s of sampling, rewards and proofs and ~0.09 s of training on 2 cores.
    The same recipe on the previous character-level base (136k parameters, 99 symbols) gave 0.321 -> 0.406
    (1.26x) over three worker addresses, and the figures below were measured on that base; the recipe
    carried over unchanged.

    Why these numbers:
    - learning rate 2e-4 with `devnet_optimizer` (betas (0.9, 0.99), 3 warmup steps). The trainer's AdamW
      starts with empty moments, and its first steps are sign steps that, for a gradient of a few hundred
      completions, move the tiny model's function far more than a random step of the same size: one step
      at 1e-3 takes the base from 0.35 to 0.2 (at 2e-3 to 0.06), whether the gradient is GRPO's or a plain
      supervised one, and the old default (2e-3, 4 prompts) ended at 0.01-0.06 after 30 steps. 5e-4 still
      drifts down; 1e-4 to 3e-4 rise, 2e-4 fastest without losing it later.
    - 32 prompts x 8 completions per step: the group gradient is the noise-limited part, and 4 or 8 prompts
      leave every lr either too slow or unstable; 16 prompts rise less (~0.42 at step 30), 64 and 128
      prompts only a little more (0.46, 0.49) at 2x and 4x the generation and proof time.
    - max_new_tokens 6: the longest answer is 3 digits + EOS; two spare tokens let a wrong, unterminated
      answer show up as such. Temperature 1, the design's clipping (eps 0.2, delta 4), grad-norm clip 1
      and the constant token budget G * prompts * max_new_tokens are unchanged.
    """
    group_size, prompts, max_new = 8, 32, max_new_tokens
    if not 1 <= max_new <= info.max_positions - 32:
        raise ValueError(
            f"max_new_tokens {max_new} does not fit the model's {info.max_positions} positions "
            "beside a prompt"
        )
    return GrpoParams(
        group_size=group_size,
        prompts_per_step=prompts,
        max_new_tokens=max_new,
        temperature=1.0,
        learning_rate=2e-4,
        clip_epsilon=0.2,
        clip_delta=4.0,
        max_grad_norm=1.0,
        token_budget=group_size * prompts * max_new,
        length_target=0,
        length_penalty=0.0003,
    )


def devnet_optimizer() -> OptimizerParams:
    """The trainer's AdamW settings that go with `devnet_grpo` (see there, and `node.rl.learner`)."""
    return OptimizerParams(betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, warmup_steps=3)


def devnet_policy() -> ValidatorPolicy:
    """Bounds for the fp32 CPU path, where prefill reproduces generation almost exactly.

    `swarmnode calibrate` measures them for a given checkpoint; these defaults hold the measured honest
    maximum with a wide margin (see spec/toploc.md).
    """
    return ValidatorPolicy(
        toploc_k=128,
        toploc_chunk=32,
        max_mean_exp_mismatches=1.0,
        max_mean_mant_err=0.5,
        sampling_tolerance=1e-3,
        eos_min_prob=1e-3,
        sample_fraction=1.0,
        min_stake_gwei=10**9,
        slash_gwei=5 * 10**8,
    )


def devnet_dataset(params: ArithmeticParams = DEVNET_PARAMS) -> list[Task]:
    """Distinct two-digit additions (or other `params`), in a fixed order."""
    tasks = generate_tasks(params, DEVNET_DATASET_SEED, DEVNET_DATASET_SIZE * 2)
    unique = list({t.task_id: t for t in tasks}.values())
    return unique[:DEVNET_DATASET_SIZE]


def devnet_eval_tasks(size: int = DEVNET_EVAL_SIZE, params: ArithmeticParams = DEVNET_PARAMS) -> list[Task]:
    """A fixed held-out evaluation set: distinct two-digit additions that are not in the training dataset.

    Reward measured on it at the start and the end of a run (the same tasks and sampling seeds both times,
    so the difference is not assignment noise) is what "reward rising" is judged by; the per-step reward of
    the trained groups swings by +-0.1 with which tasks a step happened to draw.
    """
    train = {t.task_id for t in devnet_dataset(params)}
    unique = {t.task_id: t for t in generate_tasks(params, DEVNET_EVAL_SEED, size * 4)}
    held_out = [t for t in unique.values() if t.task_id not in train]
    if len(held_out) < size:
        raise ValueError(f"only {len(held_out)} held-out tasks, {size} asked")
    return held_out[:size]


@dataclass(frozen=True)
class RunSetup:
    descriptor: RunDescriptor
    tasks: list[Task]

    @property
    def dataset(self) -> dict[bytes, Task]:
        return {t.task_id: t for t in self.tasks}

    @property
    def dataset_ids(self) -> list[bytes]:
        return [t.task_id for t in self.tasks]


def task_kinds(tasks: Sequence[Task]) -> str:
    """The descriptor's `task_kind`: the kinds the dataset holds, sorted, joined by '+'."""
    return "+".join(sorted({t.kind for t in tasks}))


def describe_run(
    *,
    run: str,
    trainer: bytes,
    model: ModelCommitment,
    tasks: Sequence[Task],
    grpo: GrpoParams,
    policy: ValidatorPolicy,
    created_ms: int,
    async_level: int = 2,
    environment: EnvironmentTerms | None = None,
) -> RunDescriptor:
    """The descriptor a trainer signs for a model folder's digests and a dataset; a multi-turn run names
    its `environment` (spec/environments.md)."""
    return RunDescriptor(
        run=run,
        trainer=trainer,
        model_config_hash=model.config_hash,
        tokenizer_files=model.tokenizer_files,
        base_checkpoint_hash=model.weights_root,
        dataset_hash=dataset_hash(tasks),
        task_kind=task_kinds(tasks),
        grpo=grpo,
        async_level=async_level,
        policy=policy,
        created_ms=created_ms,
        environment=(environment,) if environment is not None else (),
    )


def run_commitment(descriptor: RunDescriptor) -> ModelCommitment:
    """The model digests a descriptor carries."""
    return ModelCommitment(
        descriptor.model_config_hash, descriptor.tokenizer_files, descriptor.base_checkpoint_hash
    )


def load_run_setup(descriptor: RunDescriptor, model_dir: Path, tasks: Sequence[Task]) -> RunSetup:
    """The run's setup, after checking that this node's model folder and tasks are the run's.

    Raises RunMismatch naming the file that differs (blocking: hashes every weights file).
    """
    run = repr(descriptor.run)
    try:
        check_commitment(model_dir, run_commitment(descriptor))
    except ValueError as exc:
        raise RunMismatch(f"run {run}: {exc}") from None
    if dataset_hash(tasks) != descriptor.dataset_hash:
        raise RunMismatch(
            f"run {run} names dataset {descriptor.dataset_hash.hex()[:16]}..., not this "
            f"node's tasks ({len(tasks)} tasks, {dataset_hash(tasks).hex()[:16]}...)"
        )
    try:
        rules = episode_rules(descriptor)
    except UnknownEnvironment as exc:
        raise RunMismatch(f"run {run}: {exc}") from None
    playable = set(rules.env.kinds) if rules is not None else set(GRADERS)
    unknown = sorted({t.kind for t in tasks} - playable)
    if unknown:
        which = "no grader here knows" if rules is None else f"environment {rules.env.name!r} does not play"
        raise RunMismatch(f"run {run} has tasks of kind(s) {', '.join(unknown)} that {which}")
    return RunSetup(descriptor, list(tasks))


def devnet_run(
    trainer: bytes,
    model_dir: Path = DEVNET_MODEL,
    created_ms: int = 0,
    grpo: GrpoParams | None = None,
    policy: ValidatorPolicy | None = None,
    tasks: Sequence[Task] | None = None,
    info: ModelInfo | None = None,
    max_new_tokens: int = DEVNET_MAX_NEW_TOKENS,
    environment: str = "",
) -> RunSetup:
    """The devnet's run on a model folder (its built-in one by default) and tasks (generated additions);
    a multi-turn run when `environment` names a built-in one."""
    tasks = list(tasks) if tasks is not None else devnet_dataset()
    if grpo is None:
        grpo = devnet_grpo(info or load_tokenizer(model_dir)[1], max_new_tokens)
    terms = None
    if environment:
        tokenizer, model_info = load_tokenizer(model_dir)
        terms = environment_for(environment, tasks, tokenizer, model_info, grpo.max_new_tokens)
    descriptor = describe_run(
        run=DEVNET_RUN,
        trainer=trainer,
        model=model_commitment(model_dir),
        tasks=tasks,
        grpo=grpo,
        policy=policy or devnet_policy(),
        created_ms=created_ms,
        environment=terms,
    )
    return RunSetup(descriptor, tasks)


def environment_for(name: str, tasks: Sequence[Task], tokenizer: ChatTokenizer, info: ModelInfo,
                    max_turn_tokens: int) -> EnvironmentTerms:
    """The terms of a run playing the built-in environment `name` on `tasks`: its default bounds, and every
    episode fitting the model's context after the longest prompt (RunMismatch when not even one turn of
    `max_turn_tokens` does, or the tasks are not the environment's kinds)."""
    try:
        rules = rules_from_terms(default_terms(name, MAX_COMPLETION_TOKENS), max_turn_tokens)
    except UnknownEnvironment as exc:
        raise RunMismatch(str(exc)) from None
    foreign = sorted({t.kind for t in tasks} - set(rules.env.kinds))
    if foreign:
        raise RunMismatch(f"environment {name!r} plays tasks of kind {', '.join(rules.env.kinds)}, "
                          f"not {', '.join(foreign)}")
    longest = max(len(task_prompt_ids(t, tokenizer, rules)) for t in tasks)
    room = min(info.max_positions - longest, MAX_COMPLETION_TOKENS)
    if room < max_turn_tokens:
        raise RunMismatch(f"the longest prompt, with the instructions of environment {name!r}, takes "
                          f"{longest} of the model's {info.max_positions} positions: no room for a turn of "
                          f"{max_turn_tokens} tokens (a model of more positions, or shorter prompts)")
    return default_terms(name, room)
