"""Code tasks: run the completion against the task's tests in the sandbox; reward 1 iff they pass.

Rewards are recomputed by validators, so what decides one must not depend on the machine:
- deterministic bounds give a reward of 0: the program's own failure, a budget of `LINE_BUDGET` executed
  Python lines (a trace function in the sandbox counts them and exits with `BUDGET_EXIT`: an endless loop
  ends there, the same on every machine running the same Python), the output cap (RLIMIT_FSIZE), the
  scratch directory's size and the process count (a write or fork past them fails in the program);
- machine-dependent bounds are only a safety net: wall time, CPU time, memory (RLIMIT_AS, the cgroup) or a
  signal end the run with `GraderFault`, which is no verdict on the answer (a validator quarantines the
  item, a worker does not submit it). The net is set well above what the line budget costs (`CODE_LIMITS`:
  about 0.15 s per million lines here, 5 s of CPU), so only work the trace cannot see reaches it (long C
  calls like `2**10**10`, a program that turns the trace off).

The program is hostile: a worker chose its tokens, a run's owner wrote the tests. It runs only in
`swarmnode.node.sandbox` (no host file, network, process or secret of the node is reachable from it), and a
validator runs it only after the model checks showed the tokens are the model's own (spec/validation.md).
"""

from __future__ import annotations

import re

from swarmnode.node.rl.tasks.core import Grade, GraderFault, Task
from swarmnode.node.sandbox import Outcome, RunResult, SandboxLimits, run_python
from swarmnode.node.sandbox.launcher import BUDGET_EXIT

KIND = "code"
LINE_BUDGET = 5_000_000  # Python lines the sandbox lets a graded program execute (deterministic bound)
CODE_LIMITS = SandboxLimits(wall_time_s=10.0, cpu_time_s=5, line_budget=LINE_BUDGET)  # what grading uses

__all__ = ["BUDGET_EXIT", "CODE_LIMITS", "KIND", "LINE_BUDGET", "Outcome", "RunResult", "SandboxLimits",
           "extract_code", "grade", "program_text", "run_python"]


def extract_code(completion: str) -> str:
    """The last fenced code block of a completion (```python ... ```), or the whole text without fences."""
    blocks = re.findall(r"```[a-zA-Z0-9_+-]*\n(.*?)```", completion, flags=re.DOTALL)
    return blocks[-1] if blocks else completion


def program_text(task: Task, code: str) -> str:
    """What runs for a code task: the completion's code, a blank line, then the task's tests."""
    return code + "\n\n" + task.target + "\n"


MACHINE_BOUND = (Outcome.TIMEOUT, Outcome.MEMORY, Outcome.KILLED)  # outcomes no reward may follow from


def grade(task: Task, completion: str, limits: SandboxLimits = CODE_LIMITS) -> Grade:
    """1.0 iff the completion's code followed by the task's tests (`target`) exits 0 in the sandbox.

    GraderFault when the run hit a machine-dependent limit (module docstring).
    """
    code = extract_code(completion)
    if not code.strip():
        return Grade(0.0, "empty answer")
    result = run_python(program_text(task, code), limits=limits)
    if result.outcome is Outcome.OK:
        return Grade(1.0, "tests passed")
    last = result.stderr.strip().splitlines()[-1:]
    reason = result.outcome.value + (f": {last[0][:120]}" if last else "")
    if result.outcome in MACHINE_BOUND:  # the outcome only: the program's output stays in this node
        raise GraderFault(f"the code sandbox stopped on a machine-dependent limit ({result.outcome.value})")
    return Grade(0.0, reason)
