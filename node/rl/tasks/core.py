"""Tasks, their content-hash ids, JSONL datasets and deterministic assignment.

Decisions:
- A task is (kind, prompt, target, target_length): `target` is what the grader checks against (the expected
  answer for arithmetic and math, the test code for code tasks); `target_length` is INTELLECT-2's optional
  length target in tokens (0: none). Its id is sha256 of the canonical JSON of those fields, so any peer
  holding the dataset can recompute and check it; `target_length` enters it only when non-zero, so tasks
  without one keep the ids they had before the field existed.
- A task's own length target overrides the run's (`task_length_target`): a dataset can mix lengths.
- Assignment: the first `count` *distinct* dataset indices of
  `int(sha256(domain || worker u32-len-prefixed || step u64 || counter u32)) mod len(dataset)` for
  counter = 0, 1, 2, ...; distinct because a repeated task would get repeated seeds (the seed derives from
  the task id), i.e. duplicate rollouts. The dataset order is the order of the run's dataset file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from swarmnode.crypto.merkle import merkle_root
from swarmnode.protocol.messages import GrpoParams

ASSIGN_DOMAIN = b"swarmnode/tasks/assign/v1"
MAX_TARGET_LENGTH = 1 << 20  # tokens: beyond any model's context, and the JSON number stays small


@dataclass(frozen=True)
class Task:
    """One verifiable prompt."""

    kind: str
    prompt: str
    target: str
    target_length: int = 0  # tokens the completion should take (a system message asks for it); 0: none

    def __post_init__(self) -> None:
        if type(self.target_length) is not int or not 0 <= self.target_length <= MAX_TARGET_LENGTH:
            raise ValueError(f"target_length must be an integer 0 ... {MAX_TARGET_LENGTH}, "
                             f"got {self.target_length!r}")

    @cached_property
    def task_id(self) -> bytes:
        """`task_id(self)`, hashed once (the task is frozen)."""
        return task_id(self)


class GraderFault(Exception):
    """A grader stopped on a machine-dependent limit (wall time, CPU, memory): no verdict on the answer.

    Rewards are recomputed by validators and must match exactly, so such a limit never yields a reward:
    a validator treats this as a fault in judging the item (Reason.JUDGE_FAULT), a worker does not submit
    the item. Deterministic bounds (sizes, operation budgets) give a reward of 0 instead.
    """


@dataclass(frozen=True)
class Grade:
    """A reward and the reason for it (shown to operators, kept with the rollout)."""

    reward: float
    reason: str


def task_fields(task: Task) -> dict[str, Any]:
    """The fields the id covers: kind, prompt, target, and target_length only when non-zero."""
    body: dict[str, Any] = {"kind": task.kind, "prompt": task.prompt, "target": task.target}
    if task.target_length:
        body["target_length"] = task.target_length
    return body


def canonical_json(task: Task) -> str:
    """Sorted keys, no spaces, non-ASCII kept as UTF-8: the bytes the task id hashes."""
    return json.dumps(task_fields(task), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def task_id(task: Task) -> bytes:
    """sha256 of the task's canonical JSON (32 bytes)."""
    return hashlib.sha256(canonical_json(task).encode()).digest()


def task_to_json(task: Task) -> str:
    """One JSONL line: the canonical fields plus the hex id (checked on read)."""
    body = {**task_fields(task), "task_id": task_id(task).hex()}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_JSON_FIELDS = frozenset({"kind", "prompt", "target", "target_length", "task_id"})


def task_from_json(line: str) -> Task:
    """Parse one JSONL line; unknown fields, a bad `target_length` or a wrong `task_id` raise ValueError."""
    body = json.loads(line)
    if not isinstance(body, dict) or set(body) - _JSON_FIELDS:
        raise ValueError(f"not a task object: {line[:80]!r}")
    kind, prompt, target = (body.get(k) for k in ("kind", "prompt", "target"))
    if not (isinstance(kind, str) and isinstance(prompt, str) and isinstance(target, str)):
        raise ValueError(f"task fields must be strings: {line[:80]!r}")
    task = Task(kind, prompt, target, body.get("target_length", 0))
    if "task_id" in body and body["task_id"] != task_id(task).hex():
        raise ValueError(f"task_id {body['task_id']} does not match the task's content")
    return task


def dataset_hash(tasks: Sequence[Task]) -> bytes:
    """The RunDescriptor's `dataset_hash`: the RFC 6962 Merkle root over the task ids in dataset order."""
    return merkle_root([t.task_id for t in tasks])


def write_jsonl(tasks: Iterable[Task], path: str | os.PathLike[str]) -> None:
    """Write a dataset, one task per line, in the given order (the order assignment indexes)."""
    with open(path, "w", encoding="utf-8") as f:
        for task in tasks:
            f.write(task_to_json(task) + "\n")


def read_jsonl(path: str | os.PathLike[str]) -> list[Task]:
    """Read a dataset written by `write_jsonl` (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [task_from_json(line) for line in f if line.strip()]


def task_length_target(task: Task, grpo: GrpoParams) -> int:
    """The length target of `task`'s rewards: its own when it has one, else the run's (0: no length term)."""
    return task.target_length or grpo.length_target


def assign_tasks(dataset_ids: Sequence[bytes], worker_address: bytes, step: int, count: int) -> list[bytes]:
    """The task ids `worker_address` must work on at `step`: deterministic, so it cannot pick easy ones."""
    n = len(dataset_ids)
    if not 0 <= count <= n:
        raise ValueError(f"cannot assign {count} distinct tasks from a dataset of {n}")
    if not 0 <= step < 2**64:
        raise ValueError(f"step {step} outside u64")
    prefix = ASSIGN_DOMAIN + len(worker_address).to_bytes(4, "big") + worker_address + step.to_bytes(8, "big")
    chosen: list[int] = []
    seen: set[int] = set()
    counter = 0
    while len(chosen) < count:
        digest = hashlib.sha256(prefix + counter.to_bytes(4, "big")).digest()
        index = int.from_bytes(digest, "big") % n
        if index not in seen:
            seen.add(index)
            chosen.append(index)
        counter += 1
    return [dataset_ids[i] for i in chosen]
