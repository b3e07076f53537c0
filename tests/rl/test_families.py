"""reasoning-gym task families: generated in the sandbox, regenerated exactly, graded by the family's scorer.

Real parts throughout: the installed library, the sandbox. Each grade or generation is one sandbox run
(about 1.5 s: the library's import), so the cases share a few generated tasks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.node.errors import OperatorError
from swarmnode.node.rl.tasks.core import Grade, Task
from swarmnode.node.rl.tasks.families import (
    ANSWER_INSTRUCTION,
    KIND,
    MAX_ANSWER_CHARS,
    FamilyEntry,
    FamilyTaskError,
    check_family_task,
    check_family_tasks,
    extract_answer,
    family_target,
    family_tasks,
    grade,
    grade_group,
    grade_groups,
    parse_target,
    reference_completion,
    score_output_chars,
)
from swarmnode.node.sandbox import SandboxLimits

VERSION = metadata.version("reasoning-gym")
CHAIN_CONFIG = {"min_terms": 2, "max_terms": 3}
QUICK = SandboxLimits(wall_time_s=30.0, cpu_time_s=15, memory_bytes=2 << 30, aggregate_memory_bytes=3 << 30,
                      line_budget=200_000)  # the scorer's budget, smaller than grading's for a fast test


@pytest.fixture(scope="module")
def chain() -> list[Task]:
    return family_tasks("chain_sum", CHAIN_CONFIG, 7, 6)


@pytest.fixture(scope="module")
def insertion() -> Task:
    """A task whose scorer `eval`s the answer (a list of characters earns 0.1)."""
    return family_tasks("string_insertion", {}, 3, 1)[0]


def with_entry(task: Task, **changes: object) -> Task:
    """`task` with its target's entry changed (still canonical)."""
    entry = dataclasses.replace(parse_target(task), **changes)  # type: ignore[arg-type]
    return Task(task.kind, task.prompt, family_target(entry))


# ---------------------------------------------------------------------------- generation


def test_tasks_carry_their_source_and_regenerate_identically(chain: list[Task]) -> None:
    body = json.loads(chain[4].target)
    assert body == {"library": "reasoning-gym", "version": VERSION, "family": "chain_sum",
                    "config": CHAIN_CONFIG, "seed": 7, "size": 6, "index": 4, "answer": body["answer"]}
    assert all(t.kind == KIND and t.prompt.endswith(ANSWER_INSTRUCTION) for t in chain)
    assert len({t.task_id for t in chain}) == 6
    check_family_tasks(chain)
    assert family_tasks("chain_sum", CHAIN_CONFIG, 7, 6) == chain
    assert family_tasks("chain_sum", CHAIN_CONFIG, 8, 6) != chain


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_one_entry_regenerates_alone(chain: list[Task]) -> None:
    check_family_task(chain[5])  # a sandbox run generating index 5 only: no state from entries 0 ... 4


HASH_SEED_PROGRAM = """
import json, sys
from swarmnode.node.rl.tasks.families import family_tasks
print(json.dumps({f: [t.task_id.hex() for t in family_tasks(f, {}, 5, 3)] for f in sys.argv[1:]}))
"""


@pytest.mark.slow  # a second process generating three families: about 10 s
def test_tasks_are_the_same_in_a_process_with_another_hash_seed() -> None:
    # isomorphic_strings iterates sets of str (PYTHONHASHSEED); codeio's programs draw from `random`
    families = ["chain_sum", "isomorphic_strings", "codeio"]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", HASH_SEED_PROGRAM, *families], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs == {f: [t.task_id.hex() for t in family_tasks(f, {}, 5, 3)] for f in families}


# ---------------------------------------------------------------------------- refusals


def test_a_changed_answer_is_refused_naming_it(chain: list[Task]) -> None:
    with pytest.raises(FamilyTaskError, match=r"chain_sum \(seed 7\) entry 2: the regenerated answer '\d+'"):
        check_family_task(with_entry(chain[2], answer="-1"))


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_a_changed_question_is_refused_naming_it(chain: list[Task]) -> None:
    edited = Task(KIND, chain[2].prompt.replace("=", "= 1 +", 1), chain[2].target)
    with pytest.raises(FamilyTaskError, match="the regenerated question is not the task's prompt"):
        check_family_task(edited)


