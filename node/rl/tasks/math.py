"""Math tasks: the completion's last `\\boxed{...}` is graded against the target answer.

Grading, cheapest first:
1. normalised strings equal (spaces, `\\left`/`\\right`, `$`, `\\text{}`, degree signs ... removed);
2. both sides are rational arithmetic (`1/2`, `0.5`, `\\frac{3}{6}`, `2^{-1}`): exact `Fraction` comparison,
   evaluated by walking a Python AST of whitelisted nodes, never by eval;
3. otherwise, when both sides convert to a whitelisted expression (digits, + - * / ^, parentheses,
   implicit multiplication, `\\frac`, `\\sqrt`, `\\pi`, `e`, single-letter variables), both are
   evaluated with mpmath at `PRECISION_BITS` at `POINTS` points (each variable's value at each derived
   from a hash of the target) and compared to a relative `TOLERANCE_BITS`. Equal at every point where
   both are defined (at least one) means equivalent.
Not handled (graded by string equality only): tuples, intervals, sets, matrices, units, text answers.

Bounded and deterministic, because validators recompute the reward and must get the worker's exactly:
the answer's length is checked before any parsing (`MAX_RAW_ANSWER_CHARS`, then `MAX_ANSWER_CHARS` once
normalised), a decimal exponent is refused before its power is built (`MAX_DECIMAL_EXPONENT`: the
`1e29999999` that took Fraction 33 s), exact values stop at `MAX_VALUE_BITS`, and a numeric value at
`MAX_MAGNITUDE_BITS` (a power is refused from its estimated size before it is computed). So the work per
answer is bounded by its length: a few hundred operations on numbers of bounded size, milliseconds. An
answer past a bound is a wrong answer (reward 0, "beyond the grader's bounds"): no clock decides a reward.
(Step 3 was sympy's `simplify` in a subprocess under a wall-time limit: a second per call, and a reward
that depended on the machine's speed.) mpmath is integer arithmetic with correctly rounded basic
operations, so one version of it gives the same bits on every machine and integer backend; a private
context per call keeps it thread-safe.
"""

from __future__ import annotations

import ast
import hashlib
import re
from fractions import Fraction
from typing import Any

import mpmath

from swarmnode.node.rl.tasks.core import Grade, Task

KIND = "math"
MAX_RAW_ANSWER_CHARS = 1024  # the boxed text before normalising (regexes run on it)
MAX_ANSWER_CHARS = 256  # once normalised: bounds the parse and the number of operations
MAX_DECIMAL_EXPONENT = 1000  # |n| in a literal `de±n`
MAX_VALUE_BITS = 4096  # numerator and denominator of every exact intermediate value
MAX_MAGNITUDE_BITS = 4096  # |log2 |v|| of every numeric intermediate value
PRECISION_BITS = 192  # mpmath working precision
TOLERANCE_BITS = 128  # |a - b| <= 2^-TOLERANCE_BITS * max(1, |a|, |b|) counts as equal
POINTS = 3  # evaluation points (each variable's value at each is derived from the target, `variable_value`)
POINT_DOMAIN = b"swarmnode/math/point/v1"

_ALLOWED_NAMES = {"sqrt", "pi", "e"}
_LITERAL = re.compile(r"(\d+\.?\d*|\.\d+)(?:e([+-]?\d+))?")
_TOKEN = re.compile(r"(\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?|[a-z]+|\*\*|[-+*/()]")


class BeyondBounds(ValueError):
    """An answer whose evaluation would pass one of the grader's size bounds: graded as wrong."""


def reference_completion(target: str) -> str:
    """A completion the grader accepts for `target`: the target itself when it already boxes its answer,
    else the answer boxed (a supervised warm start on a bare `42` teaches the model to omit `\\boxed{}`,
    and then nothing it writes is graded right)."""
    return target if extract_boxed(target) is not None else f"\\boxed{{{target}}}"


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


def parse_literal(text: str) -> Fraction:
    """The exact value of a decimal literal (`12`, `0.5`, `.5`, `3e-2`); a huge exponent is refused first."""
    match = _LITERAL.fullmatch(text)
    if match is None:
        raise ValueError(f"not a decimal literal: {text[:32]!r}")
    mantissa, exponent = match.group(1), int(match.group(2) or 0)
    if abs(exponent) > MAX_DECIMAL_EXPONENT:
        raise BeyondBounds(f"decimal exponent {exponent} beyond ±{MAX_DECIMAL_EXPONENT}")
    return Fraction(mantissa) * Fraction(10) ** exponent


