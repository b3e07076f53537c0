"""Tasks of kind `verifiers` (node/rl/tasks/verifiers_rows.py): a row round-trips, and a task file whose
verifiers row is not one is refused when it is read, naming the task (no sandbox, no verifiers needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from swarmnode.node.rl.tasks import TaskFileError, read_tasks, write_tasks
from swarmnode.node.rl.tasks.verifiers_rows import Row, VerifiersTaskError, parse_task

PROMPT = [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": [{"type": "text", "text": "Guess."}]}]
ROW = Row("vf_game", {"high": 8}, {"prompt": PROMPT, "answer": "3", "info": {}, "example_id": 0})


def test_a_row_round_trips_and_its_prompt_is_its_messages_text():
    task = ROW.task()
    assert task.prompt == "Be brief.\n\nGuess."
    assert parse_task(task) == ROW


@pytest.mark.parametrize("change", [
    {"prompt": "Be brief.\n\nGuess. Hint: 3."},
    {"target": ROW.task().target.replace('"answer":"3"', '"answer": "3"')},
    {"target": "not json"},
    {"target": '{"library":"verifiers","module":"vf_game","args":{},"row":{"prompt":"text"}}'},
    {"kind": "math"},
])
def test_anything_else_is_refused_saying_what(change):
    with pytest.raises(VerifiersTaskError):
        parse_task(dataclasses.replace(ROW.task(), **change))


def test_a_task_file_with_a_broken_row_is_refused_when_read(tmp_path: Path):
    good = tmp_path / "good.jsonl"
    write_tasks([ROW.task()], good)
    assert read_tasks(good) == [ROW.task()]
    bad = tmp_path / "bad.jsonl"
    write_tasks([ROW.task(), dataclasses.replace(ROW.task(), prompt="Guess!")], bad)
    with pytest.raises(TaskFileError, match="verifiers task 1: .*not its row's prompt"):
        read_tasks(bad)
