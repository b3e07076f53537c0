"""Environments a swarm can verify (spec/environments.md): honest episodes earn the right reward, bounds end
episodes the same way for worker and validator, and replay reproduces every environment span, so any
changed environment byte is a `FabricatedTurn` naming its span. Real environments and graders throughout;
the code environment runs its grader in the sandbox, as tests/rl/test_tasks.py does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from swarmnode.node.rl.environments import (
    MAX_ENV_BYTES,
    MAX_TOTAL_BYTES,
    MAX_TURNS,
    BadReward,
    Done,
    EnvBounds,
    Environment,
    EnvTurn,
    Span,
    Transcript,
    WrongTaskKind,
    calculator,
    episode,
    game,
)
from swarmnode.node.rl.environments.calculator import CalcError, Calculator, evaluate, tool_reply
from swarmnode.node.rl.environments.game import BadGuessTask, GuessTheNumber, secret, secret_range
from swarmnode.node.rl.environments.registry import ENVIRONMENTS, environment
from swarmnode.node.rl.environments.replay import FabricatedTurn, MalformedTranscript, replay
from swarmnode.node.rl.environments.single_turn import SingleTurn
from swarmnode.node.rl.tasks import Task, arithmetic, grade
from tests.code_tasks import as_code

CALC = Calculator()
GUESS = GuessTheNumber()
SUM = Task("arithmetic", "12+7*3=", "33")
GAME = game.make_task(1, 100)

Policy = Callable[[Transcript], str]


def scripted(turns: Sequence[str]) -> Policy:
    """A model that says `turns` in order, then repeats the last one."""
    return lambda transcript: turns[min(len(transcript.model_turns), len(turns) - 1)]


def last_env_text(transcript: Transcript) -> str:
    return next(s.text for s in reversed(transcript.spans) if s.kind == "env")


def calculator_user(task: Task) -> Policy:
    """Asks the calculator for the prompt's expression, then boxes the result."""
    def turn(transcript: Transcript) -> str:
        if not transcript.spans:
            return f"Let me compute. <calc>{task.prompt.rstrip('=')}</calc>"
        result = last_env_text(transcript).removeprefix("<result>").removesuffix("</result>")
        return f"So the answer is \\boxed{{{result}}}."
    return turn


def binary_searcher(task: Task) -> Policy:
    """Guesses the middle of what the replies so far leave open."""
    def turn(transcript: Transcript) -> str:
        low, high = secret_range(task)
        guesses = [int(t.split()[-1]) for t in transcript.model_turns]
        replies = [s.text for s in transcript.spans if s.kind == "env"]
        for guess, reply in zip(guesses, replies, strict=True):
            if reply == "higher":
                low = guess + 1
            elif reply == "lower":
                high = guess - 1
        return f"My guess: {(low + high) // 2}"
    return turn


def env_indices(transcript: Transcript) -> list[int]:
    return [i for i, s in enumerate(transcript.spans) if s.kind == "env"]


def with_span(transcript: Transcript, index: int, text: str) -> Transcript:
    spans = list(transcript.spans)
    spans[index] = Span(spans[index].kind, text)
    return Transcript(tuple(spans))


# --- the interface -------------------------------------------------------------------------------------


def test_registry_names_every_builtin_with_a_version():
    assert set(ENVIRONMENTS) == {"arithmetic", "math", "code", "reasoning_gym", "calculator", "guess"}
    for name, env in ENVIRONMENTS.items():
        assert env.name == name and env.version == "1"
        assert 1 <= env.bounds.max_turns <= MAX_TURNS
    with pytest.raises(KeyError, match="built in: arithmetic, calculator"):
        environment("chess")


@pytest.mark.parametrize(
    "fields",
    [
        {"max_turns": 0},
        {"max_turns": MAX_TURNS + 1},
        {"max_turns": True},
        {"max_turns": 4, "max_env_bytes": MAX_ENV_BYTES + 1},
        {"max_turns": 4, "max_total_bytes": MAX_TOTAL_BYTES + 1},
        {"max_turns": 4, "max_env_bytes": 0},
    ],
)
def test_bounds_past_the_protocol_maxima_are_refused(fields):
    with pytest.raises(ValueError, match="protocol maximum"):
        EnvBounds(**fields)


def test_a_span_is_model_or_env():
    with pytest.raises(ValueError, match="'model' or 'env'"):
        Span("tool", "x")  # type: ignore[arg-type]


