"""Tasks, their content-hash ids, JSONL datasets and deterministic assignment.

Decisions:
- A task is (kind, prompt, target): `target` is what the grader checks against (the expected answer for
  arithmetic and math, the test code for code tasks). Its id is sha256 of the canonical JSON of those three
  fields, so any peer holding the dataset can recompute and check it.
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

ASSIGN_DOMAIN = b"swarmnode/tasks/assign/v1"


@dataclass(frozen=True)
class Task:
    """One verifiable prompt."""

    kind: str
    prompt: str
    target: str

    @property
    def task_id(self) -> bytes:
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


def canonical_json(task: Task) -> str:
    """Sorted keys, no spaces, non-ASCII kept as UTF-8: the bytes the task id hashes."""
    body = {"kind": task.kind, "prompt": task.prompt, "target": task.target}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def task_id(task: Task) -> bytes:
    """sha256 of the task's canonical JSON (32 bytes)."""
    return hashlib.sha256(canonical_json(task).encode()).digest()


def task_to_json(task: Task) -> str:
    """One JSONL line: the canonical fields plus the hex id (checked on read)."""
    body = {"kind": task.kind, "prompt": task.prompt, "target": task.target, "task_id": task_id(task).hex()}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def task_from_json(line: str) -> Task:
    """Parse one JSONL line; unknown fields or a wrong `task_id` raise ValueError."""
    body = json.loads(line)
    if not isinstance(body, dict) or set(body) - {"kind", "prompt", "target", "task_id"}:
        raise ValueError(f"not a task object: {line[:80]!r}")
    kind, prompt, target = (body.get(k) for k in ("kind", "prompt", "target"))
    if not (isinstance(kind, str) and isinstance(prompt, str) and isinstance(target, str)):
        raise ValueError(f"task fields must be strings: {line[:80]!r}")
    task = Task(kind, prompt, target)
    if "task_id" in body and body["task_id"] != task_id(task).hex():
        raise ValueError(f"task_id {body['task_id']} does not match the task's content")
    return task


def write_jsonl(tasks: Iterable[Task], path: str | os.PathLike[str]) -> None:
    """Write a dataset, one task per line, in the given order (the order assignment indexes)."""
    with open(path, "w", encoding="utf-8") as f:
        for task in tasks:
            f.write(task_to_json(task) + "\n")


def read_jsonl(path: str | os.PathLike[str]) -> list[Task]:
    """Read a dataset written by `write_jsonl` (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [task_from_json(line) for line in f if line.strip()]


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
