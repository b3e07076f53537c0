"""Task files (node.rl.tasks.files): JSONL and Parquet read back the same tasks, ids and dataset hash, and
every malformed file is refused with a TaskFileError naming the file, the row and the problem."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.node.rl.tasks import (
    GRADERS,
    MAX_TARGET_LENGTH,
    Task,
    TaskFileError,
    dataset_hash,
    families,
    read_jsonl,
    read_tasks,
    write_jsonl,
    write_tasks,
)
from swarmnode.node.rl.tasks import files as task_files
from swarmnode.node.rl.tasks.arithmetic import DEVNET_PARAMS, generate_tasks

MIXED = [
    Task("arithmetic", "12+7=", "19"),
    Task("math", 'Area of a circle of radius 2 ("r=2"), in terms of π?', "\\boxed{4\\pi}", 256),
    Task("code", "Write f(x) returning x+1.", "assert f(1) == 2\nassert f(-1) == 0"),
]
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _parquet(path: Path, columns: dict[str, Any]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def _refused(path: Path, match: str, row: int | None = None) -> TaskFileError:
    with pytest.raises(TaskFileError, match=match) as info:
        read_tasks(path)
    assert info.value.path == str(path) and info.value.row == row
    assert str(info.value).startswith(str(path))
    return info.value


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.parquet", "D.PARQUET"])
def test_round_trip_keeps_tasks_ids_and_order(tmp_path, name):
    tasks = generate_tasks(DEVNET_PARAMS, seed=3, count=30)[:20] + MIXED
    tasks = list({t.task_id: t for t in tasks}.values())
    path = write_tasks(tasks, tmp_path / name)
    assert read_tasks(path) == tasks
    assert not list(tmp_path.glob(".*partial"))  # written atomically, nothing left behind


def test_jsonl_and_parquet_give_the_same_dataset_hash(tmp_path):
    a = read_tasks(write_tasks(MIXED, tmp_path / "a.jsonl"))
    b = read_tasks(write_tasks(MIXED, tmp_path / "b.parquet"))
    assert [t.task_id for t in a] == [t.task_id for t in b]
    assert dataset_hash(a) == dataset_hash(b) == dataset_hash(MIXED)


def test_files_of_write_jsonl_read_back(tmp_path):
    """Our older JSONL format (kind, prompt, target, task_id) is a task file too."""
    write_jsonl(MIXED, tmp_path / "old.jsonl")
    assert read_tasks(tmp_path / "old.jsonl") == MIXED == read_jsonl(tmp_path / "old.jsonl")


def test_the_usual_columns_answer_and_tests(tmp_path):
    rows = [
        {"prompt": "What is 2+2? Put the answer in \\boxed{}.", "kind": "math", "answer": "4"},
        {"prompt": "Write add(a, b).", "kind": "code",
         "tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]},
        {"prompt": "Write neg(a).", "kind": "code", "tests": ["assert neg(1) == -1"], "target_length": 1000},
    ]
    got = read_tasks(_jsonl(tmp_path / "hf.jsonl", rows))
    assert got == [
        Task("math", rows[0]["prompt"], "4"),
        Task("code", "Write add(a, b).", "assert add(1, 2) == 3\nassert add(0, 0) == 0"),
        Task("code", "Write neg(a).", "assert neg(1) == -1", 1000),
    ]
    # the same rows as Parquet (tests as a list column, nulls where a row has no value)
    columns = {
        "prompt": [r["prompt"] for r in rows], "kind": [r["kind"] for r in rows],
        "answer": ["4", None, None], "tests": [None, rows[1]["tests"], rows[2]["tests"]],
        "target_length": pa.array([None, None, 1000], pa.int32()),
    }
    assert read_tasks(_parquet(tmp_path / "hf.parquet", columns)) == got


def test_tests_as_one_string_and_string_columns_stay_strings(tmp_path):
    """A date-like answer stays a string (pyarrow would infer a timestamp), a task_id may carry 0x."""
    task = Task("math", "2020-01-01", "2020-01-01")
    rows = [{"prompt": task.prompt, "kind": "math", "answer": task.target,
             "task_id": "0x" + task.task_id.hex()},
            {"prompt": "f?", "kind": "code", "tests": "assert f() == 1\n"}]
    assert read_tasks(_jsonl(tmp_path / "t.jsonl", rows)) == [task, Task("code", "f?", "assert f() == 1\n")]


@st.composite
def task_lists(draw: Any) -> list[Task]:
    text = st.text(min_size=1, max_size=40).filter(str.strip)
    lengths = st.sampled_from([0, 1, 77, MAX_TARGET_LENGTH])
    free_text_kinds = sorted(set(GRADERS) - {families.KIND})  # a family task's target is its provenance
    task = st.builds(Task, st.sampled_from(free_text_kinds), text, text, lengths)
    tasks = draw(st.lists(task, min_size=1, max_size=12))
    return list({t.task_id: t for t in tasks}.values())


@SETTINGS
@given(tasks=task_lists())
def test_any_well_formed_dataset_round_trips_in_both_formats(tmp_path, tasks):
    a = read_tasks(write_tasks(tasks, tmp_path / "h.jsonl"))
    b = read_tasks(write_tasks(tasks, tmp_path / "h.parquet"))
    assert a == b == tasks and dataset_hash(a) == dataset_hash(tasks)


# ---------------------------------------------------------------------------- refusals


def test_a_file_that_is_not_a_task_file(tmp_path):
    _refused(tmp_path / "none.jsonl", "No such file")
    (tmp_path / "t.csv").write_text("prompt,kind\n")
    _refused(tmp_path / "t.csv", "must end in .jsonl, .json, .parquet")
    (tmp_path / "empty.jsonl").write_text("")
    _refused(tmp_path / "empty.jsonl", "empty file")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    _refused(tmp_path / "blank.jsonl", "no tasks")
    (tmp_path / "array.json").write_text(json.dumps([{"prompt": "a", "kind": "math", "answer": "1"}]))
    _refused(tmp_path / "array.json", "changed from object to array", row=1)
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"\n')
    _refused(tmp_path / "broken.jsonl", "Missing a comma", row=1)
    (tmp_path / "bytes.jsonl").write_bytes(b'{"prompt":"\xff","kind":"math","answer":"1"}\n')
    _refused(tmp_path / "bytes.jsonl", "UTF8")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 but not really")
    _refused(tmp_path / "junk.parquet", "not a parquet file")
    _refused(_parquet(tmp_path / "zero.parquet", {"prompt": pa.array([], pa.string()),
                                                    "kind": pa.array([], pa.string())}), "no tasks")


def test_columns(tmp_path):
    row = {"prompt": "1+1=", "kind": "arithmetic", "answer": "2"}
    _refused(_jsonl(tmp_path / "u.jsonl", [{**row, "target_lenght": 5}]), "unknown column.*'target_lenght'")
    _refused(_jsonl(tmp_path / "p.jsonl", [{"kind": "arithmetic", "answer": "2"}]), "no prompt", row=1)
    _refused(_jsonl(tmp_path / "k.jsonl", [row, {"prompt": "1+2=", "answer": "3"}]), "no kind", row=2)
    _refused(_parquet(tmp_path / "p.parquet", {"kind": ["math"], "answer": ["2"]}), "no prompt column")
    _refused(_parquet(tmp_path / "x.parquet", {**{k: [v] for k, v in row.items()}, "source": ["gsm8k"]}),
             "unknown column.*'source'")


def test_types(tmp_path):
    row = {"prompt": "1+1=", "kind": "arithmetic", "answer": "2"}
    _refused(_jsonl(tmp_path / "a.jsonl", [row, {**row, "prompt": 3}]), "changed from string to number$",
             row=2)
    _refused(_jsonl(tmp_path / "b.jsonl", [{**row, "target_length": 5.5}]), "int64")
    _refused(_jsonl(tmp_path / "c.jsonl", [{**row, "target_length": "5"}]), "target_length", row=1)
    _refused(_jsonl(tmp_path / "d.jsonl", [{**row, "target_length": True}]), "boolean",
             row=1)
    _refused(_jsonl(tmp_path / "e.jsonl", [{"prompt": "f", "kind": "code", "tests": ["a", 3]}]),
             r"Column\(/tests/\[\]\) changed from string to number", row=1)
    _refused(_jsonl(tmp_path / "f.jsonl", [{"prompt": "f", "kind": "code", "tests": ["a"]},
                                           {"prompt": "g", "kind": "code", "tests": "b"}]),
             r"Column\(/tests\) changed from array to string", row=2)
    _refused(_parquet(tmp_path / "a.parquet", {"prompt": [1], "kind": ["math"], "answer": ["2"]}),
             "prompt must be a string, got int", row=1)
    _refused(_parquet(tmp_path / "b.parquet", {**{k: [v] for k, v in row.items()}, "target_length": [2.0]}),
             "target_length must be an integer", row=1)
    _refused(_parquet(tmp_path / "c.parquet", {"prompt": ["f"], "kind": ["code"], "tests": [["a", None]]}),
             "list of strings", row=1)


def test_values(tmp_path):
    row = {"prompt": "1+1=", "kind": "arithmetic", "answer": "2"}

    def one(name: str, changes: dict[str, Any], match: str) -> None:
        bad = {k: v for k, v in {**row, **changes}.items() if v is not None}
        _refused(_jsonl(tmp_path / f"{name}.jsonl", [row, bad]), match, row=2)

    one("kind", {"kind": "poetry"}, "kind 'poetry' is not a task kind here .known: arithmetic, code, guess")
    one("none", {"answer": None}, "needs exactly one of answer .or target., has none")
    one("two", {"target": "2"}, "has answer and target")
    one("wrong", {"answer": None, "tests": "assert True"},
        "kind 'arithmetic' has tests; its target column is answer")
    one("blank-prompt", {"prompt": " \n"}, "prompt is blank")
    one("blank-answer", {"answer": "  "}, "target .answer or tests. is blank")
    one("negative", {"target_length": -1}, "target_length must be an integer 0")
    one("huge", {"target_length": MAX_TARGET_LENGTH + 1}, "target_length must be an integer 0")
    one("id", {"task_id": "ab" * 32}, "is not the task's id")
    one("long-prompt", {"prompt": "x" * (task_files.MAX_PROMPT_CHARS + 1)}, "more than 32768")
    one("long-target", {"answer": "1" * (task_files.MAX_TARGET_CHARS + 1)}, "more than 1048576")
    _refused(_jsonl(tmp_path / "code.jsonl", [{"prompt": "f", "kind": "code", "tests": []}]), "blank", row=1)


def test_a_repeated_task_is_refused(tmp_path):
    rows = [{"prompt": f"{i}+1=", "kind": "arithmetic", "answer": str(i + 1)} for i in range(3)]
    repeated = _jsonl(tmp_path / "r.jsonl", [*rows, {**rows[1], "target": None}])
    error = _refused(repeated, "repeats the task of row 2", row=4)
    assert "id " in error.problem
    # the same prompt with another length target is another task
    assert len(read_tasks(_jsonl(tmp_path / "ok.jsonl", [*rows, {**rows[1], "target_length": 9}]))) == 4


def test_bounds_on_size(tmp_path, monkeypatch):
    rows = [{"prompt": f"{i}+1=", "kind": "arithmetic", "answer": str(i + 1)} for i in range(5)]
    path = _jsonl(tmp_path / "b.jsonl", rows)
    parquet = _parquet(tmp_path / "b.parquet", {k: [r[k] for r in rows] for k in rows[0]})
    monkeypatch.setattr(task_files, "MAX_TASKS", 4)
    _refused(path, "5 tasks, more than 4")
    _refused(parquet, "5 tasks, more than 4")
    with pytest.raises(TaskFileError, match="more than 4 tasks"):
        write_tasks([Task("arithmetic", r["prompt"], r["answer"]) for r in rows], tmp_path / "w.jsonl")
    monkeypatch.setattr(task_files, "MAX_FILE_BYTES", path.stat().st_size - 1)
    _refused(path, f"{path.stat().st_size} bytes, more than")
    monkeypatch.undo()
    monkeypatch.setattr(task_files, "MAX_JSON_RECORD_BYTES", 1 << 10)
    _refused(_jsonl(tmp_path / "long.jsonl", [{**rows[0], "prompt": "x" * 2000}]), "longer than 1024 bytes")


def test_write_refuses_what_read_would(tmp_path):
    with pytest.raises(TaskFileError, match="no tasks"):
        write_tasks([], tmp_path / "e.jsonl")
    with pytest.raises(TaskFileError, match="row 2: repeats the task of row 1"):
        write_tasks([MIXED[0], MIXED[0]], tmp_path / "d.parquet")
    with pytest.raises(TaskFileError, match="row 1: kind 'poetry'"):
        write_tasks([Task("poetry", "a", "b")], tmp_path / "k.jsonl")
    with pytest.raises(TaskFileError, match="must end in"):
        write_tasks(MIXED, tmp_path / "t.csv")
    assert list(tmp_path.iterdir()) == []


rows_ = st.dictionaries(
    st.sampled_from([*task_files.COLUMNS, "extra"]),
    st.one_of(st.none(), st.booleans(), st.integers(-3, 2**70), st.floats(allow_nan=False),
              st.text(string.printable, max_size=8), st.lists(st.one_of(st.text(max_size=4), st.integers()),
                                                               max_size=3)),
)


@SETTINGS
@given(rows=st.lists(rows_, max_size=4))
def test_any_json_rows_give_tasks_or_a_task_file_error(tmp_path, rows):
    path = _jsonl(tmp_path / "any.jsonl", rows)
    try:
        tasks = read_tasks(path)
    except TaskFileError as exc:
        assert exc.path == str(path)
    else:
        assert 1 <= len(tasks) == len(rows) == len({t.task_id for t in tasks})
        assert all(t.kind in GRADERS and t.prompt.strip() and t.target.strip() for t in tasks)


@SETTINGS
@given(data=st.binary(max_size=64))
def test_any_bytes_give_tasks_or_a_task_file_error(tmp_path, data):
    for name in ("any.jsonl", "any.parquet"):
        (tmp_path / name).write_bytes(data)
        try:
            read_tasks(tmp_path / name)
        except TaskFileError:
            pass
