"""Graders are bounded and deterministic: hostile answers cost milliseconds and get the same reward twice.

Validators recompute every reward and must get the worker's exactly, so a bound decides a reward only
when it is deterministic (sizes, exponents, an executed-line budget); a machine-dependent limit (wall
time, CPU, memory) raises GraderFault instead. Real parts: mpmath, the code sandbox's subprocesses.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import mpmath
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from swarmnode.node.rl.tasks import Grade, GraderFault, Task, code, grade, math
from swarmnode.node.rl.tasks.code import CODE_LIMITS, LINE_BUDGET, Outcome, SandboxLimits, run_python
from swarmnode.node.rl.tasks.graders import reference_completion

EXAMPLE_TIME_S = 0.5  # per hostile answer, on a loaded 2-core machine (they take about a millisecond)

# --- math ---------------------------------------------------------------------------------------------


def math_grade(answer: str, target: str = "1") -> Grade:
    return grade(Task("math", "?", target), f"The answer is \\boxed{{{answer}}}.")


@pytest.mark.parametrize(
    ("answer", "target", "reward"),
    [
        ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}", 1.0),
        ("(x+1)^2", "x^2+2x+1", 1.0),
        ("x(x+1)", "x^2+x", 1.0),
        ("2\\pi", "\\pi+\\pi+1", 0.0),
        ("\\sqrt[3]{8}", "2", 1.0),
        ("2e", "2\\cdot e", 1.0),
        ("\\sqrt{x^2}", "x", 0.0),  # not for negative x: the points take both signs
        ("x^y", "y^x", 0.0),
        ("x/(x-x)", "1", 0.0),  # defined nowhere the target is
        ("3e2", "300", 1.0),
        ("2.5.3", "7.5", 0.0),  # two numbers touching: nothing to guess
    ],
)
def test_symbolic_answers_are_decided_numerically(answer: str, target: str, reward: float) -> None:
    assert math.answers_match(answer, target).reward == reward


@settings(max_examples=80, deadline=None)
@given(
    answer=st.one_of(
        st.integers(-10**9, 10**9).map(str),
        st.fractions(max_denominator=50).map(lambda f: f"\\frac{{{f.numerator}}}{{{f.denominator}}}"),
        st.sampled_from(["x^2+1", "\\sqrt{2}", "2\\pi", "-3.5"]),
    ),
    boxed=st.booleans(),
)
def test_a_math_tasks_reference_completion_is_graded_right(answer: str, boxed: bool) -> None:
    """What a warm start trains on must be what the grader rewards: a bare answer is boxed, a boxed one
    kept (issue #32: `model init` on plain math answers trained to loss 0 and pass rate 0)."""
    target = f"\\boxed{{{answer}}}" if boxed else answer
    task = Task("math", "What is it?", target)
    completion = reference_completion(task)
    assert completion == (target if boxed else f"\\boxed{{{answer}}}")
    assert grade(task, completion).reward == 1.0
    assert reference_completion(Task("arithmetic", "1+2=", "3")) == "3"


@pytest.mark.parametrize(
    "answer",
    [
        "1e29999999",  # 33 s in Fraction before
        "1e999999999999999999999999",
        "-1e-29999999",
        "10^{10^{10}}",
        "9^{9^{9^{9}}}",
        "2^{100000}",
        "\\sqrt{2}^{10^{100}}",
        "x^{10^{100}}",
        "(1+10^{-100})^{10^{200}}",
        "\\pi^{\\pi^{\\pi^{\\pi}}}",
        "e^{e^{e^{e^{e}}}}",
        "9" * 120 + "^{" + "9" * 120 + "}",
    ],
)
def test_huge_numbers_are_refused_in_milliseconds(answer: str) -> None:
    started = time.perf_counter()
    got = math_grade(answer)
    assert time.perf_counter() - started < EXAMPLE_TIME_S
    assert got.reward == 0.0 and "beyond the grader's bounds" in got.reason


def test_answers_too_long_are_refused_before_parsing() -> None:
    started = time.perf_counter()
    assert math_grade("1+" * 100_000 + "1").reason == "answer too long"
    assert math_grade("{" * 600 + "}" * 600).reason == "answer too long"
    assert math.answers_match("1" * (math.MAX_ANSWER_CHARS + 1), "1").reason == "answer too long"
    assert time.perf_counter() - started < EXAMPLE_TIME_S


def test_the_exact_and_numeric_bounds_are_the_stated_ones() -> None:
    assert math.parse_literal(f"1e{math.MAX_DECIMAL_EXPONENT}") == 10**math.MAX_DECIMAL_EXPONENT
    with pytest.raises(math.BeyondBounds):
        math.parse_literal(f"1e{math.MAX_DECIMAL_EXPONENT + 1}")
    with pytest.raises(math.BeyondBounds):
        math.rational_value("2**4096")  # 4097 bits
    assert math.rational_value("2**4095") == 2**4095
    assert math.answers_match("2^{4000}\\cdot\\pi", "2^{4000}\\pi").reward == 1.0
    assert "beyond" in math.answers_match("2^{4100}\\cdot\\pi", "1").reason


TOKENS = [
    *"0123456789",
    "9999",
    "e",
    "e9999999",
    "e-99999",
    ".",
    "x",
    "y",
    "^",
    "^{",
    "{",
    "}",
    "(",
    ")",
    "+",
    "-",
    "*",
    "/",
    "\\frac",
    "\\sqrt",
    "\\sqrt[",
    "]",
    "\\pi",
    "\\cdot",
    "\\left(",
    "\\right)",
    "\\text{",
    " ",
    ",",
    "=",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    answer=st.lists(st.sampled_from(TOKENS), max_size=80).map("".join),
    target=st.sampled_from(["1", "\\frac{1}{2}", "x^2+1", "2\\sqrt{2}", "\\pi"]),
)
@example(answer="9^{9^{9^{9^{9^{9}}}}}", target="1")
@example(answer="((((((((((x))))))))))" * 6, target="x")
@example(answer="-" * 250 + "1", target="1")
@example(answer="\\frac{" * 40 + "1" + "}{2}" * 40, target="1")
@example(answer="\\sqrt{" * 60 + "2" + "}" * 60, target="1")
def test_hostile_answers_end_in_a_reward_fast_and_the_same_twice(answer: str, target: str) -> None:
    started = time.perf_counter()
    first = math_grade(answer, target)
    elapsed = time.perf_counter() - started
    assert elapsed < EXAMPLE_TIME_S, (answer, elapsed)
    assert first.reward in (0.0, 1.0)
    assert math_grade(answer, target) == first


def test_the_numeric_grader_ignores_global_mpmath_state_and_threads() -> None:
    pairs = [("(x+1)^2", "x^2+2x+1"), ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}"), ("2\\pi", "\\pi+\\pi+1")]
    expected = [math.answers_match(a, b) for a, b in pairs]
    saved = mpmath.mp.prec
    try:
        mpmath.mp.prec = 8  # another library's setting must not change a reward
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda p: math.answers_match(*p), pairs * 8))
    finally:
        mpmath.mp.prec = saved
    assert got == expected * 8