def test_an_environment_refuses_a_task_of_another_kind():
    for env, task in ((CALC, GAME), (GUESS, SUM), (ENVIRONMENTS["math"], SUM)):
        with pytest.raises(WrongTaskKind, match=f"environment {env.name!r} takes tasks of kind"):
            episode(env, task, 0, scripted(["1"]))


@dataclass(frozen=True)
class Overpaying:
    """An environment with a bug: a reward above 1."""

    name: str = "overpaying"
    version: str = "0"
    bounds: EnvBounds = EnvBounds(max_turns=1)

    def respond(self, task: Task, seed: int, model_turns: Sequence[str]) -> EnvTurn | Done:
        return Done(1.5)


def test_a_reward_outside_zero_to_one_is_the_environments_bug():
    with pytest.raises(BadReward, match="'overpaying' returned reward 1.5"):
        episode(Overpaying(), SUM, 0, scripted(["x"]))


# --- single-turn environments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "completion", "reward"),
    [
        (SUM, "33", 1.0),
        (SUM, " 33\n", 1.0),
        (SUM, "34", 0.0),
        (Task("math", "1/2+1/2?", "1"), "It is \\boxed{\\frac{2}{2}}.", 1.0),
        (Task("math", "1/2+1/2?", "1"), "It is \\boxed{2}.", 0.0),
    ],
)
def test_single_turn_earns_what_its_grader_gives(task, completion, reward):
    env = ENVIRONMENTS[task.kind]
    result = episode(env, task, 7, scripted([completion]))
    assert result.transcript == Transcript((Span("model", completion),))
    assert result.reward == reward == grade(task, completion).reward
    assert result.ended_by == "done"
    assert replay(env, task, 7, result.transcript).reward == reward


def test_single_turn_code_is_graded_in_the_sandbox():
    task = as_code(Task("arithmetic", "2+3=", "5"))
    for completion, reward in (("2+3", 1.0), ("2+4", 0.0)):
        result = episode(ENVIRONMENTS["code"], task, 0, scripted([completion]))
        assert (result.reward, result.ended_by) == (reward, "done")


def test_single_turn_takes_one_model_turn_only():
    env = SingleTurn("arithmetic")
    two = Transcript((Span("model", "33"), Span("model", "33")))
    with pytest.raises(MalformedTranscript, match="span 1: a span after the end of the episode"):
        replay(env, SUM, 0, two)


# --- the calculator -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12+7*3", 33),
        ("(12+7)*3", 57),
        (" - 3 - -3 ", 0),
        ("7/2", Fraction(7, 2)),
        ("1/3*3", 1),
        ("((((1))))", 1),
        ("+5", 5),
        ("0001", 1),
    ],
)
def test_the_calculator_computes_exactly_with_precedence(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("", "empty expression"),
        ("1/0", "division by zero"),
        ("1/(2-2)", "division by zero"),
        ("2**3", "unexpected '\\*'"),
        ("2^3", "unexpected character at position 1"),
        ("1e9", "unexpected character at position 1"),
        ("١٢", "unexpected character at position 0"),  # Arabic-Indic digits are not the syntax's
        ("(1+2", "ends too early"),
        ("1+", "ends too early"),
        ("(1+2))", "unexpected '\\)' after the expression"),
        ("1 2", "unexpected '2' after the expression"),
        ("1" * 41, "longer than 40 digits"),
        ("1+" * 200, "longer than 256 characters"),
        ("(" * 33 + "1" + ")" * 33, "nested deeper than 32"),
        ("-" * 40 + "1", "nested deeper than 32"),
        ("*".join(["9" * 40] * 3), "beyond 256 bits"),
        ("1/" + "/".join(["9" * 40] * 3), "beyond 256 bits"),
    ],
)
def test_the_calculator_refuses_with_a_reason(expression, error):
    with pytest.raises(CalcError, match=error):
        evaluate(expression)


def test_tool_replies():
    assert tool_reply("so <calc>6*7</calc>") == "<result>42</result>"
    assert tool_reply("<calc>1-3/2</calc><calc>9</calc>") == "<result>-1/2</result>"
    assert tool_reply("<calc>6*7") == "<error>no </calc> after <calc></error>"
    assert tool_reply("<calc>6/0</calc>") == "<error>division by zero</error>"