def test_another_library_version_is_refused_with_the_fix(chain: list[Task]) -> None:
    other = with_entry(chain[0], version="0.0.1")
    fix = f"come from reasoning-gym 0.0.1; this node has {VERSION}: pip install reasoning-gym==0.0.1"
    with pytest.raises(FamilyTaskError, match=fix.replace(".", r"\.")):
        check_family_task(other)
    with pytest.raises(FamilyTaskError, match="pip install reasoning-gym==0.0.1"):
        grade(other, "<answer>1</answer>")


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_an_unknown_family_is_refused(chain: list[Task]) -> None:
    with pytest.raises(FamilyTaskError, match=f"reasoning-gym {VERSION} has no family 'chain_summ'"):
        check_family_task(with_entry(chain[0], family="chain_summ"))
    with pytest.raises(FamilyTaskError, match="has no family 'nope'"):
        family_tasks("nope", {}, 1, 1)


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_a_config_the_family_does_not_take_is_refused() -> None:
    with pytest.raises(FamilyTaskError, match="chain_sum .seed 1. cannot generate its tasks: TypeError"):
        family_tasks("chain_sum", {"max_termz": 3}, 1, 1)
    with pytest.raises(FamilyTaskError, match="may not set seed or size"):
        family_tasks("chain_sum", {"seed": 3}, 1, 1)


@pytest.mark.parametrize(
    ("target", "complaint"),
    [
        ("156", "must be a reasoning-gym object"),
        ("{", "must be JSON"),
        ('{"library":"reasoning-gym"}', "needs a version, a family and a config"),
        ('{"answer":"1","config":{},"family":"chain_sum","index":6,"library":"reasoning-gym","seed":7,'
         '"size":6,"version":"0"}', "index 6 is past its size 6"),
        ('{"answer":"1","config":{},"family":"chain_sum","index":-1,"library":"reasoning-gym","seed":7,'
         '"size":6,"version":"0"}', "index must be a non-negative integer"),
        ('{"answer":1,"config":{},"family":"chain_sum","index":0,"library":"reasoning-gym","seed":7,'
         '"size":6,"version":"0"}', "answer must be a string or null"),
        ('{"answer": "1","config":{},"family":"chain_sum","index":0,"library":"reasoning-gym","seed":7,'
         '"size":6,"version":"0"}', "not canonical"),
        ('{"answer":"1","config":{},"extra":0,"family":"chain_sum","index":0,"library":"reasoning-gym",'
         '"seed":7,"size":6,"version":"0"}', "not canonical"),
    ],
)
def test_a_malformed_target_is_refused(target: str, complaint: str) -> None:
    task = Task(KIND, "What is 1?", target)
    with pytest.raises(FamilyTaskError, match=complaint):
        check_family_task(task)
    with pytest.raises(FamilyTaskError, match=complaint):
        grade(task, "<answer>1</answer>")


def test_the_errors_are_operator_errors() -> None:
    assert issubclass(FamilyTaskError, OperatorError)


# ---------------------------------------------------------------------------- grading


def test_the_right_answer_scores_1_and_a_wrong_one_0(chain: list[Task]) -> None:
    answer = parse_target(chain[1]).answer
    right = grade(chain[1], f"Adding up step by step... <answer> {answer} </answer>")
    assert right.reward == 1.0 and right.reason == "the chain_sum scorer gave 1.0"
    assert grade(chain[1], reference_completion(chain[1])).reward == 1.0
    wrong = f"<answer>{answer}</answer> no, wait: <answer>{int(answer or 0) + 1}</answer>"  # the last counts
    assert grade(chain[1], wrong).reward == 0.0


@pytest.mark.parametrize(
    ("completion", "reason"),
    [
        ("The answer is 156.", "no <answer>...</answer> in the completion"),
        ("<answer>156", "no <answer>...</answer> in the completion"),
        ("<answer>" + "9" * (MAX_ANSWER_CHARS + 1) + "</answer>",
         f"the answer has {MAX_ANSWER_CHARS + 1} characters, more than {MAX_ANSWER_CHARS}"),
    ],
)
def test_no_answer_or_an_oversized_one_scores_0_without_a_sandbox_run(chain: list[Task], completion: str,
                                                                       reason: str) -> None:
    no_time = SandboxLimits(wall_time_s=0.001)  # a sandbox run would stop on it: GraderFault
    assert grade(chain[0], completion, limits=no_time) == Grade(0.0, reason)


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_garbage_in_the_tags_scores_0(chain: list[Task]) -> None:
    assert grade(chain[0], "<answer>\x00 ¯\\_(ツ)_/¯ </answer>").reward == 0.0


