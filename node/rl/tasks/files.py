"""Task files: a run's dataset as a local JSONL or Parquet file, read with pyarrow (spec/rollouts.md).

One row per task, in dataset order (the order assignment indexes and the dataset hash covers):

| column | type | |
| --- | --- | --- |
| `prompt` | string | required, not blank |
| `kind` | string | required, one of `TASK_KINDS`: a grader's, or one only an environment plays |
| `answer` | string | the expected answer: `arithmetic`, `math` |
| `tests` | string, or list of strings (joined with newlines) | the test code: `code` |
| `target` | string | our own name for either (what `write_tasks` writes) |
| `target_length` | integer, 0 ... `MAX_TARGET_LENGTH` | optional, null or 0: none |
| `task_id` | hex string (`0x` optional) | optional; when present it must be the task's id |

Decisions:
- Strict, like the wire: an unknown column is refused (a misspelt `target_length` would otherwise vanish and
  change every id), and so is a row with two targets, a blank prompt or target (blank tests pass any program),
  or a task that repeats an earlier one (it would get the same seeds: duplicate rollouts).
- pyarrow's JSON reader is given the string columns' types: left to infer, it turns strings that look like
  ISO dates into timestamps. `tests` is tried as a string column, then as a list-of-strings one.
- Bounded before the work: the file's size (`MAX_FILE_BYTES`), a Parquet file's row count from its footer and
  a JSON record's size (the reader's block), then each row (`MAX_PROMPT_CHARS`, `MAX_TARGET_CHARS`) and the
  task count (`MAX_TASKS`). Rows are turned into Python objects one record batch at a time.
- `.json` files are JSON lines too (as Hugging Face datasets write them), not one JSON array.
- A `.toml` file is a family file (`family_file`): it names procedural families, and reading it generates
  their tasks. Tasks of the `reasoning_gym` kind read from any file are regenerated here and must match
  (`families.check_family_tasks`), so a node with another library version is refused before it joins.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from swarmnode.node.errors import OperatorError
from swarmnode.node.rl.tasks import families
from swarmnode.node.rl.tasks.core import MAX_TARGET_LENGTH, Task, task_to_json
from swarmnode.node.rl.tasks.family_file import (
    FAMILY_SUFFIX,
    FamilyFileError,
    generate_family_tasks,
    read_family_file,
)
from swarmnode.node.rl.tasks.graders import TASK_KINDS, VERIFIERS_KIND
from swarmnode.node.rl.tasks.verifiers_rows import VerifiersTaskError, check_verifiers_tasks
from swarmnode.node.sandbox import SandboxUnavailable

MAX_TASKS = 1_000_000  # rows in one file: INTELLECT-2's RL set has 285k
MAX_PROMPT_CHARS = 32_768  # a prompt: long competition problems are a few thousand
MAX_TARGET_CHARS = 1_048_576  # an answer or a code task's tests, inputs included
MAX_FILE_BYTES = 2 << 30  # a task file on disk
MAX_JSON_RECORD_BYTES = 8 << 20  # the JSON reader's block: a row at the char bounds, every char \u-escaped
BATCH_ROWS = 4096  # rows turned into Python objects at a time

JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
TARGET_COLUMN = {"arithmetic": "answer", "math": "answer", "code": "tests"}  # besides `target`
FAMILY_SUFFIXES = (FAMILY_SUFFIX,)  # a family file: tasks generated, not listed (`family_file`)
TARGET_COLUMNS = ("answer", "tests", "target")
COLUMNS = ("prompt", "kind", *TARGET_COLUMNS, "target_length", "task_id")


class TaskFileError(OperatorError, ValueError):
    """A task file this node cannot use: names the file, the row (1-based) when one is at fault, and why."""

    def __init__(self, path: str | os.PathLike[str], problem: str, row: int | None = None) -> None:
        self.path = str(path)
        self.problem = problem
        self.row = row
        where = f"{self.path}: row {row}" if row is not None else self.path
        super().__init__(f"{where}: {problem}")


# ---------------------------------------------------------------------------- rows (pure)


def _string(row: Mapping[str, Any], column: str) -> str | None:
    value = row.get(column)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{column} must be a string, got {type(value).__name__}")
    return value


def _target(row: Mapping[str, Any], kind: str) -> str:
    """The grader's target: `answer` or `tests` as the kind wants, or `target`; exactly one of them."""
    present = [c for c in TARGET_COLUMNS if row.get(c) is not None]
    if len(present) != 1:
        wanted = f"{TARGET_COLUMN[kind]} (or target)" if kind in TARGET_COLUMN else "target"
        found = f"has {' and '.join(present)}" if present else "has none"
        raise ValueError(f"a task of kind {kind!r} needs exactly one of {wanted}, {found}")
    column = present[0]
    if column != "target" and column != TARGET_COLUMN.get(kind):
        raise ValueError(f"a task of kind {kind!r} has {column}; its target column is "
                         f"{TARGET_COLUMN.get(kind, 'target')}")
    value = row[column]
    if column == "tests" and isinstance(value, list):
        if not all(isinstance(line, str) for line in value):
            raise ValueError("tests must be a string or a list of strings")
        return "\n".join(value)
    if not isinstance(value, str):
        raise ValueError(f"{column} must be a string, got {type(value).__name__}")
    return value


