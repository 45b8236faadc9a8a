"""Two-level fractional factorial designs: which subsets of factors to run, and what is confounded.

A full factorial over k factors runs 2^k subsets. A 2^(k-p) fraction runs
2^(k-p) of them, chosen so that main effects and pairwise interactions stay
estimable: its *resolution* is the shortest word of the defining relation, and
with resolution V or more no main effect or pair is aliased with another main
effect or pair (only with interactions of three or more factors, assumed
negligible). Pure functions; the search is small (k up to about 12).
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Sequence

from attrs import field, frozen

from xlapipe._convert import ints, name_sets, strs

ROMAN = {3: "III", 4: "IV", 5: "V", 6: "VI", 7: "VII", 8: "VIII", 9: "IX", 10: "X"}
FULL_UP_TO = 5  # factors; above this a fraction is proposed


@frozen
class Design:
    """The runs of a (possibly fractional) two-level design over ``factors``."""

    factors: tuple[str, ...] = field(converter=strs)
    runs: tuple[frozenset[str], ...] = field(converter=name_sets)  # the factors switched on, per run
    words: tuple[frozenset[str], ...] = field(default=(), converter=name_sets)  # generators' words, I = ...
    signs: tuple[int, ...] = field(default=(), converter=ints)

    def relation(self) -> list[tuple[frozenset[str], int]]:
        """Every word of the defining relation (products of the generators' words), with its sign."""
        out = []
        for r in range(1, len(self.words) + 1):
            for combo in itertools.combinations(range(len(self.words)), r):
                word: frozenset[str] = frozenset()
                sign = 1
                for i in combo:
                    word = word ^ self.words[i]
                    sign *= self.signs[i]
                out.append((word, sign))
        return out

    @property
    def resolution(self) -> int | None:
        return min(len(w) for w, _ in self.relation()) if self.words else None

    def letters(self) -> dict[str, str]:
        return {f: string.ascii_uppercase[i] if i < 26 else f"F{i}" for i, f in enumerate(self.factors)}

    def confounding(self) -> str:
        """What the fraction cannot tell apart, in words."""
        if not self.words:
            return f"full factorial: {len(self.runs)} runs, every effect estimable"
        letters = self.letters()
        key = ", ".join(f"{letters[f]} = {f}" for f in self.factors)
        relation = " = ".join(
            [
                "I",
                *(
                    ("-" if s < 0 else "") + "".join(sorted(letters[f] for f in w))
                    for w, s in self.relation()
                ),
            ]
        )
        res = self.resolution
        assert res is not None  # a fraction (words) has a resolution
        main, pair = res - 1, res - 2
        return (
            f"2^({len(self.factors)}-{len(self.words)}) fraction, resolution "
            f"{ROMAN.get(res, res)}: {len(self.runs)} runs instead of {2 ** len(self.factors)}. "
            f"Defining relation {relation} ({key}). Each main effect is confounded with "
            f"{main}-factor interactions and each pairwise interaction with {pair}-factor "
            f"interactions, taken as negligible."
        )


def full(factors: Sequence[str]) -> Design:
    """Every subset of ``factors``, smallest first."""
    runs = [frozenset(c) for size in range(len(factors) + 1) for c in itertools.combinations(factors, size)]
    return Design(factors, runs)


def fractional(factors: Sequence[str], resolution: int = 5) -> Design:
    """The smallest 2^(k-p) fraction of at least ``resolution`` whose runs include "no factor on".

    The first factors are the base (every combination of them is run); each
    other factor is set by the product of a set of base factors (a generator).
    Raises ValueError when the factors are too few for a fraction of that
    resolution to save runs.
    """
    k = len(factors)
    if len(set(factors)) != k:
        raise ValueError(f"factors must be distinct, got {list(factors)}")
    for m in range(1, k):
        if 2**m < 1 + k + k * (k - 1) // 2 and resolution >= 5:
            continue  # too few runs to estimate every main effect and pair
        gens = _generators(m, k - m, resolution)
        if gens is not None:
            return _build(factors, m, gens)
    raise ValueError(
        f"no two-level fraction of resolution {resolution} saves runs over the full factorial for "
        f"{k} factors; run the full design (2^{k} = {2**k} subsets)"
    )


def _generators(m: int, p: int, resolution: int) -> list[int] | None:
    """p generator masks over m base bits so that every word of the relation has >= resolution letters."""
    candidates = sorted(
        (mask for mask in range(1, 2**m) if bin(mask).count("1") + 1 >= resolution),
        key=lambda mask: -bin(mask).count("1"),
    )

    def words(chosen: list[int]) -> list[int]:
        # word of generator i: its base mask plus its own (generated) letter, bit m + i
        out = []
        for r in range(1, len(chosen) + 1):
            for combo in itertools.combinations(range(len(chosen)), r):
                w = 0
                for i in combo:
                    w ^= chosen[i] | (1 << (m + i))
                out.append(w)
        return out

    def search(chosen: list[int], start: int) -> list[int] | None:
        if len(chosen) == p:
            return chosen
        for j in range(start, len(candidates)):
            trial = [*chosen, candidates[j]]
            if all(bin(w).count("1") >= resolution for w in words(trial)):
                found = search(trial, j + 1)
                if found is not None:
                    return found
        return None

    return search([], 0)


def _build(factors: Sequence[str], m: int, gens: list[int]) -> Design:
    base = list(factors[:m])
    extra = list(factors[m:])
    # sign of each generator chosen so that the run with every base factor off has every factor off
    signs = [(-1) ** (bin(g).count("1") + 1) for g in gens]
    runs = []
    for levels in itertools.product((-1, 1), repeat=m):  # -1 off, +1 on; the all-off run first
        on = {f for f, x in zip(base, levels) if x > 0}
        for name, g, s in zip(extra, gens, signs):
            prod = 1
            for i in range(m):
                if g >> i & 1:
                    prod *= levels[i]
            if s * prod > 0:
                on.add(name)
        runs.append(frozenset(on))
    runs.sort(key=lambda r: (len(r), [factors.index(f) for f in sorted(r, key=factors.index)]))
    word_sets = [
        frozenset([*(base[i] for i in range(m) if g >> i & 1), name]) for g, name in zip(gens, extra)
    ]
    return Design(factors, runs, word_sets, signs)
