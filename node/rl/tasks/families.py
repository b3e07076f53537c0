"""Procedural task families from the reasoning-gym library (`KIND`): tasks generated from a seed, each
graded by its family's own scorer.

Decisions:
- A task's target is the canonical JSON of where it comes from (library, version, family, config, seed,
  size, index) and its entry's answer, so the run's dataset hash commits to all of it and every node can
  regenerate the entry to check it (`check_family_tasks`) and to grade against it (the scorers read the
  entry's metadata, which the target does not carry). `size` is there because some entries depend on it
  (acre's do).
- Every call into the library runs in the sandbox, never in the node: scorers `eval` the completion's text
  (string_insertion, spiral_matrix, binary_matrix, n_queens) or parse it with sympy's `parse_expr`, an
  eval too (countdown, puzzle24, polynomial_multiplication, the integration families), and generation
  evals expressions built from the run's config (basic_arithmetic, bitwise_arithmetic). Importing it also
  costs a second and 110 MB, and pool_matrix reseeds numpy's global generator.
- Deterministic on every machine: the sandbox fixes PYTHONHASHSEED (isomorphic_strings, knight_swap,
  polynomial_multiplication, ransom_note and word_ladder iterate sets of str), and the program reseeds
  `random` and numpy's global generator from (seed, index) before each entry (codeio's sample programs,
  list_functions and pool_matrix draw from them).
- A completion's cost is bounded: the answer (the last `<answer>...</answer>`, as the library's
  `extract_answer` finds it, but in linear time) has at most `MAX_ANSWER_CHARS`, or reward 0 without a
  sandbox run; the scorer runs under `LINE_BUDGET` Python lines (reward 0 past it); a scorer's exception
  is reward 0 naming its type. Wall time, CPU and memory are only a safety net: `GraderFault`.
- The program's result lines start with a nonce the parent sends on stdin, and it says "ready" before the
  scorer runs: a crash before that is this machine's fault (`GraderFault`), one after it the completion's
  (reward 0), and text the scorer evals must find the nonce before it can print a reward. That raises the
  bar for forging a reward; it does not remove it (such text can walk the interpreter's frames).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import secrets
import site
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from swarmnode.node.errors import OperatorError
from swarmnode.node.rl.tasks.core import Grade, GraderFault, Task
from swarmnode.node.sandbox import Outcome, RunResult, SandboxLimits, run_python
from swarmnode.node.sandbox.bwrap import read_only_path
from swarmnode.node.sandbox.launcher import BUDGET_EXIT
from swarmnode.node.sandbox.replies import PROGRAM_PREAMBLE, nonced_replies

KIND = "reasoning_gym"
LIBRARY = "reasoning-gym"  # the distribution's name (its module `reasoning_gym.__version__` lags it)
ANSWER_INSTRUCTION = "Give only your final answer, between <answer> and </answer> tags."
MAX_ANSWER_CHARS = 4096  # an extracted answer; longer is reward 0 (honest ones are a few hundred at most)
LINE_BUDGET = 2_000_000  # the scorer's Python lines (honest answers: at most 30k, intermediate_integration)
SCORE_LIMITS = SandboxLimits(wall_time_s=30.0, cpu_time_s=15, memory_bytes=2 << 30,
                             aggregate_memory_bytes=3 << 30, line_budget=LINE_BUDGET)
GENERATE_CHUNK = 1024  # entries per sandbox run (each run imports the library: about 1.5 s)
GENERATE_OUTPUT_BYTES = 64 << 20  # one chunk's JSON
REPLY_CHARS = 192  # one answer's reply line at most: the nonce, its position, a reward or a short reason
ROW_CHARS = 64  # a ready row's index and punctuation
ESCAPED_CHARS = 12  # json.dumps writes a character as at most 12 (an astral one: two \uXXXX escapes)
MACHINE_BOUND = (Outcome.TIMEOUT, Outcome.MEMORY, Outcome.KILLED)  # no reward may follow from these

OPEN_TAG, CLOSE_TAG = "<answer>", "</answer>"


class FamilyTaskError(OperatorError, ValueError):
    """A family task this node cannot regenerate as the run committed to it: another library version, an
    unknown family, a different entry or a malformed target. The message names the difference."""


@dataclass(frozen=True)
class FamilyEntry:
    """What a family task's target says: where its entry comes from, and the entry's answer."""

    version: str
    family: str
    config: Mapping[str, Any]
    seed: int
    size: int
    index: int
    answer: str | None

    @property
    def source(self) -> tuple[str, str, int, int]:
        """The dataset the entry comes from: entries of one source regenerate in one sandbox run."""
        return self.family, canonical(self.config), self.seed, self.size


# ---------------------------------------------------------------------------- targets and text (pure)


def canonical(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept; NaN and infinities refused (JSON has none)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def family_target(entry: FamilyEntry) -> str:
    """A family task's target: the canonical JSON of its entry."""
    return canonical({"library": LIBRARY, "version": entry.version, "family": entry.family,
                      "config": dict(entry.config), "seed": entry.seed, "size": entry.size,
                      "index": entry.index, "answer": entry.answer})


