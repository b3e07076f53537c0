"""Conformance cases for spec/rollouts.md and spec/validation.md: task ids, assignment, seeds, the seeded
sampler, rewards and advantages, and validators' verdicts on signed submissions.

The `rollouts` suite of node/conformance.py: scripts/gen_vectors.py writes `SUITES` to
spec/vectors/rollouts/*.json; tests/rl/test_rollout_vectors.py fails when the committed files and these
cases disagree, and replays the files as `swarmnode conformance` does. Every expectation is computed by
the real handler; that test pins the ones the specs document (the cheats' reason codes above all).

Decisions:
- The validation and reward cases use the devnet's committed model folder (`DEVNET_MODEL`, named in each
  case by its base weights root) with a small run: 16 devnet tasks, 1 prompt x 2 completions per
  submission, the devnet policy; completion token ids are that folder's tokenizer's.
  Submissions are honest ones built by `node.rl.rollouts`, the devnet cheats of
  `swarmnode.testing.cheats`, and single-field edits of an honest one, each signed by the worker key, so
  one case exercises one check.
- Sampling logits are multiples of 1/16 (exact in float32), and the generator refuses a case whose best
  perturbed score leads the runner-up by less than `MIN_MARGIN`: another implementation's Gumbel noise
  may differ from ours in the last bits, never by that much.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from typing import Any

import torch

from swarmnode.crypto.hashing import sha256
from swarmnode.node.rl.conformance import (
    check_assignment,
    check_dataset_hash,
    check_rewards,
    check_sampling,
    check_sampling_rule,
    check_seed,
    check_task_id,
    check_validation,
)
from swarmnode.node.rl.engine import Completion as EngineCompletion
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.model import model_commitment
from swarmnode.node.rl.rollouts import (
    GeneratedGroup,
    assigned_tasks,
    assignment_step,
    build_submission,
    generate_group,
    pack_logprobs,
    task_prompt_ids,
    to_wire_group,
    unpack_logprobs,
)
from swarmnode.node.rl.run import DEVNET_MODEL, describe_run, devnet_dataset, devnet_grpo, devnet_policy
from swarmnode.node.rl.sampling import derive_seed, perturbed_scores
from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.tasks.core import task_fields
from swarmnode.protocol.codec import encode as encode_message
from swarmnode.protocol.envelope import seal
from swarmnode.protocol.messages import RolloutSubmission, RunDescriptor
from swarmnode.testing.cheats import (
    FORGED_REWARD,
    PERTURBED_MODEL,
    TAMPERED_PROMPT,
    build_dishonest_submission,
    tamper_weights,
)
from tests.conformance.keys import NOW_MS, RUN, vector_identity
from tests.rl.cases_tasks import target_length_cases

Vector = dict[str, Any]
Handler = Callable[[dict[str, Any]], dict[str, Any]]

TRAINER, WORKER, OTHER_WORKER = vector_identity(1), vector_identity(3), vector_identity(4)
DATASET_SIZE = 16
COUNTER = 3  # the honest base of the validation cases: two different completions, one right, one wrong
MIN_MARGIN = 1e-3


def _h(data: bytes) -> str:
    return "0x" + data.hex()


def _case(name: str, kind: str, description: str, inp: dict[str, Any], check: Handler) -> Vector:
    return {"name": name, "kind": kind, "description": description, "input": inp, "expect": check(inp)}


def _task_json(task: Task) -> dict[str, Any]:
    return task_fields(task)


@cache
def _dataset() -> tuple[Task, ...]:
    return tuple(devnet_dataset()[:DATASET_SIZE])


def _dataset_ids() -> list[bytes]:
    return [t.task_id for t in _dataset()]


# ---------------------------------------------------------------------------- task ids


def task_cases() -> Iterator[Vector]:
    def task(name: str, description: str, t: Task) -> Vector:
        return _case(f"task-id/{name}", "task_id", description, _task_json(t), check_task_id)

    yield task("arithmetic", "a devnet task: sha256 of the canonical JSON", Task("arithmetic", "12+7=", "19"))
    yield task(
        "math-escapes-and-utf8",
        "backslashes and quotes are JSON-escaped, non-ASCII stays UTF-8 (not \\u-escaped)",
        Task("math", 'Area of a circle of radius 2 ("r=2"), in terms of π?', "\\boxed{4\\pi}"),
    )
    yield task(
        "code-newlines",
        "newlines in the target are escaped as \\n; keys are sorted (kind, prompt, target)",
        Task("code", "Write f(x) returning x+1.", "assert f(1) == 2\nassert f(-1) == 0\n"),
    )

    def dataset(name: str, description: str, tasks: list[Task]) -> Vector:
        inp = {"tasks": [_task_json(t) for t in tasks]}
        return _case(f"dataset-hash/{name}", "dataset_hash", description, inp, check_dataset_hash)

    yield dataset("one-task", "a single leaf: the root is sha256(0x00 || task id)", [_dataset()[0]])
    yield dataset(
        "validation-dataset",
        f"the first {DATASET_SIZE} devnet tasks, the dataset of the validation vectors",
        list(_dataset()),
    )
    yield from target_length_cases()


# ---------------------------------------------------------------------------- assignment


def assignment_cases() -> Iterator[Vector]:
    ids = _dataset_ids()

    def case(
        name: str,
        description: str,
        version: int,
        counter: int,
        count: int,
        dataset: list[bytes] = ids,
        worker: bytes = WORKER.address,
    ) -> Vector:
        inp = {
            "dataset_ids": [_h(i) for i in dataset],
            "worker": _h(worker),
            "checkpoint_version": version,
            "counter": counter,
            "prompts_per_step": count,
        }
        return _case(f"assignment/{name}", "assignment", description, inp, check_assignment)

    yield case("v0-counter-0", "the first submission on the base checkpoint, one prompt", 0, 0, 1)
    yield case("v0-counter-1", "the second submission on the same version: another step", 0, 1, 1)
    yield case("v3-counter-0-four", "version 3: step = 3 << 32; four distinct tasks", 3, 0, 4)
    yield case(
        "v3-counter-0-four-other-worker",
        "the same step for another worker address gives another assignment",
        3,
        0,
        4,
        worker=OTHER_WORKER.address,
    )
    yield case(
        "whole-small-dataset",
        "every task of a 5-task dataset: repeated indices are skipped until 5 distinct ones are drawn",
        1,
        2,
        5,
        dataset=ids[:5],
    )
    yield case("dataset-of-one", "a 1-task dataset always assigns its task", 7, 0, 1, dataset=ids[:1])
    yield case(
        "largest-step",
        "version 2^32-1 and counter 2^32-1: step 2^64-1, the largest u64",
        2**32 - 1,
        2**32 - 1,
        2,
    )
    yield case("error-counter-2^32", "the counter must fit 32 bits", 0, 2**32, 1)
    yield case("error-counter-negative", "the counter is unsigned", 0, -1, 1)
    yield case("error-version-2^32", "version 2^32 puts the step beyond u64", 2**32, 0, 1)
    yield case(
        "error-more-prompts-than-tasks",
        "prompts_per_step cannot exceed the dataset size (distinct tasks)",
        0,
        0,
        DATASET_SIZE + 1,
    )


# ---------------------------------------------------------------------------- seeds


def seed_cases() -> Iterator[Vector]:
    task_id = _dataset_ids()[0]
    step = assignment_step(3, 1)

    def case(
        name: str, description: str, index: int, run: str = RUN, worker: bytes = WORKER.address,
        tid: bytes = task_id, at: int = step,
    ) -> Vector:
        inp = {"run": run, "worker": _h(worker), "step": at, "task_id": _h(tid), "index": index}
        return _case(f"seed/{name}", "seed", description, inp, check_seed)

    for i in range(3):
        yield case(f"completion-{i}", f"completion {i} of a group (version 3, counter 1)", i)
    yield case("other-worker", "another worker, same step, task and index", 0, worker=OTHER_WORKER.address)
    yield case("other-task", "another task", 0, tid=_dataset_ids()[1])
    yield case("other-run", "another run name", 0, run="devnet")
    yield case("other-counter", "the next counter on the same version: another seed", 0, at=step + 1)
    yield case("other-version", "the same counter on version 4: another seed", 0, at=assignment_step(4, 1))
    yield case("step-0", "version 0, counter 0", 0, at=0)
    yield case("largest-step", "step 2^64-1 is the largest", 0, at=2**64 - 1)
    yield case("largest-index", "index 2^32-1 is the largest", 2**32 - 1)
    yield case("error-index-2^32", "the index must fit 32 bits", 2**32)
    yield case("error-step-2^64", "the step must fit 64 bits", 0, at=2**64)


# ---------------------------------------------------------------------------- sampling


def _logits(rng: random.Random, rows: int, vocab: int) -> list[list[float]]:
    return [[rng.randint(-64, 64) / 16 for _ in range(vocab)] for _ in range(rows)]


def _margins_ok(logits: list[list[float]], seed: int, temperature: float) -> bool:
    """Best perturbed score ahead of the runner-up by at least MIN_MARGIN at every position."""
    table = torch.tensor(logits, dtype=torch.float32)
    for p, row in enumerate(table):
        top = perturbed_scores(row[None], [seed], p, temperature)[0].topk(2).values
        if float(top[0] - top[1]) < MIN_MARGIN:
            return False
    return True


def sampling_cases() -> Iterator[Vector]:
    rng = random.Random(6)

    def case(name: str, description: str, logits: list[list[float]], seed: int, temperature: float) -> Vector:
        if not _margins_ok(logits, seed, temperature):
            raise ValueError(f"sampling/{name}: a near tie; pick another seed")
        inp = {"logits": logits, "temperature": temperature, "seed": seed}
        return _case(f"sampling/{name}", "sampling", description, inp, check_sampling)

    seed = derive_seed(RUN, WORKER.address, 0, _dataset_ids()[0], 0)
    yield case(
        "t1-v8", "temperature 1, 4 positions x 8 tokens, a derived seed", _logits(rng, 4, 8), seed, 1.0
    )
    yield case("t0.5-v8", "temperature 0.5 sharpens the logits (logits / 0.5)", _logits(rng, 4, 8), 1, 0.5)
    yield case("t2-v16", "temperature 2, 3 positions x 16 tokens, seed 0", _logits(rng, 3, 16), 0, 2.0)
    yield case(
        "flat-logits",
        "all logits equal: the token is the argmax of the noise alone",
        [[0.0] * 8 for _ in range(4)],
        2**63 - 1,
        1.0,
    )
    yield case("vocab-99", "the devnet vocabulary size, 3 positions", _logits(rng, 3, 99), 12345, 1.0)
    yield case("greedy-t0", "temperature 0: plain argmax, no noise", _logits(rng, 4, 8), 7, 0.0)

    def rule(
        name: str,
        description: str,
        logits: list[list[float]],
        tokens: list[int],
        seed: int,
        temperature: float = 1.0,
    ) -> Vector:
        inp = {
            "logits": logits,
            "tokens": tokens,
            "seed": seed,
            "temperature": temperature,
            "tolerance": 1e-3,
        }
        return _case(f"sampling-rule/{name}", "sampling_rule", description, inp, check_sampling_rule)

    logits, seed = _logits(rng, 4, 8), 99
    honest = check_sampling({"logits": logits, "temperature": 1.0, "seed": seed})["tokens"]
    yield rule("honest", "the sampler's own tokens pass", logits, honest, seed)
    changed = list(honest)
    changed[2] = (changed[2] + 1) % 8
    yield rule("one-token-changed", "another token at position 2: a mismatch there", logits, changed, seed)
    greedy = check_sampling({"logits": logits, "temperature": 0.0, "seed": seed})["tokens"]
    runner_up = max((v for v in range(8) if logits[0][v] < max(logits[0])), key=lambda v: logits[0][v])
    yield rule(
        "greedy-runner-up",
        "temperature 0: the argmax everywhere but the runner-up at position 0",
        logits,
        [runner_up, *greedy[1:]],
        seed,
        0.0,
    )
    for gap, verdict in ((5e-4, "within"), (2e-3, "beyond")):
        near, claimed = _near_tie(logits, seed, position=1, gap=gap)
        yield rule(
            f"near-tie-{verdict}-tolerance",
            f"at position 1 the claimed token's perturbed score trails the best by ~{gap:g} "
            f"({verdict} the tolerance 1e-3)",
            near,
            claimed,
            seed,
        )


def _near_tie(
    logits: list[list[float]], seed: int, position: int, gap: float
) -> tuple[list[list[float]], list[int]]:
    """Logits in which the runner-up at `position` trails the best perturbed score by about `gap`, and the
    tokens of an otherwise honest sampler that claims that runner-up there."""
    table = torch.tensor(logits, dtype=torch.float32)
    row = table[position]
    scores = perturbed_scores(row[None], [seed], position, 1.0)[0]
    noise = scores - row
    best, runner = scores.topk(2).indices.tolist()
    row[runner] = scores[best] - noise[runner] - gap  # float32 arithmetic: the result is exact in float32
    tokens = check_sampling({"logits": table.tolist(), "temperature": 1.0, "seed": seed})["tokens"]
    tokens[position] = runner
    return table.tolist(), tokens


# ---------------------------------------------------------------------------- rewards and advantages


def reward_cases() -> Iterator[Vector]:
    def case(
        name: str,
        description: str,
        task: Task,
        texts: list[list[int]],
        length_target: int = 0,
        length_penalty: float = 0.0003,
    ) -> Vector:
        inp = {
            "model": _h(_setup().weights_root),
            "task": _task_json(task),
            "completions": texts,
            "length_target": length_target,
            "length_penalty": length_penalty,
        }
        return _case(f"rewards/{name}", "rewards", description, inp, check_rewards)

    tokenizer = _setup().engine.tokenizer
    encode = tokenizer.encode
    eos = [tokenizer.eos_token_ids[0]]
    add = Task("arithmetic", "12+7=", "19")
    yield case(
        "arithmetic-mixed",
        "exact match after stripping spaces; text up to EOS; advantages (r - mean) / (std + 1e-6)",
        add,
        [encode("19") + eos, encode("18") + eos, encode(" 19 "), encode("1") + eos],
    )
    yield case(
        "arithmetic-after-eos-ignored",
        "tokens after the first EOS are not graded; an empty answer scores 0; a trailing character is wrong",
        add,
        [encode("19") + eos + encode("5"), eos, encode("19!") + eos],
    )
    yield case(
        "all-wrong", "equal rewards give all-zero advantages", add, [encode("2") + eos, encode("20") + eos]
    )
    yield case(
        "length-target",
        "length_target 4: reward - 0.0003 * |4 - tokens| (tokens count the EOS)",
        add,
        [encode("19") + eos, encode("19"), encode("191") + eos, encode("19  ") + eos],
        length_target=4,
    )
    half = Task("math", "What is 1/2 + 1/4?", "\\frac{3}{4}")
    yield case(
        "math-boxed",
        "the last \\boxed{} is compared: equal strings or equal rational values; no box scores 0",
        half,
        [
            encode(s) + eos
            for s in ("\\boxed{3/4}", "\\boxed{0.75}", "\\boxed{\\frac{3}{4}}", "3/4", "\\boxed{1/4}")
        ],
    )


# ---------------------------------------------------------------------------- validation verdicts


@dataclasses.dataclass(frozen=True)
class _Setup:
    descriptor: RunDescriptor
    engine: TransformersEngine
    weights_root: bytes  # names the model folder (its base weights) in the vectors
    root: bytes  # the manifest root the validator holds for v0

    @property
    def dataset(self) -> dict[bytes, Task]:
        return {t.task_id: t for t in _dataset()}

    def honest(self, counter: int = COUNTER) -> RolloutSubmission:
        return build_submission(
            self.engine, self.descriptor, self.dataset, _dataset_ids(), WORKER.address, 0, self.root, counter
        )

    def task(self, sub: RolloutSubmission) -> Task:
        return self.dataset[sub.groups[0].task_id]


@cache
def _setup() -> _Setup:
    engine = TransformersEngine.from_folder(DEVNET_MODEL)
    base = devnet_grpo(engine.info)
    grpo = dataclasses.replace(base, prompts_per_step=1, group_size=2, token_budget=2 * base.max_new_tokens)
    commitment = model_commitment(DEVNET_MODEL)
    descriptor = describe_run(
        run=RUN,
        trainer=TRAINER.address,
        model=commitment,
        tasks=list(_dataset()),
        grpo=grpo,
        policy=devnet_policy(),
        created_ms=NOW_MS,
    )
    root = sha256(b"the v0 manifest")  # any 32 bytes: the validator only compares it with the claim
    return _Setup(descriptor, engine, commitment.weights_root, root)


def _with_group(sub: RolloutSubmission, **changes: Any) -> RolloutSubmission:
    return dataclasses.replace(sub, groups=(dataclasses.replace(sub.groups[0], **changes),) + sub.groups[1:])


def _with_completion(sub: RolloutSubmission, index: int, **changes: Any) -> RolloutSubmission:
    completions = list(sub.groups[0].completions)
    completions[index] = dataclasses.replace(completions[index], **changes)
    return _with_group(sub, completions=tuple(completions))


def _regroup(setup: _Setup, task: Task, completions: list[EngineCompletion]) -> RolloutSubmission:
    """The counter-`COUNTER` submission for `task` made of `completions`, scored and proven honestly."""
    group = GeneratedGroup(task, task_prompt_ids(task, setup.engine.tokenizer), completions)
    groups = (to_wire_group(group, setup.descriptor, setup.engine.tokenizer),)
    return RolloutSubmission(setup.descriptor.run, assignment_step(0, COUNTER), 0, setup.root, groups)


Submission = tuple[str, str, RolloutSubmission, dict[str, Any]]


def _submissions(s: _Setup) -> Iterator[Submission]:
    """(name, description, submission, context changes): one check each."""
    grpo, honest = s.descriptor.grpo, s.honest()
    task, step = s.task(honest), honest.step
    yield (
        "accept/honest",
        f"an honest submission (counter {COUNTER}): accepted, with its token count",
        honest,
        {},
    )
    equal = next(
        sub for sub in map(s.honest, range(s.descriptor.max_submissions_per_version))
        if len({c.reward for c in sub.groups[0].completions}) == 1
    )
    yield (
        "accept/honest-equal-rewards",
        f"counter {equal.step & 0xFFFFFFFF}: equal rewards (all right or all wrong), all-zero advantages",
        equal,
        {},
    )
    yield (
        "reject/not-staked",
        "check 2: the worker is not eligible (unregistered or under-staked)",
        honest,
        {"eligible": []},
    )
    yield (
        "ignore/stale",
        "check 3: v0 is 3 versions behind the newest (async_level 2)",
        honest,
        {"newest_version": 3},
    )
    future = dataclasses.replace(honest, checkpoint_version=1, step=assignment_step(1, COUNTER))
    yield "ignore/unknown-checkpoint", "check 3: claims v1, newer than any version held", future, {}
    wrong_root = dataclasses.replace(honest, checkpoint_root=sha256(b"another manifest"))
    yield (
        "reject/wrong-checkpoint-root",
        "check 3: the claimed root is not the trainer's manifest's",
        wrong_root,
        {},
    )
    unbound = dataclasses.replace(honest, step=assignment_step(1, COUNTER))
    yield "reject/step-not-bound-to-version", "check 4: step >> 32 is 1, the claimed version 0", unbound, {}
    assigned = set(assigned_tasks(s.descriptor, _dataset_ids(), WORKER.address, honest.step))
    other = next(t for t in _dataset() if t.task_id not in assigned)
    other_work = generate_group(s.engine, other, s.descriptor, WORKER.address, step).completions
    picked = _regroup(s, other, other_work)
    yield "reject/cherry-picked-task", "check 4: honest work on a task that is not the assignment", picked, {}
    tampered = build_dishonest_submission(
        TAMPERED_PROMPT, s.engine, s.descriptor, s.dataset, _dataset_ids(), WORKER.address, 0, s.root, COUNTER
    )
    yield "reject/tampered-prompt", "check 4: the devnet cheat: an easier task's prompt tokens", tampered, {}
    triple = dataclasses.replace(s.descriptor, grpo=dataclasses.replace(grpo, group_size=3))
    three = _regroup(s, task, generate_group(s.engine, task, triple, WORKER.address, step).completions)
    yield "reject/wrong-group-size", "check 2b: three completions where the run asks for two", three, {}
    other_run = dataclasses.replace(s.descriptor, run="another-run")
    reseeded = _regroup(s, task, generate_group(s.engine, task, other_run, WORKER.address, step).completions)
    yield "reject/wrong-seed", "check 4: seeds derived for another run, not the prescribed ones", reseeded, {}
    forged = build_dishonest_submission(
        FORGED_REWARD, s.engine, s.descriptor, s.dataset, _dataset_ids(), WORKER.address, 0, s.root, COUNTER
    )
    yield "reject/forged-reward", "check 5: the devnet cheat: rewards not the task's", forged, {}
    advantages = [c.advantage + 0.5 for c in honest.groups[0].completions]
    skewed = _with_completion(
        _with_completion(honest, 0, advantage=advantages[0]), 1, advantage=advantages[1]
    )
    yield "reject/forged-advantages", "check 5: advantages that do not follow from the rewards", skewed, {}
    state = {k: v.clone() for k, v in s.engine.model.state_dict().items()}
    noisy = TransformersEngine.from_folder(DEVNET_MODEL)
    noisy.load_weights(tamper_weights(PERTURBED_MODEL, state, 0))
    perturbed = build_submission(
        noisy, s.descriptor, s.dataset, _dataset_ids(), WORKER.address, 0, s.root, COUNTER
    )
    yield (
        "reject/perturbed-model",
        "check 6a: the devnet cheat: generated with 5%-of-std noise on the weights; every chunk fails",
        perturbed,
        {},
    )
    first = honest.groups[0].completions[0]
    swapped = _with_completion(honest, 1, proofs=first.proofs)
    yield (
        "reject/swapped-proof",
        "check 6a: completion 1 carries completion 0's proof: chunk 1 fails",
        swapped,
        {},
    )
    unproven = _with_completion(honest, 1, proofs=())
    yield "reject/missing-proof", "check 2b: completion 1 carries no proof (it owes one)", unproven, {}
    generated = generate_group(s.engine, task, s.descriptor, WORKER.address, step).completions
    index = next(i for i, c in enumerate(generated) if len(c.tokens) >= 2)
    short = generated[index]
    cut = dataclasses.replace(
        short,
        tokens=short.tokens[:-1],
        logprobs=short.logprobs[:-1],
        hidden_rows=short.hidden_rows[:-1],
        ended_with_eos=False,
    )
    stopped = _regroup(s, task, [cut if i == index else c for i, c in enumerate(generated)])
    yield "reject/stopped-early", "check 6b: no EOS, yet shorter than max_new_tokens", stopped, {}
    flag = _with_completion(honest, 0, ended_with_eos=not first.ended_with_eos)
    yield "reject/eos-flag-wrong", "check 2b: ended_with_eos disagrees with the last token", flag, {}
    shifted = pack_logprobs(unpack_logprobs(first.logprobs) + 0.1)
    yield (
        "reject/forged-logprobs",
        "check 6c: logprobs 0.1 above the checkpoint's",
        _with_completion(honest, 0, logprobs=shifted),
        {},
    )
    seeds = [c.seed for c in honest.groups[0].completions]
    off = s.engine.generate_group(
        list(task_prompt_ids(task, s.engine.tokenizer)),
        grpo.group_size,
        [x ^ 1 for x in seeds],
        grpo.max_new_tokens,
        grpo.temperature,
    )
    claimed = [dataclasses.replace(c, seed=x) for c, x in zip(off, seeds, strict=True)]
    yield (
        "reject/tokens-off-sampler",
        "check 6d: the prescribed seeds claimed, the tokens drawn with other ones",
        _regroup(s, task, claimed),
        {},
    )
    yield from _malformed_submissions(s, honest)
    yield from _assignment_reuse(s, honest)
    forged_first = forged.groups[0].completions[0]  # last: the earlier cases keep their seq
    yield (
        "reject/forged-reward-and-swapped-proof",
        "check 6 before 5: the forged-reward cheat, completion 1 carrying completion 0's proof, fails "
        "both; the model checks run first (a grader may execute the text): chunk 1 fails, not the reward",
        _with_completion(forged, 1, proofs=forged_first.proofs),
        {},
    )


def _malformed_submissions(s: _Setup, honest: RolloutSubmission) -> Iterator[Submission]:
    """Check 2b: single-field edits of the honest submission that leave what the run allows (609)."""
    grpo, policy = s.descriptor.grpo, s.descriptor.policy
    vocab, eos = s.engine.info.vocab_size, s.engine.info.eos_token_ids[0]
    first = honest.groups[0].completions[0]
    tokens, logprobs = list(first.token_ids), first.logprobs

    def tokens_case(name: str, description: str, new: list[int], **changes: Any) -> Submission:
        lp = logprobs[: 4 * len(new)] + logprobs[-4:] * max(0, len(new) - len(tokens))
        fields = {"token_ids": tuple(new), "logprobs": lp, **changes}
        return f"reject/{name}", f"check 2b: {description}", _with_completion(honest, 0, **fields), {}

    yield tokens_case(
        "token-outside-vocab", f"token 0 is {vocab}, one past the vocabulary", [vocab, *tokens[1:]]
    )
    completions = honest.groups[0].completions
    ended = next(c for c in completions if c.ended_with_eos and len(c.token_ids) < grpo.max_new_tokens)
    index = completions.index(ended)
    after, after_logprobs = (*ended.token_ids, vocab + 553), ended.logprobs + ended.logprobs[-4:]
    yield (
        "reject/token-outside-vocab-after-eos",
        f"check 2b: token {vocab + 553} after the final EOS (graders never see it, a prefill would)",
        _with_completion(
            honest, index, token_ids=after, logprobs=after_logprobs, ended_with_eos=False
        ),
        {},
    )
    yield tokens_case("token-2^63", "token 0 is 2^63 (a valid u64 on the wire)", [2**63, *tokens[1:]])
    yield tokens_case("token-u64-max", "token 0 is 2^64-1", [2**64 - 1, *tokens[1:]])
    yield tokens_case("empty-completion", "a completion with no token", [], proofs=())
    longer = tokens + [tokens[0]] * (grpo.max_new_tokens + 1 - len(tokens))
    yield tokens_case(
        "completion-too-long", f"{grpo.max_new_tokens + 1} tokens, max_new_tokens is {grpo.max_new_tokens}",
        [t if t != eos else 5 for t in longer], ended_with_eos=False,
    )
    if eos in tokens:
        early = [eos, *[t if t != eos else 5 for t in tokens[1:]]]
        yield tokens_case("eos-not-last", "EOS as token 0, more tokens after it", early, ended_with_eos=False)
    prompt = list(honest.groups[0].prompt_ids)
    yield (
        "reject/prompt-token-outside-vocab",
        "check 2b: a prompt id past the vocabulary",
        _with_group(honest, prompt_ids=(prompt[0], 4096, *prompt[2:])),
        {},
    )
    yield (
        "reject/logprobs-short",
        "check 2b: logprobs 4 bytes short of 4 x tokens",
        _with_completion(honest, 0, logprobs=logprobs[:-4]),
        {},
    )
    yield (
        "reject/logprobs-odd-length",
        "check 2b: logprobs one byte longer than 4 x tokens",
        _with_completion(honest, 0, logprobs=logprobs + b"\x00"),
        {},
    )
    nan = struct.pack("<f", float("nan"))
    yield (
        "reject/logprob-nan",
        "check 2b: a NaN logprob (float32 bytes the codec cannot see into)",
        _with_completion(honest, 0, logprobs=nan + logprobs[4:]),
        {},
    )
    proof = first.proofs[0]
    yield (
        "reject/proof-short",
        f"check 2b: a proof of {len(proof) - 2} bytes, the run's k={policy.toploc_k} makes {len(proof)}",
        _with_completion(honest, 0, proofs=(proof[:-2],)),
        {},
    )
    yield (
        "reject/extra-proof",
        f"check 2b: two proofs for {len(tokens)} tokens (chunks of {policy.toploc_chunk} owe one)",
        _with_completion(honest, 0, proofs=(proof, proof)),
        {},
    )
    yield (
        "reject/wrong-group-count",
        f"check 2b: two groups where the run asks for {grpo.prompts_per_step}",
        dataclasses.replace(honest, groups=honest.groups * 2),
        {},
    )
    yield (
        "ignore/body-of-another-run",
        "check 2b: the envelope names the run, the submission another one",
        dataclasses.replace(honest, run="another-run"),
        {},
    )


def _assignment_reuse(s: _Setup, honest: RolloutSubmission) -> Iterator[Submission]:
    """Check 4: one credit per assignment. Counters are bounded per version, and the seeds bind the step,
    so completions generated once cannot be claimed again under another counter."""
    allowed = s.descriptor.max_submissions_per_version
    wide = dataclasses.replace(s.descriptor, max_submissions_per_version=allowed + 1)
    beyond = build_submission(s.engine, wide, s.dataset, _dataset_ids(), WORKER.address, 0, s.root, allowed)
    yield (
        "reject/counter-beyond-bound",
        f"check 4: counter {allowed}, the run allows counters 0 to {allowed - 1} per version",
        beyond,
        {},
    )
    task_ids = [honest.groups[0].task_id]
    again = next(
        c
        for c in range(allowed)
        if c != COUNTER
        and assigned_tasks(s.descriptor, _dataset_ids(), WORKER.address, assignment_step(0, c)) == task_ids
    )
    yield (
        "reject/seed-of-another-step",
        f"check 4: counter {again} assigns the same task as counter {COUNTER}; the completions generated for "
        f"counter {COUNTER} claimed again (a cached replay) carry that step's seeds",
        dataclasses.replace(honest, step=assignment_step(0, again)),
        {},
    )


def validation_input(descriptor: RunDescriptor, dataset: Sequence[Task], root: bytes, weights_root: bytes,
                     envelope: bytes) -> dict[str, Any]:
    """A validator holding v0 (the base checkpoint, `root`) as its newest version, the worker staked."""
    return {
        "descriptor": _h(encode_message(descriptor)),
        "dataset": [_task_json(t) for t in dataset],
        "checkpoints": [{"version": 0, "root": _h(root), "weights_root": _h(weights_root)}],
        "newest_version": 0,
        "eligible": [_h(WORKER.address)],
        "now_ms": NOW_MS,
        "envelope": _h(envelope),
    }


def _context(s: _Setup, envelope: bytes, **changes: Any) -> dict[str, Any]:
    return {**validation_input(s.descriptor, _dataset(), s.root, s.weights_root, envelope), **changes}


def validation_cases() -> Iterator[Vector]:
    s = _setup()
    for seq, (name, description, sub, changes) in enumerate(_submissions(s), start=1):
        inp = _context(s, seal(WORKER, sub, run=RUN, seq=seq, ts=NOW_MS), **changes)
        yield _case(f"validation/{name}", "validation", description, inp, check_validation)
    envelope = bytearray(seal(WORKER, s.honest(), run=RUN, seq=99, ts=NOW_MS))
    envelope[-10] ^= 1  # inside the signature
    description = "check 1: one bit of the honest submission's signature flipped"
    inp = _context(s, bytes(envelope))
    yield _case("validation/reject/bad-signature", "validation", description, inp, check_validation)


# ---------------------------------------------------------------------------- files


SUITES: dict[str, Callable[[], Iterator[Vector]]] = {
    "rollouts-tasks": task_cases,
    "rollouts-assignment": assignment_cases,
    "rollouts-seeds": seed_cases,
    "rollouts-sampling": sampling_cases,
    "rollouts-rewards": reward_cases,
    "rollouts-validation": validation_cases,
}
