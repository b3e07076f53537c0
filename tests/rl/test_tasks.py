"""Tasks: ids, JSONL, assignment, and the reward functions of arithmetic, math and code."""

from __future__ import annotations

import hashlib
import time

import pytest

from swarmnode.node.rl.tasks import (
    MAX_TARGET_LENGTH,
    Task,
    arithmetic,
    assign_tasks,
    canonical_json,
    code,
    grade,
    math,
    read_jsonl,
    task_from_json,
    task_id,
    task_length_target,
    task_to_json,
    write_jsonl,
)
from swarmnode.node.rl.tasks.code import Outcome, SandboxLimits, run_python
from swarmnode.protocol.messages import GrpoParams

FAST = SandboxLimits(wall_time_s=2.0, cpu_time_s=2, memory_bytes=256 * 2**20)


def devnet_grpo_params(length_target: int) -> GrpoParams:
    return GrpoParams(group_size=8, prompts_per_step=4, max_new_tokens=6, temperature=1.0, learning_rate=2e-4,
                      clip_epsilon=0.2, clip_delta=4.0, max_grad_norm=1.0, token_budget=192,
                      length_target=length_target, length_penalty=0.0003)


# ---------------------------------------------------------------------------- ids, datasets, assignment


def test_task_id_is_a_stable_content_hash():
    t = Task("arithmetic", "12+7=", "19")
    assert t.task_id.hex() == "1a3c4bdbd347faf9f6ed7e1e82a02325772982c31e5b893ad52ed18b649435b7"  # pinned
    assert t.task_id == hashlib.sha256(b'{"kind":"arithmetic","prompt":"12+7=","target":"19"}').digest()
    assert task_id(Task("arithmetic", "12+7=", "20")) != t.task_id
    assert task_id(Task("math", "π?", "3")) == task_id(Task("math", "π?", "3"))  # non-ASCII hashed as UTF-8


def test_jsonl_round_trip_and_tamper_detection(tmp_path):
    tasks = arithmetic.generate_tasks(arithmetic.DEVNET_PARAMS, seed=1, count=20) + [
        Task("math", 'x\n"y"', "1")
    ]
    path = tmp_path / "d.jsonl"
    write_jsonl(tasks, path)
    assert read_jsonl(path) == tasks
    line = task_to_json(tasks[0])
    with pytest.raises(ValueError, match="does not match"):
        task_from_json(line.replace('"target":"', '"target":"1'))
    with pytest.raises(ValueError, match="not a task"):
        task_from_json('{"kind":"a","prompt":"b","target":"c","extra":1}')
    with pytest.raises(ValueError, match="strings"):
        task_from_json('{"kind":"a","prompt":"b","target":3}')


def test_target_length_enters_the_id_only_when_set():
    plain = Task("math", "x?", "1")
    assert Task("math", "x?", "1", 0).task_id == plain.task_id  # ids of tasks without one are unchanged
    long = Task("math", "x?", "1", 512)
    assert canonical_json(long) == '{"kind":"math","prompt":"x?","target":"1","target_length":512}'
    assert long.task_id == hashlib.sha256(canonical_json(long).encode()).digest() != plain.task_id
    assert task_from_json(task_to_json(long)) == long and '"target_length":512' in task_to_json(long)
    assert "target_length" not in task_to_json(plain)
    for bad in (-1, MAX_TARGET_LENGTH + 1, True, 1.0, "5"):
        with pytest.raises(ValueError, match="target_length"):
            Task("math", "x?", "1", bad)
    with pytest.raises(ValueError, match="target_length"):
        task_from_json('{"kind":"math","prompt":"x?","target":"1","target_length":-3}')


def test_a_tasks_length_target_overrides_the_runs():
    grpo = devnet_grpo_params(length_target=300)
    assert task_length_target(Task("math", "x?", "1"), grpo) == 300
    assert task_length_target(Task("math", "x?", "1", 1000), grpo) == 1000
    assert task_length_target(Task("math", "x?", "1"), devnet_grpo_params(length_target=0)) == 0


def test_assignment_is_deterministic_distinct_and_per_worker():
    ids = [hashlib.sha256(bytes([i])).digest() for i in range(50)]
    a = assign_tasks(ids, b"\x01" * 20, step=3, count=8)
    assert a == assign_tasks(ids, b"\x01" * 20, step=3, count=8)
    assert len(set(a)) == 8 and set(a) <= set(ids)
    assert a != assign_tasks(ids, b"\x02" * 20, step=3, count=8)
    assert a != assign_tasks(ids, b"\x01" * 20, step=4, count=8)
    assert sorted(assign_tasks(ids, b"\x01" * 20, step=3, count=50)) == sorted(ids)  # all, once each
    with pytest.raises(ValueError):
        assign_tasks(ids, b"\x01" * 20, step=3, count=51)


# ---------------------------------------------------------------------------- arithmetic