def prompt_of(question: str) -> str:
    """A task's prompt: the entry's question, then how to give the answer `grade` extracts."""
    return f"{question}\n\n{ANSWER_INSTRUCTION}"


def _natural(body: Mapping[str, Any], key: str) -> int:
    value = body.get(key)
    if type(value) is not int or value < 0:
        raise FamilyTaskError(f"a {KIND} target's {key} must be a non-negative integer, got {value!r}")
    return value


def parse_target(task: Task) -> FamilyEntry:
    """The entry a family task's target names; FamilyTaskError when it is not a canonical target."""
    try:
        body = json.loads(task.target)
    except ValueError:
        raise FamilyTaskError(f"a {KIND} target must be JSON, got {task.target[:80]!r}") from None
    if not isinstance(body, dict) or body.get("library") != LIBRARY:
        raise FamilyTaskError(f"a {KIND} target must be a {LIBRARY} object, got {task.target[:80]!r}")
    version, family, config, answer = (body.get(k) for k in ("version", "family", "config", "answer"))
    if not (isinstance(version, str) and isinstance(family, str) and isinstance(config, dict)):
        raise FamilyTaskError(f"a {KIND} target needs a version, a family and a config: {task.target[:80]!r}")
    if answer is not None and not isinstance(answer, str):
        raise FamilyTaskError(f"a {KIND} target's answer must be a string or null, got {answer!r}")
    entry = FamilyEntry(version, family, config, _natural(body, "seed"), _natural(body, "size"),
                        _natural(body, "index"), answer)
    if entry.index >= entry.size:
        raise FamilyTaskError(f"a {KIND} target's index {entry.index} is past its size {entry.size}")
    if family_target(entry) != task.target:
        raise FamilyTaskError(f"a {KIND} target is not canonical (sorted keys, no spaces, exactly the "
                              f"known fields): {task.target[:80]!r}")
    return entry


def extract_answer(completion: str) -> str | None:
    """The text of the last `<answer>...</answer>`, stripped, or None: the library's `extract_answer`
    (a lazy regex, left to right) in linear time, where the regex is quadratic in unclosed tags."""
    found = None
    start = completion.find(OPEN_TAG)
    while start >= 0:
        end = completion.find(CLOSE_TAG, start + len(OPEN_TAG))
        if end < 0:
            break
        found = (start + len(OPEN_TAG), end)
        start = completion.find(OPEN_TAG, end + len(CLOSE_TAG))
    return None if found is None else completion[found[0]:found[1]].strip()


def reference_completion(task: Task) -> str:
    """What a supervised warm start trains a model to write: the entry's answer in tags ("" for the
    families with no single answer, whose scorers check a solution instead)."""
    answer = parse_target(task).answer
    return "" if answer is None else f"{OPEN_TAG}{answer}{CLOSE_TAG}"


