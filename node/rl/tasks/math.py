"""Math tasks: the completion's last `\\boxed{...}` is graded against the target answer.

Grading, cheapest first:
1. normalised strings equal (spaces, `\\left`/`\\right`, `$`, `\\text{}`, degree signs ... removed);
2. both sides are rational arithmetic (`1/2`, `0.5`, `\\frac{3}{6}`, `2^{-1}`): exact `Fraction` comparison,
   evaluated by walking a Python AST of whitelisted nodes, never by eval;
3. otherwise, when both sides convert to a whitelisted sympy expression (digits, + - * / ^, parentheses,
   `\\frac`, `\\sqrt`, `\\pi`, single-letter variables), `simplify(a - b) == 0` runs in the code sandbox's
   subprocess under a wall-time and memory limit, because sympy can take unbounded time (or memory) on
   adversarial input and a thread cannot be interrupted. That costs a Python start plus a sympy import
   (about a second), so it only runs when 1 and 2 cannot decide.
Not handled (graded by string equality only): tuples, intervals, sets, matrices, units, text answers.
"""

from __future__ import annotations

import ast
import json
import re
from fractions import Fraction

from node.rl.tasks.code import Outcome, SandboxLimits, run_python
from node.rl.tasks.core import Grade, Task

KIND = "math"
MAX_ANSWER_CHARS = 256
MAX_POW_BITS = 4096
SYMPY_LIMITS = SandboxLimits(wall_time_s=8.0, cpu_time_s=5, memory_bytes=1 << 30)

_SYMPY_SCRIPT = r"""
import json, sys
from sympy import E, simplify
from sympy.parsing.sympy_parser import implicit_multiplication, parse_expr, standard_transformations
a, b = json.loads(sys.stdin.read())
t = standard_transformations + (implicit_multiplication,)
x, y = (parse_expr(s, transformations=t, local_dict={"e": E}) for s in (a, b))
print("equal" if simplify(x - y) == 0 else "different")
"""

_ALLOWED_NAMES = {"sqrt", "pi", "e"}


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces matched), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = start + len("\\boxed")
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    group = _brace_group(text, i)
    return group[0] if group else None


def _brace_group(text: str, i: int) -> tuple[str, int] | None:
    """(content, index after the closing brace) of the brace group opening at text[i], or None."""
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j], j + 1
    return None


def normalize(answer: str) -> str:
    """Strip presentation-only LaTeX so equal answers compare equal as strings."""
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", answer.strip())
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    for junk in ("^{\\circ}", "^\\circ", "\\!", "\\,", "\\;", "\\:", "\\ ", "$", "\\%", "%"):
        s = s.replace(junk, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"^[a-zA-Z]=", "", s)  # "x=5" -> "5"
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def latex_to_expr(s: str) -> str | None:
    """A sympy/Python expression for a whitelisted LaTeX subset, or None if anything else appears."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("\\frac", i) or s.startswith("\\sqrt", i):
            cmd, i = s[i + 1 : i + 5], i + 5
            root = None
            if cmd == "sqrt" and s.startswith("[", i):
                end = s.find("]", i)
                if end < 0:
                    return None
                root, i = latex_to_expr(s[i + 1 : end]), end + 1
            args = []
            for _ in range(2 if cmd == "frac" else 1):
                arg, i = _argument(s, i)
                if arg is None:
                    return None
                args.append(arg)
            if cmd == "frac":
                out.append(f"(({args[0]})/({args[1]}))")
            elif root is not None:
                out.append(f"(({args[0]})**(1/({root})))")
            else:
                out.append(f"sqrt({args[0]})")
        elif s.startswith("\\pi", i):
            out.append("pi")
            i += 3
        elif s.startswith("\\cdot", i) or s.startswith("\\times", i):
            out.append("*")
            i += 5 if s.startswith("\\cdot", i) else 6
        elif s[i] == "\\":
            return None
        else:
            out.append({"^": "**", "{": "(", "}": ")"}.get(s[i], s[i]))
            i += 1
    expr = "".join(out)
    if not re.fullmatch(r"[0-9a-z+\-*/().]*", expr) or not expr:
        return None
    if any(len(w) > 1 and w not in _ALLOWED_NAMES for w in re.findall(r"[a-z]+", expr)):
        return None
    return expr


def _argument(s: str, i: int) -> tuple[str | None, int]:
    """One LaTeX command argument at s[i]: a brace group (converted) or a single character."""
    if i >= len(s):
        return None, i
    if s[i] == "{":
        group = _brace_group(s, i)
        if group is None:
            return None, i
        return latex_to_expr(group[0]), group[1]
    return latex_to_expr(s[i]), i + 1


def rational_value(expr: str) -> Fraction | None:
    """Exact value of rational arithmetic (numbers, + - * /, integer powers), or None."""
    try:
        tree = ast.parse(expr, mode="eval")
        return _rational(tree.body, expr)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError):
        return None


def _rational(node: ast.AST, src: str) -> Fraction | None:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return Fraction(ast.get_source_segment(src, node) or "")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        v = _rational(node.operand, src)
        return None if v is None else (v if isinstance(node.op, ast.UAdd) else -v)
    if not isinstance(node, ast.BinOp):
        return None
    a, b = _rational(node.left, src), _rational(node.right, src)
    if a is None or b is None:
        return None
    if isinstance(node.op, ast.Add):
        return a + b
    if isinstance(node.op, ast.Sub):
        return a - b
    if isinstance(node.op, ast.Mult):
        return a * b
    if isinstance(node.op, ast.Div):
        return a / b
    if isinstance(node.op, ast.Pow) and b.denominator == 1:
        bits = max(a.numerator.bit_length(), a.denominator.bit_length())
        return a ** int(b) if bits * abs(int(b)) <= MAX_POW_BITS else None
    return None


def sympy_equal(a: str, b: str, limits: SandboxLimits = SYMPY_LIMITS) -> Grade:
    """Symbolic equivalence of two whitelisted expressions, decided by sympy in the sandbox."""
    result = run_python(_SYMPY_SCRIPT, stdin=json.dumps([a, b]), limits=limits)
    verdict = result.stdout.strip()
    if result.outcome is Outcome.OK and verdict == "equal":
        return Grade(1.0, "equivalent (sympy)")
    if result.outcome is Outcome.OK:
        return Grade(0.0, "not equivalent (sympy)")
    return Grade(0.0, f"sympy check {result.outcome.value}")


def answers_match(answer: str, target: str) -> Grade:
    """Compare a model's answer with the reference answer, cheapest test first."""
    a, b = normalize(answer), normalize(target)
    if len(a) > MAX_ANSWER_CHARS:
        return Grade(0.0, "answer too long")
    if a == b:
        return Grade(1.0, "equal")
    ea, eb = latex_to_expr(a), latex_to_expr(b)
    if ea is None or eb is None:
        return Grade(0.0, "different (not parseable as an expression)")
    ra, rb = rational_value(ea), rational_value(eb)
    if ra is not None and rb is not None:
        return Grade(1.0, "equal value") if ra == rb else Grade(0.0, "different value")
    return sympy_equal(ea, eb)


def grade(task: Task, completion: str) -> Grade:
    """1.0 when the last `\\boxed{}` of the completion is equivalent to the task's target."""
    answer = extract_boxed(completion)
    if answer is None:
        return Grade(0.0, "no \\boxed{} answer")
    target = extract_boxed(task.target) or task.target
    return answers_match(answer, target)
