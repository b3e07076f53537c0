"""INTELLECT-2's offline filter (node.rl.tasks.filter) on a real tiny model, and `swarmnode tasks`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.node.cli.tasks import tasks_group
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.sampling import derive_seed
from swarmnode.node.rl.tasks import Task, dataset_hash, grade, read_tasks, write_tasks
from swarmnode.node.rl.tasks.filter import FILTER_RUN, FILTER_WORKER, filter_tasks, pass_rates, task_pass_rate
from tests.tinymodel import tiny_engine, tiny_folder

SAMPLES = 8
PROMPT = "3+4="
NEVER = Task("arithmetic", PROMPT, "never-said")  # not a token of the tiny vocabulary: rate 0


@pytest.fixture(scope="module")
def engine() -> TransformersEngine:
    return tiny_engine()


@pytest.fixture(scope="module")
def mixed(engine: TransformersEngine) -> tuple[Task, float]:
    """A task the random model sometimes passes: its target is a token that some, not all, of the task's own
    seeded one-token samples produce. Candidates are ranked by one batched group over every token's text."""
    tok = engine.tokenizer
    prompt = tok.encode_prompt(PROMPT)
    texts = sorted({tok.tokenizer.decode([i]).strip() for i in range(engine.info.vocab_size)})
    candidates = [Task("arithmetic", PROMPT, t) for t in texts if t.isalnum()]
    seeds = [derive_seed(FILTER_RUN, FILTER_WORKER, 0, c.task_id, i)
             for c in candidates for i in range(SAMPLES)]
    group = engine.generate_group(prompt, len(seeds), seeds, 1, 1.0)
    for k, task in enumerate(candidates):
        passes = sum(tok.completion_text(c.tokens).strip() == task.target
                     for c in group[k * SAMPLES : (k + 1) * SAMPLES])
        if 0 < passes < SAMPLES:
            rate = task_pass_rate(engine, task, samples=SAMPLES, max_new_tokens=1, temperature=1.0)
            if 0 < rate < 1:
                return task, rate
    raise AssertionError("no token of the tiny model's vocabulary is sampled sometimes but not always")


def greedy_task(engine: TransformersEngine, prompt: str, max_new_tokens: int, target_length: int = 0) -> Task:
    """A task whose answer is the model's greedy completion: temperature 0 always solves it."""
    ids = engine.tokenizer.encode_prompt(prompt, target_length)
    [completion] = engine.generate_group(ids, 1, [0], max_new_tokens, 0.0)
    text = engine.tokenizer.completion_text(completion.tokens).strip()
    assert text, "the tiny model's greedy completion is blank"
    return Task("arithmetic", prompt, text, target_length)


# ---------------------------------------------------------------------------- filter_tasks (pure)


@given(rates=st.lists(st.integers(0, 8), max_size=30), bounds=st.tuples(st.integers(0, 8), st.integers(0, 8)))
def test_filter_keeps_what_is_strictly_between_the_bounds(rates, bounds):
    low, high = sorted(bounds)
    if low == high:
        return
    tasks = [Task("arithmetic", f"{i}+0=", str(i)) for i in range(len(rates))]
    values = [r / 8 for r in rates]
    kept, easy, hard = filter_tasks(tasks, values, low / 8, high / 8)
    assert kept == [t for t, r in zip(tasks, rates, strict=True) if low < r < high]  # dataset order kept
    assert easy == [t for t, r in zip(tasks, rates, strict=True) if r >= high]
    assert hard == [t for t, r in zip(tasks, rates, strict=True) if r <= low]


def test_filter_defaults_drop_never_and_always_solved():
    tasks = [Task("arithmetic", f"{i}+0=", str(i)) for i in range(4)]
    assert filter_tasks(tasks, [0.0, 0.5, 1.0, 0.125]) == ([tasks[1], tasks[3]], [tasks[2]], [tasks[0]])
    with pytest.raises(ValueError, match="3 pass rates for 4 tasks"):
        filter_tasks(tasks, [0.0, 0.5, 1.0])
    for low, high in ((0.5, 0.5), (0.6, 0.4), (-0.1, 1.0), (0.0, 1.1)):
        with pytest.raises(ValueError, match="min_pass < max_pass"):
            filter_tasks(tasks, [0.0] * 4, low, high)


# ---------------------------------------------------------------------------- pass rates on a real model


def test_pass_rates_follow_the_seed_rule_and_are_reproducible(engine, mixed):
    task, rate = mixed
    calls: list[tuple[int, int, float]] = []
    rates = pass_rates(engine, [task, NEVER], samples=SAMPLES, max_new_tokens=1,
                       progress=lambda *a: calls.append(a))
    assert rates == [rate, 0.0] and calls == [(1, 2, rate), (2, 2, 0.0)]
    # the documented rule, by hand: seeds from (FILTER_RUN, FILTER_WORKER, seed, task id, i), graded text
    seeds = [derive_seed(FILTER_RUN, FILTER_WORKER, 0, task.task_id, i) for i in range(SAMPLES)]
    group = engine.generate_group(engine.tokenizer.encode_prompt(task.prompt), SAMPLES, seeds, 1, 1.0)
    by_hand = [grade(task, engine.tokenizer.completion_text(c.tokens)).reward for c in group]
    assert sum(r > 0.5 for r in by_hand) / SAMPLES == rate
    assert pass_rates(engine, [task], samples=SAMPLES, max_new_tokens=1) == [rate]