# --- code ---------------------------------------------------------------------------------------------

TASK = Task("code", "Write add(a, b).", "assert add(1, 2) == 3")


def test_an_endless_loop_spends_the_line_budget_the_same_way_every_time() -> None:
    loop = "def add(a, b):\n    while True:\n        pass\n"
    first = code.grade(TASK, loop)
    assert first == Grade(0.0, "budget: line budget spent")
    assert code.grade(TASK, loop) == first


def test_the_budget_counts_lines_not_seconds() -> None:
    limits = SandboxLimits(wall_time_s=10.0, cpu_time_s=5, line_budget=1000)
    small = "def add(a, b):\n    for _ in range(100):\n        pass\n    return a + b\n"
    big = small.replace("100)", "10000)")
    assert code.grade(TASK, small, limits).reward == 1.0
    assert code.grade(TASK, big, limits).reason == "budget: line budget spent"
    assert code.grade(TASK, small.replace("a + b", "a - b"), limits).reward == 0.0  # its own failure


def test_machine_dependent_limits_are_faults_not_rewards() -> None:
    sleepy = "import time\ndef add(a, b):\n    time.sleep(30)\n"
    with pytest.raises(GraderFault, match="timeout"):
        code.grade(TASK, sleepy, SandboxLimits(wall_time_s=1.0, cpu_time_s=5, line_budget=LINE_BUDGET))
    hungry = "x = bytearray(1 << 30)\n"
    with pytest.raises(GraderFault, match="memory"):
        code.grade(TASK, hungry, SandboxLimits(memory_bytes=256 * 2**20, line_budget=LINE_BUDGET))
    c_call = "x = 7 ** (10 ** 8)\n"  # one C call: no line to count, so only the CPU time stops it
    with pytest.raises(GraderFault, match="timeout"):
        code.grade(TASK, c_call, SandboxLimits(wall_time_s=2.0, cpu_time_s=1, line_budget=LINE_BUDGET))


def test_an_output_flood_is_capped_on_disk_and_in_the_reason() -> None:
    flood = "import sys\nsys.stdout.write('x' * (64 << 20))\nsys.stdout.flush()\n"
    result = run_python(flood, limits=SandboxLimits(file_size_bytes=1 << 20, line_budget=LINE_BUDGET))
    assert result.outcome is Outcome.FAILED and "File too large" in result.stderr
    assert len(result.stdout) <= CODE_LIMITS.max_output_chars
    got = code.grade(TASK, flood, SandboxLimits(file_size_bytes=1 << 20, line_budget=LINE_BUDGET))
    assert got.reward == 0.0 and len(got.reason) < 160


def test_grading_uses_the_budgeted_limits_by_default() -> None:
    assert CODE_LIMITS.line_budget == LINE_BUDGET > 0
    assert CODE_LIMITS.cpu_time_s * 1.0 <= CODE_LIMITS.wall_time_s
    assert code.grade(TASK, "def add(a, b):\n    return a + b\n") == Grade(1.0, "tests passed")