def task_from_row(row: Mapping[str, Any], kinds: Collection[str]) -> Task:
    """The task of one row (column name -> value, None for null); ValueError says what is wrong with it.

    The row's types, target column and claimed id; `check_task` checks the task's contents.
    """
    prompt, kind = _string(row, "prompt"), _string(row, "kind")
    if prompt is None or kind is None:
        raise ValueError(f"no {'prompt' if prompt is None else 'kind'}")
    if kind not in kinds:
        raise ValueError(f"kind {kind!r} is not a task kind here (known: {', '.join(sorted(kinds))})")
    length = row.get("target_length")
    if length is not None and (type(length) is not int or not 0 <= length <= MAX_TARGET_LENGTH):
        raise ValueError(f"target_length must be an integer 0 ... {MAX_TARGET_LENGTH}, got {length!r}")
    task = Task(kind, prompt, _target(row, kind), length or 0)
    claimed = _string(row, "task_id")
    if claimed is not None and claimed.lower().removeprefix("0x") != (computed := task.task_id.hex()):
        raise ValueError(f"task_id {claimed} is not the task's id {computed}")
    return task


def check_task(task: Task, kinds: Collection[str]) -> None:
    """The rules every task of a file obeys, read or written (ValueError otherwise)."""
    if task.kind not in kinds:
        raise ValueError(f"kind {task.kind!r} is not a task kind here (known: {', '.join(sorted(kinds))})")
    if not task.prompt.strip():
        raise ValueError("the prompt is blank")
    if len(task.prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt has {len(task.prompt)} characters, more than {MAX_PROMPT_CHARS}")
    if not task.target.strip():
        raise ValueError("the target (answer or tests) is blank")
    if len(task.target) > MAX_TARGET_CHARS:
        raise ValueError(f"the target has {len(task.target)} characters, more than {MAX_TARGET_CHARS}")
    if task.kind == families.KIND:
        families.parse_target(task)  # its form only; reading also regenerates the tasks


def check_tasks(path: str | os.PathLike[str], tasks: Iterable[Task], kinds: Collection[str]) -> list[Task]:
    """Every task checked, none repeated, 1 ... MAX_TASKS of them (TaskFileError naming the row otherwise)."""
    seen: dict[bytes, int] = {}
    result: list[Task] = []
    for row, task in enumerate(tasks, start=1):
        if row > MAX_TASKS:
            raise TaskFileError(path, f"more than {MAX_TASKS} tasks")
        try:
            check_task(task, kinds)
        except ValueError as exc:
            raise TaskFileError(path, str(exc), row) from None
        tid = task.task_id
        first = seen.setdefault(tid, row)
        if first != row:
            raise TaskFileError(path, f"repeats the task of row {first} (id {tid.hex()[:16]}...)", row)
        result.append(task)
    if not result:
        raise TaskFileError(path, "no tasks")
    return result


# ---------------------------------------------------------------------------- reading


def _suffix(path: Path, allowed: tuple[str, ...] = JSON_SUFFIXES + PARQUET_SUFFIXES) -> str:
    """`.jsonl`, `.json` or `.parquet` (any case; `.toml` for a family file where allowed), the format."""
    suffix = path.suffix.lower()
    if suffix not in allowed:
        raise TaskFileError(path, f"not a task file: the name must end in {', '.join(allowed)}")
    return suffix


def _family_tasks(path: Path, kinds: Collection[str]) -> list[Task]:
    """The tasks a family file generates (in the sandbox: a minute or more for thousands of tasks)."""
    if families.KIND not in kinds:
        raise TaskFileError(path, f"a family file makes {families.KIND} tasks, not taken here")
    try:
        seed, sources = read_family_file(path)
        return check_tasks(path, generate_family_tasks(seed, sources), kinds)
    except (FamilyFileError, families.FamilyTaskError) as exc:
        raise TaskFileError(path, str(exc)) from None
    except SandboxUnavailable as exc:
        raise TaskFileError(path, f"family tasks are generated in the sandbox: {exc}") from None


def _json_schema(tests: pa.DataType) -> pa.Schema:
    strings = [(c, pa.string()) for c in ("prompt", "kind", "answer", "target", "task_id")]
    return pa.schema([*strings, ("tests", tests), ("target_length", pa.int64())])


def _read_json(path: Path) -> pa.Table:
    """The file as a table, `tests` as strings or else as lists of strings."""
    read = pa_json.ReadOptions(block_size=MAX_JSON_RECORD_BYTES)
    try:
        parse = pa_json.ParseOptions(explicit_schema=_json_schema(pa.string()))
        return pa_json.read_json(path, read_options=read, parse_options=parse)
    except pa.ArrowInvalid as exc:
        if "Column(/tests)" not in str(exc):
            raise
    parse = pa_json.ParseOptions(explicit_schema=_json_schema(pa.list_(pa.string())))
    return pa_json.read_json(path, read_options=read, parse_options=parse)


def _check_columns(path: Path, names: Sequence[str]) -> None:
    unknown = ", ".join(repr(n) for n in names if n not in COLUMNS)
    if unknown:
        raise TaskFileError(path, f"unknown column(s) {unknown} (known: {', '.join(COLUMNS)})")


def _json_batches(path: Path) -> Iterator[pa.RecordBatch]:
    table = _read_json(path)
    _check_columns(path, table.column_names)
    if table.num_rows > MAX_TASKS:
        raise TaskFileError(path, f"{table.num_rows} tasks, more than {MAX_TASKS}")
    table.validate(full=True)  # invalid UTF-8 is an error here, not a UnicodeDecodeError later
    return iter(table.to_batches(max_chunksize=BATCH_ROWS))


def _parquet_batches(path: Path) -> Iterator[pa.RecordBatch]:
    file = pq.ParquetFile(path)
    _check_columns(path, file.schema_arrow.names)
    for required in ("prompt", "kind"):
        if required not in file.schema_arrow.names:
            raise TaskFileError(path, f"no {required} column")
    if file.metadata.num_rows > MAX_TASKS:
        raise TaskFileError(path, f"{file.metadata.num_rows} tasks, more than {MAX_TASKS}")
    for batch in file.iter_batches(batch_size=BATCH_ROWS):
        batch.validate(full=True)
        yield batch


def _rows(path: Path, batches: Iterator[pa.RecordBatch], kinds: Collection[str]) -> Iterator[Task]:
    row = 0
    for batch in batches:
        for record in batch.to_pylist():
            row += 1
            try:
                yield task_from_row(record, kinds)
            except ValueError as exc:
                raise TaskFileError(path, str(exc), row) from None


def read_tasks(path: str | os.PathLike[str], kinds: Collection[str] = TASK_KINDS) -> list[Task]:
    """The tasks of a `.jsonl`/`.json` or `.parquet` file, in file order, or those a `.toml` family file
    generates; TaskFileError if any row is bad or a family task does not regenerate here."""
    path = Path(path)
    suffix = _suffix(path, JSON_SUFFIXES + PARQUET_SUFFIXES + FAMILY_SUFFIXES)
    if suffix in FAMILY_SUFFIXES:
        return _family_tasks(path, kinds)
    size = 0
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise TaskFileError(path, f"{size} bytes, more than {MAX_FILE_BYTES}")
        if size == 0:
            raise TaskFileError(path, "empty file")
        batches = _json_batches(path) if suffix in JSON_SUFFIXES else _parquet_batches(path)
        tasks = check_tasks(path, _rows(path, batches, kinds), kinds)
    except (pa.ArrowException, OSError) as exc:
        raise _arrow_error(path, exc, one_block=size <= MAX_JSON_RECORD_BYTES) from None
    try:
        check_verifiers_tasks(task for task in tasks if task.kind == VERIFIERS_KIND)
    except VerifiersTaskError as exc:
        raise TaskFileError(path, str(exc)) from None
    try:
        families.check_family_tasks(task for task in tasks if task.kind == families.KIND)
    except families.FamilyTaskError as exc:
        raise TaskFileError(path, str(exc)) from None
    except SandboxUnavailable as exc:
        raise TaskFileError(path, f"family tasks are regenerated in the sandbox: {exc}") from None
    return tasks


_ARROW_ROW = re.compile(r" in row (\d+)$")


def _arrow_error(path: Path, exc: Exception, one_block: bool) -> TaskFileError:
    """pyarrow's complaint as a TaskFileError; its JSON row numbers count from 0 within a block, so they name
    the row only for a file of one block."""
    text = str(exc)
    if "straddling object" in text:
        too_long = f"a JSON record is longer than {MAX_JSON_RECORD_BYTES} bytes (or not on one line)"
        return TaskFileError(path, too_long)
    text = text.removeprefix("JSON parse error: ") or type(exc).__name__
    match = _ARROW_ROW.search(text)
    if match and one_block:
        return TaskFileError(path, text[: match.start()], int(match.group(1)) + 1)
    return TaskFileError(path, text)


# ---------------------------------------------------------------------------- writing


def write_tasks(tasks: Iterable[Task], path: str | os.PathLike[str],
                kinds: Collection[str] = TASK_KINDS) -> Path:
    """Write a dataset as JSONL or Parquet (by the name's suffix), atomically; the same checks as reading.

    Columns: kind, prompt, target, target_length, task_id (JSONL leaves target_length out when 0).
    """
    path = Path(path)
    suffix = _suffix(path)
    checked = check_tasks(path, tasks, kinds)
    partial = path.with_name(f".{path.name}.partial")
    try:
        if suffix in JSON_SUFFIXES:
            with open(partial, "w", encoding="utf-8") as f:
                f.writelines(task_to_json(t) + "\n" for t in checked)
        else:
            pq.write_table(_table(checked), partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _table(tasks: Sequence[Task]) -> pa.Table:
    schema = pa.schema([("kind", pa.string()), ("prompt", pa.string()), ("target", pa.string()),
                        ("target_length", pa.int64()), ("task_id", pa.string())])
    columns = [[t.kind for t in tasks], [t.prompt for t in tasks], [t.target for t in tasks],
               [t.target_length for t in tasks], [t.task_id.hex() for t in tasks]]
    return pa.table(columns, schema=schema)