def test_a_calculator_user_answers_right():
    result = episode(CALC, SUM, 0, calculator_user(SUM))
    assert [s.text for s in result.transcript.spans] == [
        "Let me compute. <calc>12+7*3</calc>",
        "<result>33</result>",
        "So the answer is \\boxed{33}.",
    ]
    assert (result.reward, result.ended_by) == (1.0, "done")
    assert replay(CALC, SUM, 0, result.transcript).reward == 1.0


@pytest.mark.parametrize(("answer", "reward"), [("33", 1.0), ("\\boxed{34}", 0.0), ("thirty-three", 0.0)])
def test_an_answer_without_a_call_ends_the_episode(answer, reward):
    result = episode(CALC, SUM, 0, scripted([answer]))
    assert (result.reward, result.ended_by, len(result.transcript.spans)) == (reward, "done", 1)


def test_calling_forever_ends_at_the_turn_bound_with_nothing():
    bounds = EnvBounds(max_turns=3)
    result = episode(CALC, SUM, 0, scripted(["<calc>1+1</calc>"]), bounds)
    assert [s.kind for s in result.transcript.spans] == ["model", "env", "model", "env", "model"]
    assert (result.reward, result.ended_by) == (0.0, "max_turns")
    assert replay(CALC, SUM, 0, result.transcript, bounds).ended_by == "max_turns"


def test_a_reply_too_long_for_the_run_ends_the_episode():
    bounds = EnvBounds(max_turns=4, max_env_bytes=len("<result>2</result>") - 1)
    result = episode(CALC, SUM, 0, scripted(["<calc>1+1</calc>"]), bounds)
    assert (result.reward, result.ended_by, len(result.transcript.spans)) == (0.0, "max_env_bytes", 1)


def test_the_byte_budget_covers_model_and_environment_spans():
    call = "<calc>1+1</calc>"
    reply = "<result>2</result>"
    fits_one_call = EnvBounds(max_turns=4, max_total_bytes=len(call) + len(reply))
    result = episode(CALC, SUM, 0, scripted([call, "\\boxed{33}"]), fits_one_call)
    assert (result.reward, result.ended_by) == (0.0, "max_total_bytes")  # the right answer came too late
    assert len(result.transcript.spans) == 3
    assert replay(CALC, SUM, 0, result.transcript, fits_one_call).ended_by == "max_total_bytes"
    too_small = EnvBounds(max_turns=4, max_total_bytes=len(call) + len(reply) - 1)
    result = episode(CALC, SUM, 0, scripted([call]), too_small)
    assert (result.ended_by, len(result.transcript.spans)) == ("max_total_bytes", 1)


# --- guess the number -----------------------------------------------------------------------------------


def test_a_binary_searcher_always_wins_within_the_bound():
    for task in game.generate_tasks(20, seed=3):
        for seed in (0, 1, 2**63 - 1):
            result = episode(GUESS, task, seed, binary_searcher(task))
            assert (result.reward, result.ended_by) == (1.0, "done"), (task.target, seed)
            assert result.transcript.model_turns[-1] == f"My guess: {secret(task, seed)}"
            assert replay(GUESS, task, seed, result.transcript).reward == 1.0


def test_a_linear_guesser_runs_out_of_turns():
    seed = next(s for s in range(100) if secret(GAME, s) > 1 + GUESS.bounds.max_turns)
    result = episode(GUESS, GAME, seed, scripted([str(n) for n in range(1, 101)]))
    assert (result.reward, result.ended_by) == (0.0, "max_turns")
    assert len(result.transcript.model_turns) == GUESS.bounds.max_turns
    assert {s.text for s in result.transcript.spans if s.kind == "env"} == {"higher"}


def test_the_secret_is_in_range_per_rollout_and_reproducible():
    secrets = {secret(GAME, seed) for seed in range(200)}
    assert secrets <= set(range(1, 101)) and len(secrets) > 50
    assert secret(GAME, 9) == secret(game.make_task(1, 100), 9)
    with pytest.raises(ValueError, match="outside u64"):
        secret(GAME, -1)


def test_guess_replies():
    task = game.make_task(5, 5)
    assert GUESS.respond(task, 0, ["4"]) == EnvTurn("higher")
    assert GUESS.respond(task, 0, ["I say 7 no 6"]) == EnvTurn("lower")
    assert GUESS.respond(task, 0, ["-5"]) == EnvTurn("higher")
    assert GUESS.respond(task, 0, ["five"]) == EnvTurn("invalid: write one integer from 5 to 5")
    assert GUESS.respond(task, 0, ["1" * 21]) == EnvTurn("invalid: write one integer from 5 to 5")
    assert GUESS.respond(task, 0, ["it is 5"]) == Done(1.0)


