"""A worker's own program claimed as the model's completion of a code task: what the model checks must refuse
before any grader sees the text (spec/validation.md: a submission's text is executed only after it is shown
to be the model's own output).

Decisions:
- The program's tokens are teacher-forced on the claimed checkpoint (`forced_completion`), so its TOPLOC
  proofs (6a), its termination (6b: exactly `max_new_tokens` tokens, no EOS) and its logprobs (6c) are all
  the model's: only the sampling check (6d) can tell that the seeded sampler did not choose them. That is
  the strongest form of the devnet's `code-injection` cheat (`swarmnode.testing.cheats`, whose payload
  ends with an EOS the termination check may refuse first): anyone holding the checkpoint can prove any
  text so.
- Every completion claims full marks (advantages 0, consistent): a validator that graded before check 6
  would execute the program to find out it fails the tests.
- The run: code tasks only (any assignment is one), one prompt of two completions, `max_new_tokens` the
  program's length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.rollouts import assigned_tasks, assignment_step, generate_group, to_wire_group
from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.tokenizer import ChatTokenizer
from swarmnode.protocol.messages import GrpoParams, RolloutSubmission, RunDescriptor
from swarmnode.testing.cheats import forced_completion

PROGRAM = 'import os\nos.system("touch /tmp/graded-unchecked-text")'
CODE_TASKS = (
    Task("code", "Write square(x).", "assert square(3) == 9\n"),
    Task("code", "Write double(x).", "assert double(4) == 8\n"),
    Task("code", "Write neg(x).", "assert neg(2) == -2\n"),
    Task("code", "Write half(x).", "assert half(8) == 4\n"),
)


def program_ids(tokenizer: ChatTokenizer) -> tuple[int, ...]:
    return tuple(tokenizer.encode(PROGRAM))


def code_grpo(grpo: GrpoParams, tokenizer: ChatTokenizer) -> GrpoParams:
    """`grpo` with one prompt of two completions and `max_new_tokens` exactly the program's length."""
    length = len(program_ids(tokenizer))
    return dataclasses.replace(
        grpo, prompts_per_step=1, group_size=2, max_new_tokens=length, token_budget=2 * length
    )


def program_submission(
    engine: TransformersEngine,
    descriptor: RunDescriptor,
    dataset: Mapping[bytes, Task],
    dataset_ids: Sequence[bytes],
    worker: bytes,
    version: int,
    root: bytes,
    counter: int = 0,
) -> RolloutSubmission:
    """The worker's assignment, completion 0 of each group replaced by PROGRAM (module docstring)."""
    step = assignment_step(version, counter)
    tokens = program_ids(engine.tokenizer)
    if len(tokens) != descriptor.grpo.max_new_tokens or any(t in engine.info.eos_token_ids for t in tokens):
        raise ValueError("the run must be code_grpo's: the program fills max_new_tokens, no EOS")
    groups = []
    for task_id in assigned_tasks(descriptor, dataset_ids, worker, step):
        generated = generate_group(engine, dataset[task_id], descriptor, worker, step)
        seed = generated.completions[0].seed
        program = forced_completion(engine, generated.prompt_ids, tokens, seed, descriptor.grpo.temperature)
        group = dataclasses.replace(generated, completions=[program, *generated.completions[1:]])
        rewards = [1.0] * len(group.completions)
        groups.append(to_wire_group(group, descriptor, engine.tokenizer, rewards=rewards))
    return RolloutSubmission(descriptor.run, step, version, root, tuple(groups))
