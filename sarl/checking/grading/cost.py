"""The pre-parse cost estimate of an answer: read its LaTeX once, before sympy builds or evaluates anything.

A short answer can ask sympy for an astronomically large number (`9^{9^{9^9}}`, `((100!)!)!`,
`\\binom{10^9}{10^5}`) — built by CPython's big-integer arithmetic in C, which no signal interrupts — or for
slow symbolic work (`(x+1)^{1000}` against another form, `\\int`, `\\lim`, sums over 10^12 terms, deep
`\\left(` nesting that math-verify's parser reads slowly). `estimate_cost` walks the answer's tokens and bounds
the decimal digits of every number it denotes (log10 of an upper bound of its magnitude, symbols counted as
1), and reports:

- `HOPELESS`: some number would have more than `HOPELESS_DIGITS` digits; the answer never reaches sympy.
- `EXPENSIVE`: a feature whose cost sympy cannot bound cheaply; the check runs under the grading budget.
- `ORDINARY`: everything else (every gold answer of the benchmarks, docs/grading.md).

The walk is linear in the answer's length (at most `MAX_ANSWER_CHARS` characters reach it) and evaluates
nothing: it reads digits and counts, with magnitudes kept as floats (`inf` past overflow).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

ORDINARY, EXPENSIVE, HOPELESS = 0, 1, 2
HOPELESS_DIGITS = 10_000  # a number over 10^10000: sympy would build it in C, uninterruptibly
EXPENSIVE_DIGITS = 1_000  # a number over 10^1000 (2^{2014} has 607 digits and stays ordinary)
MAX_SYMBOLIC_EXPONENT = 30  # x^{31}, (x+1)^{31} and beyond: sympy expands or evaluates them slowly
MAX_TERMS = 1_000  # \sum / \prod over more terms is expensive
HOPELESS_TERMS = 1_000_000  # ... and over more than this, hopeless (sympy may add them in C-sized steps)
MAX_EXPANDED_TERMS = 30  # (x+y+z)^{10} expands to 66 terms (0.2 s against a number)
MAX_FUNCTION_ARGUMENT_DIGITS = 15  # \sin(10^{100}) needs 100 digits of working precision
MAX_NESTING = 3  # \sqrt in \sqrt ..., \left( in \left( ...: deeper is expensive
MAX_DEPTH = 40  # groups nested deeper are expensive; the walk reads them flat

_TOKEN = re.compile(r"\\[a-zA-Z]+|\\.|\s+|.", re.DOTALL)
_DERIVATIVE = re.compile(r"\\frac\s*\{\s*d(?:\s*\^|[a-zA-Z]?\s*\}\s*\{\s*d)")  # \frac{d}{dx}, \frac{d^2y}{dx^2}
_CALCULUS = {"\\int", "\\iint", "\\iiint", "\\oint", "\\lim", "\\partial", "\\nabla", "\\limsup", "\\liminf"}
_BIG_OPERATORS = {"\\sum", "\\prod"}
_FACTORIALS = {"\\Gamma"}  # \Gamma(n) = (n-1)!
_FUNCTIONS = {"\\sin", "\\cos", "\\tan", "\\cot", "\\sec", "\\csc", "\\exp", "\\sinh", "\\cosh", "\\tanh"}
_DIGITS = frozenset("0123456789")
_OPERATORS = {"\\cdot", "\\times", "\\div", "\\circ", "\\infty", "\\mod", "\\bmod", "\\pmod", "\\quad"}
_OPENERS = {"{": "}", "(": ")", "[": "]"}
_CLOSERS = {"}", ")", "]"}
_TEXT_COMMANDS = {"\\text", "\\mbox", "\\textbf", "\\textrm", "\\mathrm", "\\operatorname", "\\mathbf"}


@dataclass(frozen=True)
class Cost:
    """`level` (ORDINARY, EXPENSIVE or HOPELESS) and the reason for the first feature at that level."""

    level: int
    reason: str = ""


class _Walk:
    """One pass over the tokens; `digits` of a value is log10 of an upper bound of its magnitude."""

    def __init__(self, text: str) -> None:
        self.tokens = [t for t in _TOKEN.findall(text) if not t.isspace()]
        self.i = 0
        self.level, self.reason = ORDINARY, ""
        self.nesting = {"\\sqrt": 0, "\\left": 0}
        self.exponents = 0  # how many ^ enclose the token being read
        self.last_terms = 1  # terms of the group read last (1 after any other operand)

    def flag(self, level: int, reason: str) -> None:
        if level > self.level:
            self.level, self.reason = level, reason

    def peek(self) -> str:
        return self.tokens[self.i] if self.i < len(self.tokens) else ""

    def next(self) -> str:
        token = self.peek()
        self.i += 1
        return token

    def number(self, digits: float, what: str) -> float:
        if digits > HOPELESS_DIGITS:
            self.flag(HOPELESS, f"{what} has over {HOPELESS_DIGITS} digits")
        elif digits > EXPENSIVE_DIGITS:
            self.flag(EXPENSIVE, f"{what} has over {EXPENSIVE_DIGITS} digits")
        return digits

    # -- grammar: sequence (separators) > product (juxtaposition) > power (^, !) > atom --------------------

    def sequence(self, depth: int, closers: frozenset[str] = frozenset()) -> tuple[float, bool]:
        """Terms up to a closer (not consumed): the largest term's digits plus log10 of the count."""
        digits, symbolic, terms = 0.0, False, 0
        while self.peek() and self.peek() not in closers and self.level < HOPELESS:
            if self.peek() in _CLOSERS or self.peek() in ("\\right", "\\end"):
                if not closers:  # a stray closer at the top level (a half-open interval's ")")
                    self.next()
                    continue
                break
            d, s = self.product(depth, closers)
            digits, symbolic, terms = max(digits, d), symbolic or s, terms + 1
        self.last_terms = max(terms, 1)
        return digits + math.log10(max(terms, 1)), symbolic

    def product(self, depth: int, closers: frozenset[str]) -> tuple[float, bool]:
        digits, symbolic = 0.0, False
        while self.peek() and self.peek() not in closers and self.level < HOPELESS:
            token = self.peek()
            if token in ("+", "-", "=", "<", ">", ",", ";", "&", "\\\\", "\\pm", "\\mp", "\\le", "\\ge", "\\leq"):
                self.next()
                break
            if token in _CLOSERS or token in ("\\right", "\\end"):
                break
            d, s = self.power(depth)
            digits, symbolic = digits + d, symbolic or s
        return self.number(digits, "a product"), symbolic

    def power(self, depth: int) -> tuple[float, bool]:
        digits, symbolic = self.atom(depth)
        base_terms = self.last_terms  # > 1: a parenthesised sum
        while self.level < HOPELESS:
            if self.peek() == "!":
                self.next()
                if self.peek() == "!":  # n!! is at most n!
                    self.next()
                digits = self.factorial(digits)
            elif self.peek() == "^":
                self.next()
                self.exponents += 1
                e_digits, e_symbolic = self.atom(depth + 1, exponent=True)
                if (symbolic or e_symbolic) and self.exponents > MAX_NESTING - 1:
                    self.flag(EXPENSIVE, f"a tower of over {MAX_NESTING} symbolic powers")
                self.exponents -= 1
                if (
                    symbolic
                    and base_terms > 1
                    and _log10_multisets(base_terms, e_digits) > math.log10(MAX_EXPANDED_TERMS)
                ):
                    self.flag(EXPENSIVE, f"a power that expands to over {MAX_EXPANDED_TERMS} terms")
                digits, symbolic = self.raise_to(digits, symbolic, e_digits), symbolic or e_symbolic
                base_terms = 1
            elif self.peek() == "_":
                self.next()
                self.atom(depth + 1, exponent=True)  # an index: its size costs nothing
            else:
                return digits, symbolic
        return digits, symbolic

    def raise_to(self, base: float, base_symbolic: bool, exponent: float) -> float:
        if base_symbolic and exponent > math.log10(MAX_SYMBOLIC_EXPONENT):
            self.flag(EXPENSIVE, f"a symbolic power with an exponent over {MAX_SYMBOLIC_EXPONENT}")
        value = _pow10(exponent)  # the exponent's magnitude
        return self.number(base * value if base > 0 else 0.0, "a power")

    def factorial(self, digits: float) -> float:
        n = _pow10(digits)
        return self.number(n * digits if n > 1 else 0.0, "a factorial")  # log10(n!) <= n log10(n)

    def atom(self, depth: int, exponent: bool = False) -> tuple[float, bool]:
        """One operand; `exponent`: after ^ or _, where an ungrouped operand is one character."""
        if depth > MAX_DEPTH:
            self.flag(EXPENSIVE, f"groups nested over {MAX_DEPTH} deep")
            self.next()
            return 0.0, False
        token = self.next()
        self.last_terms = 1
        if token in _DIGITS or token == ".":
            if exponent:
                return math.log10(int(token)) if token in _DIGITS and token != "0" else 0.0, False
            text = token
            while self.peek() in _DIGITS or self.peek() == ".":
                text += self.next()
            whole = text.split(".")[0].lstrip("0")
            fraction = "." in text.strip(".") or text.startswith(".")  # 1.5 < 2: round the bound up
            digits = len(whole) if len(whole) > 15 else math.log10(max(int(whole or "0") + fraction, 1))
            return self.number(digits, "a literal"), False
        if exponent and token.isalpha():
            return 0.0, True
        if token in _OPENERS or token == "\\left":
            return self.group(token, depth)
        if token == "\\begin":
            self.group(self.next(), depth)  # {pmatrix}
            digits, symbolic = self.sequence(depth + 1, frozenset({"\\end"}))
            if self.next() == "\\end":
                self.group(self.next(), depth)
            return digits, symbolic
        if token in ("\\frac", "\\binom", "\\dbinom", "\\tbinom", "\\cfrac"):
            top, s1 = self.atom(depth + 1)
            bottom, s2 = self.atom(depth + 1)
            if token == "\\frac" or token == "\\cfrac":
                return self.number(top + bottom, "a fraction"), s1 or s2
            n, k = _pow10(top), _pow10(bottom)
            return self.number(min(k * top, 0.302 * n), "a binomial coefficient"), s1 or s2
        if token == "\\sqrt":
            if self.peek() == "[" and self.group(self.next(), depth)[0] > math.log10(MAX_SYMBOLIC_EXPONENT):
                self.flag(EXPENSIVE, f"a root of an index over {MAX_SYMBOLIC_EXPONENT}")
            return self.nested(token, depth)
        if token in _BIG_OPERATORS:
            return self.big_operator(token, depth)
        if token in _CALCULUS:
            self.flag(EXPENSIVE, f"{token} asks sympy to compute")
            return 0.0, True
        if token in _FACTORIALS:
            digits, symbolic = self.atom(depth + 1)
            return self.factorial(digits), symbolic
        if token in _FUNCTIONS:
            digits, symbolic = self.power(depth + 1)
            if digits > MAX_FUNCTION_ARGUMENT_DIGITS:
                self.flag(EXPENSIVE, f"{token} of a number over 10^{MAX_FUNCTION_ARGUMENT_DIGITS}")
            return 0.0, True
        if token in _TEXT_COMMANDS:
            if self.peek() == "{":
                self.skip_group()
            return 0.0, True
        if token.isalpha() or token.startswith("\\") and token[1:].isalpha() and token not in _OPERATORS:
            return 0.0, True  # a letter, a constant (\pi) or a function name
        return 0.0, False  # an operator or punctuation

    def group(self, opener: str, depth: int) -> tuple[float, bool]:
        if opener == "\\left":
            self.next()  # the delimiter
            self.nesting["\\left"] += 1
            if self.nesting["\\left"] > MAX_NESTING:
                self.flag(EXPENSIVE, f"\\left nested over {MAX_NESTING} deep")
            digits, symbolic = self.sequence(depth + 1, frozenset({"\\right"}))
            self.nesting["\\left"] -= 1
            if self.next() == "\\right":
                self.next()
            return digits, symbolic
        digits, symbolic = self.sequence(depth + 1, frozenset(_CLOSERS) if opener != "{" else frozenset({"}"}))
        self.next()
        return digits, symbolic

    def nested(self, command: str, depth: int) -> tuple[float, bool]:
        self.nesting[command] += 1
        if self.nesting[command] > MAX_NESTING:
            self.flag(EXPENSIVE, f"{command} nested over {MAX_NESTING} deep")
        result = self.atom(depth + 1)
        self.nesting[command] -= 1
        return result

    def big_operator(self, token: str, depth: int) -> tuple[float, bool]:
        terms = 0.0
        while self.peek() in ("_", "^"):
            limit = self.next()
            digits, _ = self.atom(depth + 1, exponent=True)
            terms = digits if limit == "^" else terms
        if _pow10(terms) > HOPELESS_TERMS:
            self.flag(HOPELESS, f"{token} over more than {HOPELESS_TERMS} terms")
        elif _pow10(terms) > MAX_TERMS:
            self.flag(EXPENSIVE, f"{token} over more than {MAX_TERMS} terms")
        digits, symbolic = self.power(depth + 1)
        return self.number(digits + terms, f"a {token[1:]}"), True

    def skip_group(self) -> None:
        depth = 0
        while self.peek():
            token = self.next()
            depth += token == "{"
            depth -= token == "}"
            if depth == 0:
                return


def _log10_multisets(terms: int, exponent_digits: float) -> float:
    """log10 of the number of terms of (a_1 + ... + a_terms)^n, n = 10^exponent_digits: C(n + terms - 1, n)."""
    n = _pow10(exponent_digits)
    if n > 1e12:
        return math.inf
    return (math.lgamma(n + terms) - math.lgamma(n + 1) - math.lgamma(terms)) / math.log(10)


def _pow10(digits: float) -> float:
    return math.inf if digits > 300 else 10.0**digits


def estimate_cost(answer: str) -> Cost:
    """The cost class of a (normalised) answer, and why."""
    walk = _Walk(answer)
    if _DERIVATIVE.search(answer):
        walk.flag(EXPENSIVE, "a derivative asks sympy to compute")
    try:
        walk.sequence(0)
    except RecursionError:  # not reached: the walk stops descending at MAX_DEPTH
        walk.flag(EXPENSIVE, "groups nested too deep to read")
    return Cost(walk.level, walk.reason)