def explicit_products(expr: str) -> str | None:
    """`expr` with its implicit multiplications written out (`2x(x+1)` → `2*x*(x+1)`), or None.

    None when a character is not part of a token, or two numbers touch (`2.5.3`): nothing to guess.
    """
    tokens = [m.group(0) for m in _TOKEN.finditer(expr)]
    if "".join(tokens) != expr:
        return None
    out: list[str] = []
    previous = ""
    for token in tokens:
        kind = "number" if token[0].isdigit() or token[0] == "." else "name" if token.isalpha() else token
        if previous in ("number", "name", ")") and kind in ("number", "name", "("):
            if previous == kind == "number":
                return None
            if not (out[-1] == "sqrt" and kind == "("):
                out.append("*")
        out.append(token)
        previous = kind
    return "".join(out)


def _tree(expr: str) -> ast.expr | None:
    python = explicit_products(expr)
    if python is None:
        return None
    try:
        return ast.parse(python, mode="eval").body
    except (SyntaxError, RecursionError, MemoryError):
        return None


def rational_value(expr: str) -> Fraction | None:
    """Exact value of rational arithmetic (numbers, + - * /, integer powers), or None.

    BeyondBounds when a value would pass `MAX_VALUE_BITS` (checked before a power is computed).
    """
    tree = _tree(expr)
    if tree is None:
        return None
    try:
        return _rational(tree, explicit_products(expr) or "")
    except ZeroDivisionError:
        return None


