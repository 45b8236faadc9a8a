"""What changed between two graphs: their inputs' shapes, the first op where they part, or only a value.

The IR text is torch_xla's (``XLA_SAVE_TENSORS_FILE``, with ``XLA_IR_DEBUG=1``
giving each op the Python line that traced it). Like torch_xla's own
``max_different_graphs`` error ("Got: ... Expected: ..."), the graphs are
compared op by op in trace order; unlike it, both are already compiled.
"""

from __future__ import annotations

import re
from collections import Counter

from attrs import frozen

_OP = re.compile(r"^\s*%\d+ = (?P<shape>\S+) (?P<op>[\w:.]+)\(")
_LOCATION = re.compile(r", location=(?P<location>[^,]+)")
_INPUT = "xla::device_data"


@frozen
class Op:
    """One IR op: name and shape, and the Python line that traced it (``function@file:line``)."""

    op: str
    shape: str
    location: str = ""

    def __str__(self) -> str:
        return f"{self.op} {self.shape}" + (f" (traced at {self.location})" if self.location else "")


def ops(ir: str) -> list[Op]:
    """The ops of an IR text, in trace order."""
    out = []
    for line in ir.splitlines():
        if (m := _OP.match(line)) is not None:
            where = _LOCATION.search(line)
            out.append(Op(m["op"], _plain(m["shape"]), where["location"] if where else ""))
    return out


def location_line(location: str) -> tuple[str, int] | None:
    """``function@file.py:12`` as (``file.py``, 12)."""
    _, _, place = location.rpartition("@")
    file, _, line = place.rpartition(":")
    return (file, int(line)) if file and line.isdigit() else None


def _plain(shape: str) -> str:
    """``f32[16,52]{1,0}`` without its layout: ``f32[16,52]``."""
    return shape.split("{", 1)[0]


@frozen
class Change:
    """How graph ``new`` differs from the closest of the graphs it is compared with."""

    kind: str  # "shapes", "structure" or "value"
    new_inputs: tuple[str, ...] = ()  # input shapes only the new graph has
    old_inputs: tuple[str, ...] = ()  # ... only the earlier graph has
    got: Op | None = None  # the first op that differs, in the new graph
    expected: Op | None = None  # ... and in the earlier one
    new_input_sites: tuple[str, ...] = ()  # where the inputs only the new graph has were made

    def describe(self) -> str:
        if self.kind == "value":
            return (
                "the same ops on the same shapes as an earlier graph, yet a different graph: a value "
                "baked into it changed (a Python number used as an op argument: an index, a shift, "
                "an exponent, or 0 and 1, which XLA keeps as constants)"
            )
        parts = []
        if self.new_inputs or self.old_inputs:
            parts.append(
                f"inputs changed against the closest earlier graph: {in_words(self.new_inputs, self.old_inputs)}"
            )
        if self.got is not None or self.expected is not None:
            parts.append(
                f"first different op: got {self.got or '(nothing)'}, expected {self.expected or '(nothing)'}"
            )
        return "; ".join(parts)


def _common_prefix(a: list[Op], b: list[Op]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _comparable(o: Op) -> Op:
    # where an input was created (the loader's thread, a transfer) is not part of what it is
    return Op(o.op, o.shape) if o.op == _INPUT else o


def compare(new: str, earlier: list[str]) -> Change | None:
    """How IR ``new`` differs from the earlier graph it has the longest common start with."""
    if not earlier:
        return None
    located = ops(new)
    mine = [_comparable(o) for o in located]
    others = [[_comparable(o) for o in ops(ir)] for ir in earlier]
    best = max(reversed(others), key=lambda theirs: _common_prefix(mine, theirs))
    at = _common_prefix(mine, best)
    inputs_new = Counter(o.shape for o in mine if o.op == _INPUT)
    inputs_old = Counter(o.shape for o in best if o.op == _INPUT)
    added = tuple(sorted((inputs_new - inputs_old).elements()))
    removed = tuple(sorted((inputs_old - inputs_new).elements()))
    if at == len(mine) == len(best):
        return Change("value")
    got = mine[at] if at < len(mine) else None
    expected = best[at] if at < len(best) else None
    if added or removed:
        # the first op past the inputs: the first computation the new shapes reach
        skip = at
        while skip < min(len(mine), len(best)) and (mine[skip].op == _INPUT or mine[skip] == best[skip]):
            skip += 1
        got = mine[skip] if skip < len(mine) else got
        expected = best[skip] if skip < len(best) else expected
        sites = tuple(
            dict.fromkeys(o.location for o in located if o.op == _INPUT and o.shape in added and o.location)
        )
        return Change("shapes", added, removed, got, expected, sites)
    return Change("structure", got=got, expected=expected)


SHAPE = re.compile(r"^(?P<dtype>\w+)\[(?P<dims>[\d,]*)\]$")


def in_words(new: tuple[str, ...], old: tuple[str, ...], letter: str = "L") -> str:
    """``s64[16,L]: L 15 (was 12), 3 inputs`` when one dimension moved (named ``letter``); else what
    each graph had."""
    a = [dims_of(x) for x in new]
    b = [dims_of(x) for x in old]
    if a and len(a) == len(b) and all(a) and all(b):
        kinds = {(d[0], len(d[1])) for d in a + b if d}
        if len(kinds) == 1:
            moved = {i for x, y in zip(a, b) if x and y for i, (m, n) in enumerate(zip(x[1], y[1])) if m != n}
            if len(moved) == 1 and a[0] and b[0]:
                (i,) = moved
                pattern = ",".join(letter if j == i else str(n) for j, n in enumerate(a[0][1]))
                count = f", {len(a)} inputs" if len(a) > 1 else ""
                return f"{a[0][0]}[{pattern}]: {letter} {a[0][1][i]} (was {b[0][1][i]}){count}"
    if not old:
        return f"new inputs {_shapes(new)} the earlier graph did not have"
    if not new:
        return f"inputs {_shapes(old)} the earlier graph had are gone"
    return f"{_shapes(new)} (was {_shapes(old)})"


def _shapes(shapes: tuple[str, ...]) -> str:
    counts = Counter(shapes)
    return ", ".join(s if n == 1 else f"{n} x {s}" for s, n in counts.items()) or "(none)"


def dims_of(shape: str) -> tuple[str, tuple[int, ...]] | None:
    """``("s64", (16, 12))`` for ``"s64[16,12]"``; None for what is not a plain shape."""
    m = SHAPE.match(shape)
    if not m:
        return None
    return m["dtype"], tuple(int(d) for d in m["dims"].split(",") if d)