@pytest.mark.parametrize("target", ["1-100", "1..", "10..1", "a..b", f"0..{2**40}", "1.." + "9" * 30])
def test_a_guess_task_needs_a_low_high_range(target):
    with pytest.raises(BadGuessTask):
        secret_range(Task("guess", "?", target))


def test_generated_games_are_deterministic_and_varied():
    tasks = game.generate_tasks(50, seed=1)
    assert tasks == game.generate_tasks(50, seed=1)
    assert len({t.task_id for t in tasks}) > 40
    assert all(t.kind == "guess" and secret_range(t)[0] < secret_range(t)[1] for t in tasks)


# --- replay: malformed transcripts ----------------------------------------------------------------------


def honest_calculator_transcript() -> Transcript:
    return episode(CALC, SUM, 0, calculator_user(SUM)).transcript


def spans(*pairs: tuple[str, str]) -> Transcript:
    return Transcript(tuple(Span(kind, text) for kind, text in pairs))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("transcript", "index", "problem"),
    [
        (spans(), 0, "empty transcript"),
        (spans(("env", "<result>33</result>")), 0, "an environment span where a model turn must be"),
        (spans(("model", "<calc>1</calc>")), 1, "the episode is not over"),
        (spans(("model", "<calc>1</calc>"), ("model", "1")), 1, "a model turn where the environment's"),
        (spans(("model", "<calc>1</calc>"), ("env", "<result>1</result>")), 2, "ends on an environment turn"),
        (spans(("model", "33"), ("env", "correct")), 1, "a span after the end of the episode \\(done\\)"),
        (spans(("model", "<calc>1</calc>"), ("env", "<result>1</result>"), ("env", "x")), 2,
         "an environment span where a model turn must be"),
    ],
)
def test_replay_refuses_a_transcript_of_the_wrong_shape(transcript, index, problem):
    with pytest.raises(MalformedTranscript, match=problem) as caught:
        replay(CALC, SUM, 0, transcript)
    assert caught.value.index == index


def test_replay_applies_the_runs_bounds():
    honest = honest_calculator_transcript()
    after_the_end = "span 1: a span after the end of the episode \\(max_turns\\)"
    with pytest.raises(MalformedTranscript, match=after_the_end):
        replay(CALC, SUM, 0, honest, EnvBounds(max_turns=1))


def test_a_fabricated_result_names_its_span():
    honest = honest_calculator_transcript()
    with pytest.raises(FabricatedTurn) as caught:
        replay(CALC, SUM, 0, with_span(honest, 1, "<result>34</result>"))
    assert (caught.value.index, caught.value.expected, caught.value.claimed) == (
        1, "<result>33</result>", "<result>34</result>")
    assert "span 1: the environment says '<result>33</result>'" in str(caught.value)


def test_the_game_replays_under_its_own_seed_only():
    result = episode(GUESS, GAME, 11, binary_searcher(GAME))
    other = next(s for s in range(12, 100) if secret(GAME, s) != secret(GAME, 11))
    with pytest.raises((FabricatedTurn, MalformedTranscript)):
        replay(GUESS, GAME, other, result.transcript)


# --- properties -----------------------------------------------------------------------------------------

ARITHMETIC = arithmetic.generate_tasks(arithmetic.ArithmeticParams(0, 99, "+-*", 3), seed=5, count=8)
GAMES = game.generate_tasks(8, seed=5, max_size=64)
CALC_TEXT = st.text(alphabet="0123456789+-*/() ", max_size=30)
MODEL_TURN = st.one_of(
    CALC_TEXT.map(lambda e: f"<calc>{e}</calc>"),
    CALC_TEXT.map(lambda e: f"x <calc>{e}"),
    st.integers(-10, 200).map(str),
    st.integers(0, 200).map(lambda n: f"I guess {n}."),
    st.integers(-100, 10**6).map(lambda n: f"\\boxed{{{n}}}"),
    st.text(max_size=40),
)
MODEL_TURNS = st.lists(MODEL_TURN, min_size=1, max_size=14)
PLAYS: list[tuple[Environment, list[Task]]] = [
    (CALC, ARITHMETIC), (GUESS, GAMES), (ENVIRONMENTS["arithmetic"], ARITHMETIC),
]
BOUNDS = st.builds(EnvBounds, st.integers(1, 14), st.integers(1, 40), st.integers(1, 2000))