# ---------------------------------------------------------------------------- the installed library


@functools.cache
def installed_version() -> str | None:
    """The installed reasoning-gym's version, or None."""
    try:
        return metadata.version(LIBRARY)
    except metadata.PackageNotFoundError:
        return None


def check_version(version: str) -> None:
    """FamilyTaskError, naming the fix, unless the installed library is the one the run's tasks come from."""
    installed = installed_version()
    if installed != version:
        raise FamilyTaskError(f"the run's tasks come from {LIBRARY} {version}; this node has "
                              f"{installed or 'none'}: pip install {LIBRARY}=={version}")


@functools.cache
def library_paths() -> tuple[str, ...]:
    """The host folders the sandbox needs read-only: the library's own site-packages, then this
    interpreter's (its dependencies); `python -S` in the sandbox puts none of them on sys.path."""
    own = str(metadata.distribution(LIBRARY).locate_file(""))
    return tuple(dict.fromkeys([own, *site.getsitepackages()]))


# ---------------------------------------------------------------------------- the sandbox program

# Runs under `python -S` in the sandbox, its request on stdin. Replies are lines "<nonce> <json>" on the
# original stdout; the library's own prints go to /dev/null.
PROGRAM = PROGRAM_PREAMBLE + r'''
sys.settrace(None)  # the import and the generation are ours; each answer gets its own count (score)
BUDGET_EXIT = request.pop("budget_exit")
os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg", MPLCONFIGDIR="/work/mpl")
sys.path[:0] = request["path"]
import hashlib, random
import numpy
import reasoning_gym
from reasoning_gym.factory import DATASETS
def entry(dataset, index):
    digest = hashlib.sha256(("%d/%d" % (request["seed"], index)).encode()).digest()
    random.seed(digest)
    numpy.random.seed(int.from_bytes(digest[:4], "big"))
    item = dataset[index]
    if item["answer"] is not None and not isinstance(item["answer"], str):
        raise TypeError("an answer of type " + type(item["answer"]).__name__)
    return item
def dataset():
    if request["family"] not in DATASETS:
        reply({"problem": "unknown"})
        sys.exit(0)
    return reasoning_gym.create_dataset(request["family"], seed=request["seed"], size=request["size"],
                                        **request["config"])
def generate():
    data = dataset()
    reply({"entries": [[e["question"], e["answer"]] for e in (entry(data, i) for i in request["indices"])]})
def score():
    data = dataset()
    items = {}
    for index in sorted({index for _, index, _ in request["answers"]}):
        items[index] = entry(data, index)
    reply({"ready": [[index, item["question"], item["answer"]] for index, item in items.items()]})
    budget = request["line_budget"]
    for k, index, answer in request["answers"]:
        item = items[index]
        lines = [0]
        def count(frame, event, arg, k=k, lines=lines):
            if event == "line":
                lines[0] += 1
                if lines[0] > budget:
                    reply({"k": k, "budget": True})
                    os._exit(BUDGET_EXIT)
            return count
        sys.settrace(count)
        try:
            value = data.score_answer(answer, item)
        except MemoryError:
            raise
        except BaseException as exc:
            sys.settrace(None)
            reply({"k": k, "reward": 0.0, "reason": "the scorer raised " + type(exc).__name__[:64]})
            continue
        sys.settrace(None)
        try:
            reply({"k": k, "reward": float(value)})
        except Exception:
            reply({"k": k, "reward": 0.0,
                   "reason": "the scorer returned a " + type(value).__name__[:64] + ", not a number"})
try:
    generate() if request["mode"] == "generate" else score()
except MemoryError:
    raise
except Exception as exc:
    reply({"problem": type(exc).__name__ + ": " + str(exc)[:300]})
'''