def test_arithmetic_generator_is_seeded_and_correct():
    params = arithmetic.ArithmeticParams(min_value=0, max_value=20, operators="+-*", num_operands=3)
    tasks = arithmetic.generate_tasks(params, seed=5, count=50)
    assert tasks == arithmetic.generate_tasks(params, seed=5, count=50)
    assert tasks != arithmetic.generate_tasks(params, seed=6, count=50)
    for t in tasks:
        assert t.prompt.endswith("=") and int(t.target) == eval(t.prompt[:-1])  # noqa: S307 (own output)
    assert (
        arithmetic.evaluate([2, 3, 4], ["+", "*"]) == 14 and arithmetic.evaluate([2, 3, 4], ["-", "*"]) == -10
    )


@pytest.mark.parametrize(
    ("completion", "reward"),
    [("19", 1.0), (" 19 ", 1.0), ("18", 0.0), ("19.0", 0.0), ("", 0.0), ("019", 0.0), ("19 20", 0.0)],
)
def test_arithmetic_reward(completion, reward):
    assert grade(Task("arithmetic", "12+7=", "19"), completion).reward == reward


# ---------------------------------------------------------------------------- math


def test_boxed_extraction():
    assert math.extract_boxed("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert math.extract_boxed("\\boxed{1} then \\boxed{ {2} }") == " {2} "
    assert math.extract_boxed("\\boxed{unclosed") is None and math.extract_boxed("no box") is None


@pytest.mark.parametrize(
    ("answer", "target", "reward"),
    [
        ("1/2", "0.5", 1.0),
        ("\\frac{1}{2}", "0.5", 1.0),
        ("\\dfrac12", "\\frac{2}{4}", 1.0),
        ("2^{-1}", "0.5", 1.0),
        ("x = 5", "5", 1.0),
        ("1,000", "1000", 1.0),
        ("\\left( 3 \\right)", "3", 1.0),
        ("45^\\circ", "45", 1.0),
        ("0.3333", "1/3", 0.0),
        ("3", "4", 0.0),
        ("\\text{blue}", "blue", 1.0),
        ("\\text{red}", "blue", 0.0),
        ("2^{100000}", "1", 0.0),  # beyond the grader's bounds: refused before the power is built
    ],
)
def test_math_answers_without_sympy(answer, target, reward):
    assert math.grade(Task("math", "?", target), f"The answer is \\boxed{{{answer}}}.").reward == reward


def test_math_symbolic_equivalence_is_decided_numerically():
    assert math.answers_match("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}").reward == 1.0
    assert math.answers_match("(x+1)^2", "x^2+2x+1").reward == 1.0
    assert math.answers_match("2\\pi", "\\pi+\\pi+1").reward == 0.0


def test_math_pathological_expression_is_refused_by_a_bound():
    result = math.answers_match("9^{9^{9^{9}}}", "1")
    assert result.reward == 0.0


def test_math_refuses_what_is_not_whitelisted():
    assert math.latex_to_expr("__import__('os')") is None
    assert math.latex_to_expr("\\input{/etc/passwd}") is None
    assert math.grade(Task("math", "?", "1"), "no box here").reason.startswith("no \\boxed")


# ---------------------------------------------------------------------------- code


def _code_task() -> Task:
    return Task("code", "Write add(a, b).", "assert add(1, 2) == 3\nassert add(-1, 1) == 0")


def test_code_reward_pass_and_fail():
    ok = code.grade(_code_task(), "Sure:\n```python\ndef add(a, b):\n    return a + b\n```", limits=FAST)
    assert ok == code.Grade(1.0, "tests passed")
    wrong = code.grade(_code_task(), "def add(a, b):\n    return a - b", limits=FAST)
    assert wrong.reward == 0.0 and "AssertionError" in wrong.reason
    assert code.grade(_code_task(), "def add(a, b) return", limits=FAST).reward == 0.0
    assert code.grade(_code_task(), "```python\n```", limits=FAST).reason == "empty answer"


def test_sandbox_enforces_wall_time():
    start = time.perf_counter()
    result = run_python("while True:\n    pass\n", limits=SandboxLimits(wall_time_s=1.0, cpu_time_s=5))
    assert result.outcome is Outcome.TIMEOUT and time.perf_counter() - start < 3


def test_sandbox_enforces_memory_limit():
    result = run_python("x = bytearray(1 << 30)\n", limits=FAST)
    assert result.outcome is Outcome.MEMORY


def test_sandbox_has_no_network_and_a_private_cwd():
    result = run_python(
        "import os, socket\nprint(os.getcwd())\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n",
        limits=FAST,
    )
    assert result.outcome is Outcome.FAILED and result.stdout == "/work\n"  # the scratch tmpfs
    assert "PermissionError" in result.stderr  # seccomp: no socket of any family


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError):
        grade(Task("poetry", "?", "?"), "x")