@st.composite
def played(draw: st.DrawFn, bounds: st.SearchStrategy[EnvBounds | None]):
    env, tasks = draw(st.sampled_from(PLAYS))
    task = draw(st.sampled_from(tasks))
    seed = draw(st.integers(0, 2**64 - 1))
    chosen = draw(bounds)
    right = str(secret(task, seed)) if env is GUESS else task.target
    turn = st.one_of(MODEL_TURN, st.sampled_from([right, f"so \\boxed{{{right}}}"]))
    turns = draw(st.lists(turn, min_size=1, max_size=14))
    return env, task, seed, chosen, episode(env, task, seed, scripted(turns), chosen)


@settings(max_examples=200, deadline=None)
@given(played(bounds=st.one_of(st.none(), BOUNDS)))
def test_replay_reproduces_every_episode(play):
    env, task, seed, bounds, result = play
    event(f"{env.name}: {result.ended_by}, reward {result.reward}")
    replayed = replay(env, task, seed, result.transcript, bounds)
    assert (replayed.reward, replayed.ended_by) == (result.reward, result.ended_by)
    kinds = [s.kind for s in result.transcript.spans]
    assert kinds[::2] == ["model"] * len(kinds[::2]) and set(kinds[1::2]) <= {"env"} and kinds[-1] == "model"


@st.composite
def played_with_env_turns(draw: st.DrawFn):
    """An honest episode of the calculator or the game that has at least one environment span."""
    env, tasks = draw(st.sampled_from(PLAYS[:2]))
    task = draw(st.sampled_from(tasks))
    seed = draw(st.integers(0, 2**64 - 1))
    first = "<calc>1+1</calc>" if env is CALC else str(secret_range(task)[0] - 1)  # always answered
    turns = [first, *draw(MODEL_TURNS)]
    return env, task, seed, episode(env, task, seed, scripted(turns)).transcript


def mutated(draw: st.DrawFn, text: str) -> str:
    """`text` with one change: a character replaced, inserted or removed, or one UTF-8 byte flipped."""
    how = draw(st.sampled_from(["replace", "insert", "remove", "flip"] if text else ["insert"]))
    at = draw(st.integers(0, max(len(text) - 1, 0)))
    if how == "insert":
        return text[:at] + draw(st.characters()) + text[at:]
    if how == "remove":
        return text[:at] + text[at + 1:]
    if how == "replace":
        return text[:at] + draw(st.characters().filter(lambda c: c != text[at])) + text[at + 1:]
    raw = bytearray(text.encode())
    byte = draw(st.integers(0, len(raw) - 1))
    raw[byte] ^= draw(st.integers(1, 255))
    return bytes(raw).decode(errors="surrogateescape")


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_changed_environment_byte_is_a_fabricated_turn(data):
    env, task, seed, honest = data.draw(played_with_env_turns())
    index = data.draw(st.sampled_from(env_indices(honest)))
    forged = mutated(data.draw, honest.spans[index].text)
    assert forged != honest.spans[index].text
    with pytest.raises(FabricatedTurn) as caught:
        replay(env, task, seed, with_span(honest, index, forged))
    assert caught.value.index == index
    assert (caught.value.expected, caught.value.claimed) == (honest.spans[index].text, forged)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.text(alphabet="0123456789+-*/() ", max_size=300)))
def test_the_calculator_raises_only_its_own_error(text):
    try:
        value = evaluate(text)
    except CalcError:
        return
    assert isinstance(value, Fraction)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_call_gets_a_reply(text):
    reply = tool_reply(f"<calc>{text}</calc>")
    assert reply.startswith(("<result>", "<error>")) and len(reply.encode()) <= CALC.bounds.max_env_bytes


@pytest.mark.parametrize(
    "expression",
    [
        "*".join(["9" * 40] * 6),
        "(" * 32 + "9" * 40 + ")" * 32,
        "/".join(["9" * 40] * 6),
        "+".join(["9" * 40] * 6),
        "9" * 40 + "*9" * 107,
    ],
)
def test_the_worst_expressions_cost_little(expression):
    start = time.perf_counter()
    try:
        evaluate(expression)
    except CalcError:
        pass
    assert time.perf_counter() - start < 0.05


def test_calculator_module_states_its_syntax():
    assert "<calc>EXPR</calc>" in calculator.INSTRUCTIONS and "\\boxed{N}" in calculator.INSTRUCTIONS