def _sandboxed(request: Mapping[str, Any], limits: SandboxLimits) -> tuple[RunResult, list[dict[str, Any]]]:
    """Run `PROGRAM` on `request` in the sandbox: how it ended, and its replies."""
    paths = library_paths()
    nonce = secrets.token_hex(16)
    body = {**request, "nonce": nonce, "budget_exit": BUDGET_EXIT,
            "path": [read_only_path(i) for i in range(len(paths))]}
    result = run_python(PROGRAM, stdin=canonical(body), limits=limits, read_only=paths)
    return result, nonced_replies(result.stdout, nonce)


def _last_line(result: RunResult) -> str:
    lines = result.stderr.strip().splitlines()
    return f": {lines[-1][:200]}" if lines else ""


# ---------------------------------------------------------------------------- generating and checking


def _generation_limits(count: int) -> SandboxLimits:
    """Generous, from the slowest family (futoshiki: 0.44 s an entry): a limit here is the operator's."""
    seconds = 60 + count
    return SandboxLimits(wall_time_s=float(seconds), cpu_time_s=seconds, memory_bytes=2 << 30,
                         aggregate_memory_bytes=3 << 30, file_size_bytes=GENERATE_OUTPUT_BYTES,
                         max_output_chars=GENERATE_OUTPUT_BYTES)


def _check_config(family: str, config: Mapping[str, Any]) -> None:
    if "seed" in config or "size" in config:
        raise FamilyTaskError(f"{family}: the config may not set seed or size (the task source does)")
    try:
        canonical(dict(config))
    except (TypeError, ValueError) as exc:
        raise FamilyTaskError(f"{family}: the config must be plain JSON: {exc}") from None


def generate_entries(family: str, config: Mapping[str, Any], seed: int, size: int,
                     indices: Sequence[int]) -> list[tuple[str, str | None]]:
    """(question, answer) of the entries at `indices` of the dataset (family, config, seed, size),
    generated in the sandbox, `GENERATE_CHUNK` at a time."""
    _check_config(family, config)
    entries: list[tuple[str, str | None]] = []
    for start in range(0, len(indices), GENERATE_CHUNK):
        chunk = list(indices[start:start + GENERATE_CHUNK])
        request = {"mode": "generate", "family": family, "config": dict(config), "seed": seed,
                   "size": size, "indices": chunk}
        result, replies = _sandboxed(request, _generation_limits(len(chunk)))
        reply = replies[0] if replies else {}
        if reply.get("problem") == "unknown":
            raise FamilyTaskError(f"{LIBRARY} {installed_version()} has no family {family!r}")
        if "problem" in reply:
            raise FamilyTaskError(f"{family} (seed {seed}) cannot generate its tasks: {reply['problem']}")
        if result.outcome is not Outcome.OK or not isinstance(reply.get("entries"), list):
            raise FamilyTaskError(f"generating {len(chunk)} {family} tasks stopped in the sandbox "
                                  f"({result.outcome.value}){_last_line(result)}")
        entries.extend((question, answer) for question, answer in reply["entries"])
    return entries


def family_tasks(family: str, config: Mapping[str, Any], seed: int, count: int) -> list[Task]:
    """The first `count` entries of `family` with `config` from `seed`, as tasks of kind `KIND`."""
    version = installed_version()
    if version is None:
        raise FamilyTaskError(f"{LIBRARY} is not installed: pip install {LIBRARY}")
    if count < 1:
        raise FamilyTaskError(f"{family}: the count must be at least 1, got {count}")
    tasks = []
    for index, (question, answer) in enumerate(generate_entries(family, config, seed, count, range(count))):
        entry = FamilyEntry(version, family, dict(config), seed, count, index, answer)
        tasks.append(Task(KIND, prompt_of(question), family_target(entry)))
    return tasks


def _difference(entry: FamilyEntry, task: Task, question: str, answer: str | None) -> str | None:
    """What differs between a task and its regenerated entry (None: nothing)."""
    where = f"{entry.family} (seed {entry.seed}) entry {entry.index}"
    if answer != entry.answer:
        return f"{where}: the regenerated answer {answer!r} is not the task's {entry.answer!r}"
    if prompt_of(question) != task.prompt:
        return f"{where}: the regenerated question is not the task's prompt ({question[:60]!r}...)"
    return None


