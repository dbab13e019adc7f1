"""Exact columnar enumeration of every solution of a finite integer constraint system.

The reference tool enumerates Z3 models one at a time, adding a blocking clause after each (each
`check()` re-solves a growing formula). Here Z3 only *parses and represents* the constraints; the
solution set is built column by column with numpy:

1. Interval propagation (HC4-style narrowing over the Z3 AST) gives every variable a finite,
   sound range: values outside it cannot occur in any solution.
2. Variables are assigned one at a time. The table of partial assignments is extended by the
   cartesian product with the next variable's range (or a computed column when an assertion
   `v == f(assigned)` defines it), then filtered by every assertion whose variables are now all
   assigned, translated from the Z3 AST into vectorised numpy expressions.
3. The extension is depth-first over row chunks, so peak memory is bounded by `chunk_rows` times
   the largest range, whatever the number of solutions.

The result is exactly the solution set of the assertions projected on the requested variables,
in a deterministic order (lexicographic in the chosen variable order). `enumerate_blocking` is
the reference blocking-clause enumeration, kept for tests and `benchmarks/enumeration_speed.py`.

Semantics follow SMT-LIB integers: `div`/`mod` are Euclidean. Z3 leaves division by zero
unspecified (an uninterpreted function), so a constraint whose evaluation divides by zero is
undecided: the row is kept, flagged, and every flagged complete solution is checked by Z3 with all
variables fixed. The result is exact either way; `ConstraintSystem.exact` says whether
propagation proved every divisor nonzero (then no row is ever flagged).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatchtune.errors import DispatchTuneError

if TYPE_CHECKING:
    import z3

Columns = dict[str, np.ndarray]
Interval = tuple[float, float]  # bounds may be +-inf; finite bounds are integral
_INF = math.inf

#: Largest range a variable may have after propagation (beyond it the space is not "finite").
MAX_RANGE = 1 << 22


class UnboundedError(DispatchTuneError):
    """A variable has no finite range after propagation, so it cannot be enumerated."""


# ---- the Z3 AST, compiled ----------------------------------------------------------------------
@dataclass
class _Node:
    """One Z3 expression node, compiled once (the AST is a DAG; nodes are shared by id)."""

    op: str
    args: tuple[_Node, ...] = ()
    value: int = 0  # constants
    name: str = ""  # variables
    vars: frozenset[str] = frozenset()


@dataclass
class Constraint:
    """One top-level conjunct: a boolean node and the variables it mentions."""

    node: _Node
    vars: frozenset[str]
    text: str


@dataclass
class ConstraintSystem:
    """Assertions over integer variables, ready for propagation and columnar solving."""

    constraints: list[Constraint]
    variables: tuple[str, ...]
    assertions: tuple[Any, ...] = ()
    bounds: dict[str, Interval] = field(default_factory=dict)
    definitions: dict[str, list[tuple[_Node, frozenset[str]]]] = field(default_factory=dict)
    exact: bool = True

    @classmethod
    def from_z3(cls, assertions: Sequence[z3.BoolRef]) -> ConstraintSystem:
        compiler = _Compiler()
        constraints: list[Constraint] = []
        for assertion in assertions:
            for conjunct in _flatten_and(assertion):
                node = compiler.compile(conjunct)
                constraints.append(Constraint(node, node.vars, str(conjunct)))
        names = sorted(set().union(*(c.vars for c in constraints)) if constraints else set())
        system = cls(constraints=constraints, variables=tuple(names), assertions=tuple(assertions))
        system._find_definitions()
        system.propagate()
        return system

    @classmethod
    def from_smtlib(cls, text: str) -> ConstraintSystem:
        import z3

        return cls.from_z3(list(z3.parse_smt2_string(text)))

    # ---- interval propagation ------------------------------------------------------------------
    def propagate(self, rounds: int = 50) -> None:
        """Narrow every variable's range to a sound finite interval (HC4 over all conjuncts)."""
        bounds: dict[str, Interval] = {v: (-_INF, _INF) for v in self.variables}
        for _ in range(rounds):
            before = dict(bounds)
            for constraint in self.constraints:
                _narrow_bool(constraint.node, bounds)
                for lo, hi in bounds.values():
                    if lo > hi:
                        self.bounds = bounds
                        return  # infeasible: some range is empty; solving yields nothing
            if bounds == before:
                break
        self.bounds = bounds
        self.exact = all(_divisors_nonzero(c.node, bounds) for c in self.constraints)

    def _find_definitions(self) -> None:
        """Record conjuncts `v == expr(other vars)`: v is computed, not enumerated, once known."""
        for constraint in self.constraints:
            node = constraint.node
            if node.op != "eq" or len(node.args) != 2:
                continue
            for lhs, rhs in (node.args, node.args[::-1]):
                # Only division-free expressions: their value is defined on every row.
                if lhs.op == "var" and lhs.name not in rhs.vars and not _divides(rhs):
                    self.definitions.setdefault(lhs.name, []).append((rhs, rhs.vars))

    def unbounded(self, names: Sequence[str]) -> list[str]:
        return [
            n for n in names
            if not (math.isfinite(self.bounds[n][0]) and math.isfinite(self.bounds[n][1]))
        ]

    # ---- solving -------------------------------------------------------------------------------
    def plan(self) -> list[tuple[str, _Node | None]]:
        """Order in which variables are assigned: (variable, defining expression or None).

        Greedy: a variable whose definition is computable comes first (no growth); otherwise the
        one that completes the most constraints, then the smallest range, then the name, which
        keeps filtering early and the order deterministic.
        """
        assigned: set[str] = set()
        order: list[tuple[str, _Node | None]] = []
        remaining = [c for c in self.constraints if len(c.vars) > 1]
        while len(assigned) < len(self.variables):
            pick: tuple[str, _Node | None] | None = None
            for name in self.variables:
                if name in assigned:
                    continue
                for expr, deps in self.definitions.get(name, []):
                    if deps <= assigned:
                        pick = (name, expr)
                        break
                if pick:
                    break
            if pick is None:
                best: tuple[int, float, str] | None = None
                for name in self.variables:
                    if name in assigned:
                        continue
                    with_name = assigned | {name}
                    done = sum(1 for c in remaining if name in c.vars and c.vars <= with_name)
                    lo, hi = self.bounds[name]
                    key = (-done, hi - lo, name)
                    if best is None or key < best:
                        best = key
                assert best is not None
                pick = (best[2], None)
            order.append(pick)
            assigned.add(pick[0])
        return order

    def solve(
        self,
        outputs: Sequence[str] | None = None,
        *,
        chunk_rows: int = 1 << 16,
    ) -> Iterator[Columns]:
        """Yield every solution, as column chunks of the `outputs` variables (all by default).

        Distinct solutions of the full system may coincide on `outputs`; chunks are not
        deduplicated across that projection (callers ask for a set of variables that determines
        the others, e.g. IREE's knobs).
        """
        outputs = list(outputs or self.variables)
        missing = [o for o in outputs if o not in self.bounds]
        if missing:
            raise DispatchTuneError(f"unknown variables requested: {', '.join(missing)}")
        if any(lo > hi for lo, hi in self.bounds.values()):
            return
        order = self.plan()
        if not order:
            return
        enumerated = [name for name, expr in order if expr is None]
        too_wide = self.unbounded(enumerated)
        if too_wide:
            raise UnboundedError(
                f"constraint space is not finite: no bound found for {', '.join(too_wide)}"
            )
        for name in enumerated:
            lo, hi = self.bounds[name]
            if hi - lo + 1 > MAX_RANGE:
                raise UnboundedError(f"range of {name} too large to enumerate ({lo}..{hi})")
        # Constraints become checkable at the step where their last variable is assigned.
        checks: list[list[Constraint]] = [[] for _ in order]
        position = {name: i for i, (name, _) in enumerate(order)}
        for constraint in self.constraints:
            step = max((position[v] for v in constraint.vars), default=0)
            checks[step].append(constraint)
        domains = {
            name: np.arange(int(lo), int(hi) + 1, dtype=np.int64)
            for name in enumerated
            for lo, hi in [self.bounds[name]]
        }
        start: Columns = {_UNDECIDED: np.zeros(1, dtype=bool)}
        for chunk in self._extend(start, 1, 0, order, checks, domains, chunk_rows):
            undecided = chunk.pop(_UNDECIDED)
            if undecided.any():
                chunk, _ = _select(chunk, ~undecided | self._z3_check(chunk, undecided), 0)
            if len(chunk[order[0][0]]):
                yield {name: chunk[name] for name in outputs}

    def _z3_check(self, chunk: Columns, rows: np.ndarray) -> np.ndarray:
        """Z3 verdict on complete assignments whose evaluation divided by zero."""
        import z3

        verdict = np.zeros(len(rows), dtype=bool)
        solver = z3.Solver()
        solver.add(*self.assertions)
        for i in np.flatnonzero(rows):
            fixed = [z3.Int(name) == int(chunk[name][i]) for name in self.variables]
            verdict[i] = solver.check(*fixed) == z3.sat
        return verdict

    def _extend(
        self,
        table: Columns,
        rows: int,
        step: int,
        order: list[tuple[str, _Node | None]],
        checks: list[list[Constraint]],
        domains: dict[str, np.ndarray],
        chunk_rows: int,
    ) -> Iterator[Columns]:
        if step == len(order):
            if rows:
                yield table
            return
        name, expr = order[step]
        if expr is None:
            domain = domains[name]
            if rows * len(domain) > chunk_rows and rows > 1:
                # Depth-first over row chunks keeps peak memory bounded.
                per = max(1, chunk_rows // len(domain))
                for begin in range(0, rows, per):
                    part = {k: v[begin : begin + per] for k, v in table.items()}
                    count = min(per, rows - begin)
                    yield from self._extend(part, count, step, order, checks, domains, chunk_rows)
                return
            grown = {k: np.repeat(v, len(domain)) for k, v in table.items()}
            grown[name] = np.tile(domain, rows)
            rows *= len(domain)
        else:
            grown = dict(table)
            value, ok = _eval_int(expr, grown, rows)
            grown[name] = np.array(value)
        for constraint in checks[step]:
            if not rows:
                return
            value, ok = _eval_bool(constraint.node, grown, rows)
            if ok.all():
                grown, rows = _select(grown, value, rows)
            else:
                grown[_UNDECIDED] = grown[_UNDECIDED] | ~ok
                grown, rows = _select(grown, value | ~ok, rows)
        if rows:
            yield from self._extend(grown, rows, step + 1, order, checks, domains, chunk_rows)


_UNDECIDED = "__undecided__"


def _select(table: Columns, mask: np.ndarray, rows: int) -> tuple[Columns, int]:
    if mask.all():
        return table, rows
    return {k: v[mask] for k, v in table.items()}, int(mask.sum())


# ---- Z3 AST -> _Node ---------------------------------------------------------------------------
def _flatten_and(expr: Any) -> list[Any]:
    import z3

    if z3.is_and(expr):
        return [c for child in expr.children() for c in _flatten_and(child)]
    return [expr]


class _Compiler:
    """Translates Z3 expressions to `_Node`s, sharing nodes for shared Z3 sub-terms."""

    def __init__(self) -> None:
        import z3

        self.z3 = z3
        self.memo: dict[int, _Node] = {}
        self.kinds = {
            z3.Z3_OP_AND: "and", z3.Z3_OP_OR: "or", z3.Z3_OP_NOT: "not",
            z3.Z3_OP_IMPLIES: "implies", z3.Z3_OP_XOR: "xor", z3.Z3_OP_ITE: "ite",
            z3.Z3_OP_EQ: "eq", z3.Z3_OP_DISTINCT: "distinct", z3.Z3_OP_LE: "le",
            z3.Z3_OP_LT: "lt", z3.Z3_OP_GE: "ge", z3.Z3_OP_GT: "gt", z3.Z3_OP_ADD: "add",
            z3.Z3_OP_SUB: "sub", z3.Z3_OP_MUL: "mul", z3.Z3_OP_UMINUS: "neg",
            z3.Z3_OP_IDIV: "div", z3.Z3_OP_MOD: "mod", z3.Z3_OP_REM: "rem",
            z3.Z3_OP_TRUE: "true", z3.Z3_OP_FALSE: "false",
        }

    def compile(self, expr: Any) -> _Node:
        z3 = self.z3
        key = expr.get_id()
        if key in self.memo:
            return self.memo[key]
        if z3.is_int_value(expr):
            node = _Node("const", value=expr.as_long())
        elif z3.is_const(expr) and expr.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            if not z3.is_int(expr):
                raise DispatchTuneError(f"unsupported non-integer variable {expr} in constraints")
            node = _Node("var", name=str(expr), vars=frozenset([str(expr)]))
        else:
            kind = expr.decl().kind()
            if kind not in self.kinds:
                raise DispatchTuneError(f"unsupported constraint operator {expr.decl().name()}")
            args = tuple(self.compile(child) for child in expr.children())
            node = _Node(self.kinds[kind], args, vars=frozenset().union(*(a.vars for a in args)))
        self.memo[key] = node
        return node


# ---- vectorised evaluation ---------------------------------------------------------------------
def _eval_int(node: _Node, cols: Columns, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Evaluate an integer node: (values, rows where it is defined, i.e. no zero divisor)."""
    cache: dict[int, tuple[Any, Any]] = {}
    return _as_arrays(_ev(node, cols, cache), rows)


def _eval_bool(node: _Node, cols: Columns, rows: int) -> tuple[np.ndarray, np.ndarray]:
    cache: dict[int, tuple[Any, Any]] = {}
    return _as_arrays(_ev(node, cols, cache), rows)


def _as_arrays(result: tuple[Any, Any], rows: int) -> tuple[np.ndarray, np.ndarray]:
    value, ok = result
    return np.broadcast_to(np.asarray(value), (rows,)), np.broadcast_to(np.asarray(ok), (rows,))


def _ev(node: _Node, cols: Columns, cache: dict[int, tuple[Any, Any]]) -> tuple[Any, Any]:
    """(value, ok): numpy arrays or Python scalars; `ok` is False where a divisor was zero."""
    key = id(node)
    if key in cache:
        return cache[key]
    op = node.op
    result: tuple[Any, Any]
    if op == "const":
        result = (node.value, True)
    elif op == "var":
        result = (cols[node.name], True)
    elif op == "true":
        result = (True, True)
    elif op == "false":
        result = (False, True)
    else:
        parts = [_ev(a, cols, cache) for a in node.args]
        values = [p[0] for p in parts]
        ok: Any = True
        for p in parts:
            if p[1] is not True:
                ok = p[1] if ok is True else ok & p[1]
        result = (_APPLY[op](values, node), ok)
        if op in ("div", "mod", "rem"):
            divisor = values[1]
            nonzero = divisor != 0
            if nonzero is not True:
                ok = nonzero if ok is True else ok & nonzero
            result = (result[0], ok)
    cache[key] = result
    return result


def _safe(divisor: Any) -> Any:
    return np.where(divisor == 0, 1, divisor) if isinstance(divisor, np.ndarray) else divisor or 1


def _emod(values: list[Any], _: _Node) -> Any:
    a, b = values
    return np.mod(a, np.abs(_safe(b)))


def _ediv(values: list[Any], _: _Node) -> Any:
    a, b = values
    b = _safe(b)
    r = np.mod(a, np.abs(b))
    return (a - r) // b


def _rem(values: list[Any], _: _Node) -> Any:
    # SMT-LIB rem: sign follows the divisor's: rem(a, b) = mod(a, b) if b > 0 else -mod(a, b).
    a, b = values
    b = _safe(b)
    m = np.mod(a, np.abs(b))
    return np.where(np.asarray(b) > 0, m, -m)


def _reduce(fn: Callable[[Any, Any], Any]) -> Callable[[list[Any], _Node], Any]:
    def apply(values: list[Any], _: _Node) -> Any:
        out = values[0]
        for v in values[1:]:
            out = fn(out, v)
        return out

    return apply


def _chain(fn: Callable[[Any, Any], Any]) -> Callable[[list[Any], _Node], Any]:
    def apply(values: list[Any], _: _Node) -> Any:
        out: Any = True
        for a, b in itertools.pairwise(values):
            out = out & fn(a, b)
        return out

    return apply


def _distinct(values: list[Any], _: _Node) -> Any:
    out: Any = True
    for i, a in enumerate(values):
        for b in values[i + 1 :]:
            out = out & (a != b)
    return out


_APPLY: dict[str, Callable[[list[Any], _Node], Any]] = {
    "and": _reduce(lambda a, b: a & b),
    "or": _reduce(lambda a, b: a | b),
    "xor": _reduce(lambda a, b: a ^ b),
    "not": lambda v, _: ~v[0] if isinstance(v[0], np.ndarray) else not v[0],
    "implies": lambda v, _: (~v[0] if isinstance(v[0], np.ndarray) else not v[0]) | v[1],
    "ite": lambda v, _: np.where(v[0], v[1], v[2]),
    "eq": _chain(lambda a, b: a == b),
    "distinct": _distinct,
    "le": _chain(lambda a, b: a <= b),
    "lt": _chain(lambda a, b: a < b),
    "ge": _chain(lambda a, b: a >= b),
    "gt": _chain(lambda a, b: a > b),
    "add": _reduce(lambda a, b: a + b),
    "sub": _reduce(lambda a, b: a - b),
    "mul": _reduce(lambda a, b: a * b),
    "neg": lambda v, _: -v[0],
    "div": _ediv,
    "mod": _emod,
    "rem": _rem,
}


# ---- interval arithmetic and narrowing ---------------------------------------------------------
def _fwd(node: _Node, b: dict[str, Interval]) -> Interval:
    """Sound interval of an integer node under the variable bounds `b`."""
    op = node.op
    if op == "const":
        return (node.value, node.value)
    if op == "var":
        return b[node.name]
    if op == "ite":
        truth = _truth(node.args[0], b)
        if truth is True:
            return _fwd(node.args[1], b)
        if truth is False:
            return _fwd(node.args[2], b)
        x, y = _fwd(node.args[1], b), _fwd(node.args[2], b)
        return (min(x[0], y[0]), max(x[1], y[1]))
    ivs = [_fwd(a, b) for a in node.args]
    if op == "add":
        return (sum(i[0] for i in ivs), sum(i[1] for i in ivs))
    if op == "sub":
        lo, hi = ivs[0]
        for i in ivs[1:]:
            lo, hi = lo - i[1], hi - i[0]
        return (lo, hi)
    if op == "neg":
        return (-ivs[0][1], -ivs[0][0])
    if op == "mul":
        out = ivs[0]
        for i in ivs[1:]:
            out = _imul(out, i)
        return out
    if op == "mod":
        (alo, ahi), (blo, bhi) = ivs
        m = max(abs(blo), abs(bhi))
        hi = m - 1 if math.isfinite(m) and m > 0 else _INF
        if alo >= 0:
            hi = min(hi, ahi)
        return (0, hi)
    if op == "div":
        (alo, ahi), (blo, bhi) = ivs
        if blo >= 1 and all(math.isfinite(x) for x in (alo, ahi, blo, bhi)):
            corners = [math.floor(a / d) for a in (alo, ahi) for d in (blo, bhi)]
            return (min(corners), max(corners))
        if blo >= 1 and alo >= 0:
            return (0, ahi)
        return (-_INF, _INF)
    return (-_INF, _INF)


def _imul(x: Interval, y: Interval) -> Interval:
    products = []
    for a in x:
        for c in y:
            if (a == 0 and math.isinf(c)) or (c == 0 and math.isinf(a)):
                products.append(0.0)
            else:
                products.append(a * c)
    return (min(products), max(products))


def _truth(node: _Node, b: dict[str, Interval]) -> bool | None:
    """Whether a comparison is decided by the bounds (None: undecided)."""
    if node.op in ("le", "lt", "ge", "gt", "eq") and len(node.args) == 2:
        (alo, ahi), (blo, bhi) = _fwd(node.args[0], b), _fwd(node.args[1], b)
        if node.op == "eq":
            if alo == ahi == blo == bhi:
                return True
            return False if ahi < blo or bhi < alo else None
        if node.op in ("ge", "gt"):
            (alo, ahi), (blo, bhi) = (blo, bhi), (alo, ahi)
        strict = node.op in ("lt", "gt")
        if (ahi < blo) or (not strict and ahi <= blo):
            return True
        if (alo > bhi) or (strict and alo >= bhi):
            return False
    if node.op == "true":
        return True
    if node.op == "false":
        return False
    return None


def _narrow_bool(node: _Node, b: dict[str, Interval]) -> None:
    """Narrow variable bounds so that `node` (asserted true) can still hold."""
    op = node.op
    if op == "and":
        for a in node.args:
            _narrow_bool(a, b)
        return
    if op not in ("le", "lt", "ge", "gt", "eq") or len(node.args) != 2:
        return
    lhs, rhs = node.args
    if op in ("ge", "gt"):
        lhs, rhs = rhs, lhs
    strict = 1 if op in ("lt", "gt") else 0
    (llo, lhi), (rlo, rhi) = _fwd(lhs, b), _fwd(rhs, b)
    if op == "eq":
        lo, hi = max(llo, rlo), min(lhi, rhi)
        _narrow_int(lhs, lo, hi, b)
        _narrow_int(rhs, lo, hi, b)
        # `a mod d == 0` with a >= 1 implies |d| <= a (d == 0 is left open, as in Z3).
        for side, other in ((lhs, rhs), (rhs, lhs)):
            if side.op == "mod" and other.op == "const" and other.value == 0:
                alo, ahi = _fwd(side.args[0], b)
                if alo >= 1 and math.isfinite(ahi):
                    _narrow_int(side.args[1], -ahi, ahi, b)
        return
    # lhs <= rhs - strict
    _narrow_int(lhs, -_INF, rhi - strict, b)
    _narrow_int(rhs, llo + strict, _INF, b)


def _narrow_int(node: _Node, lo: float, hi: float, b: dict[str, Interval]) -> None:
    """Narrow variables so that the integer node's value can lie in [lo, hi]."""
    if lo == -_INF and hi == _INF:
        return
    op = node.op
    if op == "var":
        cur = b[node.name]
        new_lo = max(cur[0], math.ceil(lo) if math.isfinite(lo) else lo)
        new_hi = min(cur[1], math.floor(hi) if math.isfinite(hi) else hi)
        b[node.name] = (new_lo, new_hi)
        return
    if op == "add":
        ivs = [_fwd(a, b) for a in node.args]
        total_lo, total_hi = sum(i[0] for i in ivs), sum(i[1] for i in ivs)
        for a, (alo, ahi) in zip(node.args, ivs, strict=True):
            rest_lo, rest_hi = _minus(total_lo, alo), _minus(total_hi, ahi)
            _narrow_int(a, _minus(lo, rest_hi), _minus(hi, rest_lo), b)
        return
    if op == "sub" and len(node.args) == 2:
        (alo, ahi), (blo, bhi) = _fwd(node.args[0], b), _fwd(node.args[1], b)
        _narrow_int(node.args[0], lo + blo, hi + bhi, b)
        _narrow_int(node.args[1], _minus(alo, hi), _minus(ahi, lo), b)
        return
    if op == "neg":
        _narrow_int(node.args[0], -hi, -lo, b)
        return
    if op == "mul":
        ivs = [_fwd(a, b) for a in node.args]
        for i, a in enumerate(node.args):
            rest: Interval = (1, 1)
            for j, iv in enumerate(ivs):
                if j != i:
                    rest = _imul(rest, iv)
            _narrow_factor(a, rest, lo, hi, b)
        return


def _minus(x: float, y: float) -> float:
    if math.isinf(x) and math.isinf(y) and (x > 0) == (y > 0):
        return -_INF if x < 0 else _INF  # conservative: unknown difference of infinities
    return x - y


def _narrow_factor(
    node: _Node, rest: Interval, lo: float, hi: float, b: dict[str, Interval]
) -> None:
    """x * p in [lo, hi] with p in `rest`; only narrows when p has a fixed sign."""
    plo, phi = rest
    if plo <= 0 <= phi:
        return
    if phi < 0:  # x * p = (-x) * (-p)
        plo, phi = -phi, -plo
        lo, hi = -hi, -lo
        sign = -1
    else:
        sign = 1
    new_hi = _INF
    if hi < _INF:
        new_hi = math.floor(hi / plo) if hi >= 0 else (math.floor(hi / phi) if phi < _INF else -1)
    new_lo = -_INF
    if lo > -_INF:
        new_lo = math.ceil(lo / plo) if lo <= 0 else (math.ceil(lo / phi) if phi < _INF else 1)
    if sign < 0:
        new_lo, new_hi = -new_hi, -new_lo
    _narrow_int(node, new_lo, new_hi, b)


def _divides(node: _Node) -> bool:
    return node.op in ("div", "mod", "rem") or any(_divides(a) for a in node.args)


def _divisors_nonzero(node: _Node, b: dict[str, Interval]) -> bool:
    if node.op in ("div", "mod", "rem"):
        dlo, dhi = _fwd(node.args[1], b)
        if dlo <= 0 <= dhi:
            return False
    return all(_divisors_nonzero(a, b) for a in node.args)


# ---- reference: blocking clauses ---------------------------------------------------------------
def enumerate_blocking(
    assertions: Sequence[z3.BoolRef], variables: Sequence[str], limit: int | None = None
) -> list[tuple[int, ...]]:
    """All solutions projected on `variables`, one Z3 model at a time with blocking clauses.

    This is the reference tool's method (`check()`, read the model, add `Or(v != value)`), kept
    as the correctness oracle and the baseline of `benchmarks/enumeration_speed.py`.
    """
    import z3

    solver = z3.Solver()
    solver.add(*assertions)
    symbols = [z3.Int(v) for v in variables]
    found: list[tuple[int, ...]] = []
    while (limit is None or len(found) < limit) and solver.check() == z3.sat:
        model = solver.model()
        values = tuple(model.eval(s, model_completion=True).as_long() for s in symbols)
        found.append(values)
        solver.add(z3.Or([s != v for s, v in zip(symbols, values, strict=True)]))
    return found