def _is_number(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _fits(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_VALUE_BITS:
        raise BeyondBounds(f"an exact value needs more than {MAX_VALUE_BITS} bits")
    return value


def _rational(node: ast.expr, src: str) -> Fraction | None:
    if _is_number(node):
        return _fits(parse_literal(ast.get_source_segment(src, node) or ""))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        v = _rational(node.operand, src)
        return None if v is None else (v if isinstance(node.op, ast.UAdd) else -v)
    if not isinstance(node, ast.BinOp):
        return None
    a, b = _rational(node.left, src), _rational(node.right, src)
    if a is None or b is None:
        return None
    if isinstance(node.op, ast.Add):
        return _fits(a + b)
    if isinstance(node.op, ast.Sub):
        return _fits(a - b)
    if isinstance(node.op, ast.Mult):
        return _fits(a * b)
    if isinstance(node.op, ast.Div):
        return _fits(a / b)
    if isinstance(node.op, ast.Pow) and b.denominator == 1:
        bits = max(a.numerator.bit_length(), a.denominator.bit_length())
        if abs(a) != 1 and (bits - 1) * abs(b.numerator) > MAX_VALUE_BITS:
            raise BeyondBounds(f"a power needs more than {MAX_VALUE_BITS} bits")
        return _fits(a**b.numerator)
    return None


class _Undefined(ArithmeticError):
    """The expression has no value at this point (a division by zero)."""


def variable_value(target: str, letter: str, point: int) -> Fraction:
    """The value of variable `letter` at evaluation point `point`: in [-2, 2), from a hash of the target.

    Derived, not fixed, so that no answer is built to agree with a target at known points.
    """
    seed = POINT_DOMAIN + target.encode() + b"/" + letter.encode() + point.to_bytes(4, "big")
    h = int.from_bytes(hashlib.sha256(seed).digest()[:8], "big")
    return Fraction(h, 2**62) - 2


def _numeric(node: ast.expr, src: str, ctx: Any, env: dict[str, Any]) -> Any:
    """The value of a whitelisted expression tree in the mpmath context `ctx`, bounded in magnitude."""
    if _is_number(node):
        value = parse_literal(ast.get_source_segment(src, node) or "")
        return _magnitude(ctx, ctx.mpf(value.numerator) / value.denominator)
    if isinstance(node, ast.Name) and (node.id in ("pi", "e") or len(node.id) == 1):
        return ctx.pi if node.id == "pi" else ctx.e if node.id == "e" else env[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        v = _numeric(node.operand, src, ctx, env)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sqrt":
        if len(node.args) != 1 or node.keywords:
            raise ValueError("sqrt takes one argument")
        return ctx.sqrt(_numeric(node.args[0], src, ctx, env))
    if not isinstance(node, ast.BinOp):
        raise ValueError(f"{type(node).__name__} is not allowed in an answer")
    a, b = _numeric(node.left, src, ctx, env), _numeric(node.right, src, ctx, env)
    if isinstance(node.op, ast.Add):
        return _magnitude(ctx, a + b)
    if isinstance(node.op, ast.Sub):
        return _magnitude(ctx, a - b)
    if isinstance(node.op, ast.Mult):
        return _magnitude(ctx, a * b)
    if isinstance(node.op, ast.Div):
        if b == 0:
            raise _Undefined("division by zero")
        return _magnitude(ctx, a / b)
    if isinstance(node.op, ast.Pow):
        return _power(ctx, a, b)
    raise ValueError(f"{type(node.op).__name__} is not allowed in an answer")


def _power(ctx: Any, a: Any, b: Any) -> Any:
    """a ** b (principal branch), refused from the size of b·log(a) before anything large is computed."""
    if a == 0:
        if ctx.re(b) > 0:
            return ctx.mpf(0)
        raise _Undefined("zero to a power that is not positive")
    exponent = b * ctx.log(a)
    if exponent != 0 and ctx.mag(exponent) > 12:  # |b·ln a| >= 4096: |a^b| or its angle out of bounds
        raise BeyondBounds(f"a power beyond 2^±{MAX_MAGNITUDE_BITS}")
    return _magnitude(ctx, ctx.power(a, b))


def _magnitude(ctx: Any, value: Any) -> Any:
    if value != 0 and abs(ctx.mag(value)) > MAX_MAGNITUDE_BITS:
        raise BeyondBounds(f"a value beyond 2^±{MAX_MAGNITUDE_BITS}")
    return value


def numerically_equal(a: str, b: str) -> Grade:
    """Whether two whitelisted expressions agree at every evaluation point where both are defined.

    Deterministic: exact inputs, a private mpmath context at a fixed precision, points derived from `b`
    (the target). BeyondBounds propagates (the caller grades it as wrong).
    """
    ta, tb = _tree(a), _tree(b)
    if ta is None or tb is None:
        return Grade(0.0, "different (not parseable as an expression)")
    sa, sb = explicit_products(a) or "", explicit_products(b) or ""
    names = {n.id for t in (ta, tb) for n in ast.walk(t) if isinstance(n, ast.Name)}
    letters = sorted(n for n in names if len(n) == 1 and n != "e")
    ctx = mpmath.MPContext()
    ctx.prec = PRECISION_BITS
    tolerance = ctx.ldexp(1, -TOLERANCE_BITS)
    compared = 0
    for point in range(POINTS):
        env = {}
        for letter in letters:
            value = variable_value(b, letter, point)
            env[letter] = ctx.mpf(value.numerator) / value.denominator
        try:
            va = _numeric(ta, sa, ctx, env)
        except _Undefined:
            va = None
        try:
            vb = _numeric(tb, sb, ctx, env)
        except _Undefined:
            vb = None
        if va is None and vb is None:
            continue
        if va is None or vb is None:
            return Grade(0.0, "different (defined where the target is not, or the reverse)")
        if abs(va - vb) > tolerance * max(1, abs(va), abs(vb)):
            return Grade(0.0, "not equivalent (numeric)")
        compared += 1
    if compared == 0:
        return Grade(0.0, "undefined at every evaluation point")
    return Grade(1.0, "equivalent (numeric)")


def answers_match(answer: str, target: str) -> Grade:
    """Compare a model's answer with the reference answer, cheapest test first; bounded (module doc)."""
    if len(answer) > MAX_RAW_ANSWER_CHARS:
        return Grade(0.0, "answer too long")
    a, b = normalize(answer), normalize(target)
    if len(a) > MAX_ANSWER_CHARS:
        return Grade(0.0, "answer too long")
    if a == b:
        return Grade(1.0, "equal")
    ea, eb = latex_to_expr(a), latex_to_expr(b)
    if ea is None or eb is None:
        return Grade(0.0, "different (not parseable as an expression)")
    try:
        ra, rb = rational_value(ea), rational_value(eb)
        if ra is not None and rb is not None:
            return Grade(1.0, "equal value") if ra == rb else Grade(0.0, "different value")
        return numerically_equal(ea, eb)
    except BeyondBounds as exc:
        return Grade(0.0, f"beyond the grader's bounds: {exc}")
    except (ValueError, KeyError, RecursionError):
        return Grade(0.0, "different (not an expression the grader evaluates)")


def grade(task: Task, completion: str) -> Grade:
    """1.0 when the last `\\boxed{}` of the completion is equivalent to the task's target."""
    answer = extract_boxed(completion)
    if answer is None:
        return Grade(0.0, "no \\boxed{} answer")
    target = extract_boxed(task.target) or task.target
    return answers_match(answer, target)