def check_family_tasks(tasks: Iterable[Task]) -> None:
    """FamilyTaskError naming the first difference unless this node regenerates every task exactly:
    the same library version, a known family, the same question and answer. One sandbox run per
    source and chunk, so a whole task file is checked in a few runs."""
    groups: dict[tuple[str, str, int, int], list[tuple[FamilyEntry, Task]]] = {}
    for task in tasks:
        entry = parse_target(task)
        check_version(entry.version)
        groups.setdefault(entry.source, []).append((entry, task))
    for members in groups.values():
        first = members[0][0]
        regenerated = generate_entries(first.family, first.config, first.seed, first.size,
                                       [entry.index for entry, _ in members])
        for (entry, task), (question, answer) in zip(members, regenerated, strict=True):
            difference = _difference(entry, task, question, answer)
            if difference is not None:
                raise FamilyTaskError(difference)


def check_family_task(task: Task) -> None:
    """`check_family_tasks` of one task."""
    check_family_tasks([task])


# ---------------------------------------------------------------------------- grading


def _reward(value: Any, family: str) -> Grade:
    """The Grade of a scorer's return value: a number in [0, 1], or 0 saying what it was."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return Grade(0.0, f"the {family} scorer returned {value!r}, not a number")
    if not 0.0 <= value <= 1.0:
        return Grade(0.0, f"the {family} scorer returned {value!r}, outside [0, 1]")
    return Grade(float(value), f"the {family} scorer gave {float(value)!r}")


Answer = tuple[int, FamilyEntry, Task, str]  # (position in the flattened submission, entry, task, answer)


def group_limits(answers: Sequence[Answer], limits: SandboxLimits = SCORE_LIMITS) -> SandboxLimits:
    """One scoring run's limits for `answers`: the one-answer safety net plus room for each, and room to
    write its whole output (`score_output_chars`, beyond the one-answer limit), which the node reads back."""
    output = limits.max_output_chars + score_output_chars(answers)
    return dataclasses.replace(limits, wall_time_s=limits.wall_time_s + 4.0 * len(answers),
                               cpu_time_s=limits.cpu_time_s + 2 * len(answers), max_output_chars=output,
                               file_size_bytes=max(limits.file_size_bytes, output))


def score_output_chars(answers: Sequence[Answer]) -> int:
    """The most a scoring run of `answers` writes beyond stray text: its ready line (each entry's question
    and answer as JSON, at most `ESCAPED_CHARS` a character, as the node holds them) and a reply line per
    answer.

    Read back at the sandbox's default of 8192 characters, a submission of 32 groups of 8 lost its later
    replies (the answer at the cut scored 0, the rest needed another run) and one of 128 groups lost the
    ready line itself (a GraderFault for every node: no verdict)."""
    entries = {entry.index: (task, entry) for _, entry, task, _ in answers}
    ready = sum(ESCAPED_CHARS * (len(task.prompt) + len(entry.answer or "")) + ROW_CHARS
                for task, entry in entries.values())
    return ready + REPLY_CHARS * len(answers)


def _answer_grade(answer: str | None) -> Grade | None:
    """The grade an answer gets without the scorer (none, or too long), else None."""
    if answer is None:
        return Grade(0.0, f"no {OPEN_TAG}...{CLOSE_TAG} in the completion")
    if len(answer) > MAX_ANSWER_CHARS:
        return Grade(0.0, f"the answer has {len(answer)} characters, more than {MAX_ANSWER_CHARS}")
    return None


def _score_run(answers: Sequence[Answer], limits: SandboxLimits) -> tuple[dict[int, Grade], int | None]:
    """One sandbox run scoring `answers` of one dataset source in order: the grades it gave, and the
    position it stopped at (None: it scored them all). The answer it stopped at gets 0 (it spent its line
    budget or ended the program); those after it are the caller's to score in a new run."""
    first = answers[0][1]
    request = {"mode": "score", "family": first.family, "config": dict(first.config), "seed": first.seed,
               "size": first.size, "line_budget": limits.line_budget,
               "answers": [[k, entry.index, answer] for k, entry, _, answer in answers]}
    result, replies = _sandboxed(request, group_limits(answers, limits))
    if result.outcome in MACHINE_BOUND:
        raise GraderFault(f"the {KIND} sandbox stopped on a machine-dependent limit ({result.outcome.value})")
    ready = replies[0].get("ready") if replies else None
    if not isinstance(ready, list):
        problem = replies[0].get("problem") if replies else f"{result.outcome.value}{_last_line(result)}"
        raise GraderFault(f"{first.family} entries did not regenerate: {problem}")
    regenerated = {row[0]: row[1:] for row in ready if isinstance(row, list) and len(row) == 3}
    for _, entry, task, _ in answers:
        question, answer = regenerated.get(entry.index, (None, None))
        difference = _difference(entry, task, question, answer) if question is not None else "missing"
        if difference is not None:
            raise GraderFault(f"{first.family} entry {entry.index} did not regenerate: {difference}")
    grades: dict[int, Grade] = {}
    for (k, entry, _, _), body in zip(answers, replies[1:], strict=False):
        if body.get("k") != k:
            break  # not the program's reply for this answer: what follows is not trusted
        if body.get("budget") is True:
            return {**grades, k: Grade(0.0, f"the {entry.family} scorer spent its budget of "
                                            f"{limits.line_budget} lines")}, k
        if "reason" in body:
            grades[k] = Grade(0.0, str(body["reason"])[:200])
        else:
            grades[k] = _reward(body.get("reward"), entry.family)
    if len(grades) == len(answers):
        return grades, None
    stopped, entry = answers[len(grades)][0], answers[len(grades)][1]
    grades[stopped] = Grade(0.0, f"the {entry.family} scorer ended without a result ({result.outcome.value})")
    return grades, stopped