def test_greedy_answers_pass_always_and_prompts_carry_the_length_target(engine):
    # a prompt that leaves room for exactly 4 new tokens
    prompt = next(p for p in (PROMPT + "0" * n for n in range(1000))
                  if len(engine.tokenizer.encode_prompt(p)) + 4 >= engine.info.max_positions)
    room = engine.info.max_positions - len(engine.tokenizer.encode_prompt(prompt))
    solved = greedy_task(engine, prompt, room)
    with_length = Task(solved.kind, solved.prompt, solved.target, 64)
    # the length instruction is a system message: that prompt is longer and leaves no room for `room` tokens
    assert len(engine.tokenizer.encode_prompt(prompt, 64)) > len(engine.tokenizer.encode_prompt(prompt))
    rates = pass_rates(engine, [solved, with_length], samples=2, max_new_tokens=room, temperature=0.0)
    assert rates == [1.0, 0.0]
    short = greedy_task(engine, PROMPT, 4, target_length=64)
    assert pass_rates(engine, [short], samples=2, max_new_tokens=4, temperature=0.0) == [1.0]


def test_pass_rates_refuse_bad_arguments(engine):
    for kwargs in ({"samples": 0, "max_new_tokens": 1}, {"samples": 1, "max_new_tokens": 0},
                   {"samples": 1, "max_new_tokens": 1, "seed": -1},
                   {"samples": 1, "max_new_tokens": 1, "seed": 2**64}):
        with pytest.raises(ValueError):
            pass_rates(engine, [NEVER], **kwargs)


# ---------------------------------------------------------------------------- the CLI


def test_tasks_show(tmp_path):
    tasks = [Task("arithmetic", "1+1=", "2"), Task("code", "Write f.", "assert f() == 1", 300)]
    path = write_tasks(tasks, tmp_path / "t.parquet")
    result = CliRunner().invoke(tasks_group, ["show", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["tasks"] == 2 and doc["kinds"] == {"arithmetic": 1, "code": 1}
    assert doc["with_target_length"] == 1
    assert doc["dataset_hash"] == "0x" + dataset_hash(tasks).hex() and len(doc["head"]) == 2
    text = CliRunner().invoke(tasks_group, ["show", str(path), "--head", "1"])
    assert text.exit_code == 0 and dataset_hash(tasks).hex() in text.output and "arithmetic: 1" in text.output
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x", "kind": "poetry", "answer": "1"}\n')
    bad = CliRunner().invoke(tasks_group, ["show", str(tmp_path / "bad.jsonl")])
    assert bad.exit_code == 1 and "row 1: kind 'poetry' is not a task kind" in bad.output


def test_tasks_filter_on_a_tiny_model(tmp_path, mixed):
    task, rate = mixed
    source = write_tasks([NEVER, task], tmp_path / "in.jsonl")
    base = ["filter", "--model", str(tiny_folder()), "--tasks", str(source), "--samples", str(SAMPLES),
            "--max-new-tokens", "1"]
    result = CliRunner().invoke(tasks_group, [*base, "--out", str(tmp_path / "out.parquet"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.strip().splitlines()[-1])
    assert (doc["tasks"], doc["kept"], doc["dropped_easy"], doc["dropped_hard"]) == (2, 1, 0, 1)
    assert doc["pass_counts"]["0/8"] == 1 and doc["pass_counts"][f"{round(rate * SAMPLES)}/8"] == 1
    assert read_tasks(tmp_path / "out.parquet") == [task]
    assert doc["dataset_hash"] == "0x" + dataset_hash([task]).hex()
    assert "filter: 2/2 tasks" in result.output  # progress (stderr, mixed in by the runner)
    # with max-pass at its rate the task is too easy: nothing kept, nothing written, status 1
    easy = CliRunner().invoke(tasks_group, [*base, "--out", str(tmp_path / "none.jsonl"),
                                            "--max-pass", str(rate)])
    assert easy.exit_code == 1 and "kept 0, dropped 1 too easy" in easy.output
    assert "no task kept" in easy.output
    assert not (tmp_path / "none.jsonl").exists()
    same = CliRunner().invoke(tasks_group, [*base, "--out", str(source)])
    assert same.exit_code == 2 and "must not be the --tasks file" in same.output
    wrong = CliRunner().invoke(tasks_group, [*base, "--out", str(tmp_path / "o.jsonl"), "--min-pass", "0.5",
                                             "--max-pass", "0.5"])
    assert wrong.exit_code == 2 and "must be below" in wrong.output
    csv = CliRunner().invoke(tasks_group, [*base, "--out", str(tmp_path / "o.csv")])
    assert csv.exit_code == 2 and "--out must end in .jsonl, .json, .parquet" in csv.output
    not_a_model = [*base[:2], str(tmp_path), *base[3:], "--out", str(tmp_path / "o.jsonl")]
    model = CliRunner().invoke(tasks_group, not_a_model)
    assert model.exit_code == 1 and str(tmp_path) in model.output
