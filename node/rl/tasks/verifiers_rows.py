"""Tasks of kind `verifiers` (spec/environments.md, Verifiers environments): a verifiers environment's
dataset row, carried whole.

A task's target is the canonical JSON of {"library": "verifiers", "module", "args", "row"}: the module and
the `load_environment` arguments it was exported with, and the row (prompt messages, answer, info,
example_id). Its prompt is the text of the row's prompt messages, so the model reads the prompt the
environment plays. Pure: a task file is checked with this when it is read (`files.read_tasks`), and the
environment (`environments/verifiers_adapter.py`) reads its rows with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swarmnode.node.errors import OperatorError
from swarmnode.node.rl.tasks.core import Task
from swarmnode.node.rl.tasks.families import canonical
from swarmnode.node.rl.tasks.graders import VERIFIERS_KIND as KIND


class VerifiersTaskError(OperatorError, ValueError):
    """A task of kind `verifiers` that is not a row as `tasks verifiers` writes it; the message says how."""


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text: its string content, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def messages_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """What the model reads of messages: their texts joined by blank lines."""
    return "\n\n".join(message_text(m) for m in messages)


@dataclass(frozen=True)
class Row:
    """A verifiers task: the environment module, its arguments and one dataset row."""

    module: str
    args: Mapping[str, Any]
    row: Mapping[str, Any]

    def task(self) -> Task:
        return Task(KIND, messages_text(self.row["prompt"]), canonical(self.target_body()))

    def target_body(self) -> dict[str, Any]:
        return {"library": "verifiers", "module": self.module, "args": dict(self.args), "row": dict(self.row)}


def parse_task(task: Task) -> Row:
    """The row a verifiers task carries; VerifiersTaskError when its target is not one, or its prompt is not
    its row's prompt (the model would read another prompt than the environment plays)."""
    if task.kind != KIND:
        raise VerifiersTaskError(f"not a {KIND} task: kind {task.kind!r}")
    try:
        body = json.loads(task.target)
    except ValueError:
        raise VerifiersTaskError(f"a {KIND} task's target must be JSON, got {task.target[:80]!r}") from None
    if not isinstance(body, dict) or body.get("library") != "verifiers" or set(body) != {
            "library", "module", "args", "row"}:
        raise VerifiersTaskError(f"a {KIND} target is an object of library, module, args and row: "
                                 f"{task.target[:80]!r}")
    module, args, row = body["module"], body["args"], body["row"]
    if not (isinstance(module, str) and module.isidentifier() and isinstance(args, dict)
            and isinstance(row, dict) and isinstance(row.get("prompt"), list)):
        raise VerifiersTaskError(f"a {KIND} target needs a module name, an args object and a row with "
                                 f"prompt messages: {task.target[:80]!r}")
    if not all(isinstance(m, dict) for m in row["prompt"]):
        raise VerifiersTaskError(f"a {KIND} row's prompt must be a list of messages: {task.target[:80]!r}")
    parsed = Row(module, args, row)
    if canonical(parsed.target_body()) != task.target:
        raise VerifiersTaskError(f"a {KIND} target is not canonical JSON: {task.target[:80]!r}")
    if messages_text(row["prompt"]) != task.prompt:
        raise VerifiersTaskError(f"a {KIND} task's prompt is not its row's prompt messages' text")
    return parsed


def check_verifiers_tasks(tasks: Iterable[Task]) -> None:
    """VerifiersTaskError naming the first task of kind `verifiers` that is not a well-formed row."""
    for i, task in enumerate(tasks):
        try:
            parse_task(task)
        except VerifiersTaskError as exc:
            raise VerifiersTaskError(f"verifiers task {i}: {exc}") from None