def grade_groups(groups: Sequence[tuple[Task, Sequence[str]]],
                 limits: SandboxLimits = SCORE_LIMITS) -> list[list[Grade]]:
    """The family's own scores of every completion (its last `<answer>...</answer>`) of a submission's
    groups, in order.

    The answers of one dataset source (family, config, seed, size) are scored in one sandbox run, in
    submission order (the library imports once: about 1 s), each under its own line budget; an answer
    that spends it or ends the program gets 0 and the answers after it are scored in a new run.
    Deterministic for a list of (task, texts) (workers and validators grade a submission whole);
    GraderFault when a run stopped on a machine-dependent limit or an entry did not regenerate here.
    FamilyTaskError: another library version.
    """
    grades: dict[int, Grade] = {}
    by_source: dict[tuple[str, str, int, int], list[Answer]] = {}
    position = 0
    for task, completions in groups:
        entry = parse_target(task)
        check_version(entry.version)
        for completion in completions:
            answer = extract_answer(completion)
            known = _answer_grade(answer)
            if known is not None:
                grades[position] = known
            else:
                assert answer is not None
                by_source.setdefault(entry.source, []).append((position, entry, task, answer))
            position += 1
    for pending in by_source.values():
        while pending:
            scored, stopped = _score_run(pending, limits)
            grades.update(scored)
            pending = [] if stopped is None else [a for a in pending if a[0] > stopped]
    flat = [grades[k] for k in range(position)]
    out, start = [], 0
    for _, completions in groups:
        out.append(flat[start:start + len(completions)])
        start += len(completions)
    return out


def grade_group(task: Task, completions: Sequence[str], limits: SandboxLimits = SCORE_LIMITS) -> list[Grade]:
    """`grade_groups` of one group."""
    return grade_groups([(task, completions)], limits)[0]


def grade(task: Task, completion: str, limits: SandboxLimits = SCORE_LIMITS) -> Grade:
    """The family's own score of one completion: a group of one (`grade_groups`)."""
    return grade_groups([(task, [completion])], limits)[0][0]