def test_an_evaluated_answer_cannot_report_a_reward(insertion: Task) -> None:
    # string_insertion's scorer evals the answer: it runs, in the sandbox, and cannot print a result
    forged = '{"reward": 1.0}'
    printed = grade(insertion, f"<answer>__import__('os').write(1, b'{forged}\\n') and []</answer>")
    assert printed.reward == 0.0
    exited = grade(insertion, "<answer>(print('x 1.0'), __import__('os')._exit(0))</answer>")
    assert exited.reward == 0.0 and exited.reason == "the string_insertion scorer ended without a result (ok)"


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_an_endless_answer_is_stopped_by_the_line_budget(insertion: Task) -> None:
    spent = grade(insertion, "<answer>[x for x in iter(int, 1)]</answer>", limits=QUICK)
    assert spent == Grade(0.0, "the string_insertion scorer spent its budget of 200000 lines")


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_partial_credit_is_the_familys_own(insertion: Task) -> None:
    answer = parse_target(insertion).answer or ""
    as_list = grade(insertion, f"<answer>{list(answer)!r}</answer>")  # the scorer's own 0.1 for a list
    assert as_list.reward == 0.1


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_a_group_is_scored_in_order_and_an_endless_answer_costs_only_itself(insertion: Task) -> None:
    answer = parse_target(insertion).answer or ""
    texts = [
        f"<answer>{answer}</answer>",
        "<answer>[x for x in iter(int, 1)]</answer>",  # spends its budget: 0, and a new run for the rest
        f"<answer>{list(answer)!r}</answer>",
        "no tags at all",
        "<answer>(__import__('os')._exit(0))</answer>",  # ends the program: 0, and a new run for the rest
        f"<answer>{answer}</answer>",
    ]
    grades = grade_group(insertion, texts, limits=QUICK)
    assert [g.reward for g in grades] == [1.0, 0.0, 0.1, 0.0, 0.0, 1.0]
    assert grades[1].reason == "the string_insertion scorer spent its budget of 200000 lines"
    assert grades[4].reason == "the string_insertion scorer ended without a result (ok)"
    assert grade_group(insertion, texts, limits=QUICK) == grades  # the same group, the same grades
    assert grade_group(insertion, []) == []


def test_a_whole_submission_is_scored_with_every_reply_read_back() -> None:
    """128 groups of 8: more output than the sandbox's default 8192 characters. Read back at that, the
    ready line was cut (a GraderFault for every node) or, at 32 groups, the replies after the cut (the
    answer there scored 0)."""
    tasks = family_tasks("chain_sum", CHAIN_CONFIG, 11, 128)
    groups = [(task, [f"<answer>{parse_target(task).answer}</answer>"] * 7 + ["<answer>x</answer>"])
              for task in tasks]
    answers = [(k, parse_target(task), task, "x") for k, (task, _) in enumerate(groups)]
    assert score_output_chars(answers) > SandboxLimits().max_output_chars
    grades = grade_groups(groups)
    assert [[g.reward for g in group] for group in grades] == [[1.0] * 7 + [0.0]] * len(tasks)


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_a_submissions_groups_are_scored_together_and_in_order(chain: list[Task]) -> None:
    right = [f"<answer>{parse_target(task).answer}</answer>" for task in chain[:3]]
    groups = [
        (chain[0], [right[0], "<answer>[x for x in iter(int, 1)]</answer>", right[0]]),  # chain_sum parses
        (chain[1], ["no tags", right[1]]),
        (chain[2], [right[2], right[0]]),  # chain[0]'s answer to chain[2]: scored against chain[2]'s entry
    ]
    grades = grade_groups(groups, limits=QUICK)
    assert [[g.reward for g in group] for group in grades] == [[1.0, 0.0, 1.0], [0.0, 1.0], [1.0, 0.0]]
    assert [grade_group(task, texts, limits=QUICK) for task, texts in groups] == grades


@pytest.mark.slow  # sandbox runs: the fast set keeps one of each kind of check
def test_a_scorer_that_raises_gives_0_naming_the_exception() -> None:
    task = family_tasks("prime_factorization", {}, 1, 1)[0]  # its scorer raises ValueError on "x"
    assert grade(task, "<answer>x</answer>") == Grade(0.0, "the scorer raised ValueError")


@pytest.mark.slow  # a sandbox run per example
@settings(max_examples=6, deadline=None)
@given(text=st.text(max_size=60), which=st.booleans())
def test_grading_never_raises_and_stays_in_0_1(chain: list[Task], insertion: Task, text: str,
                                               which: bool) -> None:
    task = chain[3] if which else insertion
    reward = grade(task, f"<answer>{text}</answer>").reward
    assert 0.0 <= reward <= 1.0


# ---------------------------------------------------------------------------- extraction (pure)


@settings(max_examples=300, deadline=None)  # the first example imports the library
@given(st.lists(st.sampled_from(["<answer>", "</answer>", " ", "\n", "a", "1", "<", "answer>", "\u2003"]),
                max_size=14).map("".join))
def test_extraction_is_the_librarys(text: str) -> None:
    from reasoning_gym.utils import extract_answer as library_extract

    assert extract_answer(text) == library_extract(text)


def test_extraction_is_linear_in_unclosed_tags() -> None:
    assert extract_answer("<answer>" * 200_000 + "</answer>") == "<answer>" * 199_999
    assert extract_answer("<answer>" * 200_000) is None


def test_a_family_entry_round_trips_through_its_target() -> None:
    entry = FamilyEntry(VERSION, "chain_sum", {"b": [1, 2], "a": "ü"}, 3, 10, 9, None)
    task = Task(KIND, "q", family_target(entry))
    assert task.target.startswith('{"answer":null,"config":{"a":"ü","b":[1,2]},')
    assert parse_target(task) == entry
    assert reference_completion(task) == ""
