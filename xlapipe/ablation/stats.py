"""The numbers behind an ablation's verdicts: spreads, paired intervals, factorial effects.

Pure functions over floats (no runs, no files):

- :class:`Stats`: median and spread of one figure over repeats.
- :func:`paired_interval`: the speed-up of a variant over a reference, paired
  by round, with a Student-t interval for the mean log ratio. The unit is the
  run: each round gives one ratio, so the spread between runs (a run shares
  the machine's state, not a step) is what sets the width. Two paired rounds
  are enough for an interval; more narrow it.
- :func:`blocked_intervals`: the same speed-ups from one fit over every row
  and round (log figure = row + round), the rows' spread pooled: the
  analysis of a randomised complete block design. Its degrees of freedom
  grow with the rows as well as the rounds, so a few rounds decide more.
- :func:`holm_levels`: the level of each of several comparisons under Holm's
  step-down, so that the table's rows together hold the confidence.
- :func:`verdict`: faster, slower, or no detectable difference (with the
  resolution), or undecided.
- :func:`fit_effects`: main effects and pairwise interactions on log time by
  least squares, with Student-t intervals.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeGuard, TypeVar

from attrs import evolve, frozen

Block = TypeVar("Block", bound=Hashable)  # a round (on its machine)


@frozen
class Stats:
    """Median and spread of one figure over a variant's successful repeats."""

    n: int
    median: float
    min: float
    max: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stats | None:
        """The statistics of the finite ``values`` (None, NaN and infinities left out), or None."""
        xs = sorted(float(v) for v in values if finite(v))
        if not xs:
            return None
        q1, q3 = statistics.quantiles(xs, n=4, method="inclusive")[::2] if len(xs) > 1 else (xs[0], xs[0])
        return cls(len(xs), statistics.median(xs), xs[0], xs[-1], q1, q3)


def finite(value: object) -> TypeGuard[float]:
    """True for an int or a float that is finite and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- paired intervals ------------------------------------------------------------------


@frozen
class Interval:
    """A paired speed-up: the estimate and its interval (above 1 is faster than the reference)."""

    n: int  # paired rounds used
    estimate: float  # geometric mean of the paired ratios
    low: float | None  # None with fewer than two pairs
    high: float | None
    level: float  # the confidence of this one interval (see Judging.level)
    sd: float | None = None  # the standard deviation of the paired log ratios (two pairs or more)
    df: float | None = None  # the t distribution's degrees of freedom; None: n - 1 (one pair's own spread)
    pooled: int = 0  # the rows whose spread the interval pools (0: the pair's own)

    @property
    def dof(self) -> float:
        """Degrees of freedom of the interval's Student t: the pooled fit's, or n - 1."""
        return float(self.n - 1) if self.df is None else self.df

    def dof_at(self, rounds: int) -> float:
        """The degrees of freedom ``rounds`` paired rounds would give (a pooled fit's grow with them)."""
        if self.df is None or self.n < 2:
            return float(rounds - 1)
        return max(float(rounds - 1), self.df * (rounds - 1) / (self.n - 1))

    @property
    def decided(self) -> bool:
        return self.low is not None

    @property
    def resolution(self) -> float | None:
        """How far from 1 the interval reaches, read from both sides (0.03 reads "within ±3%").

        A low end of 0.95 is a slow-down of 1/0.95 = 5.3%, not 5%: each end is
        read as the speed-up it stands for, so ±x% means 1/(1+x) to 1+x.
        """
        if self.low is None or self.high is None:
            return None
        return max(1.0 / self.low if self.low > 0 else math.inf, self.high) - 1.0

    @property
    def p_value(self) -> float | None:
        """Two-sided p-value of "no difference" (Student's t on the mean log ratio), or None."""
        if self.sd is None or self.n < 2:
            return None
        mean = math.log(self.estimate)
        if self.sd == 0:
            return 0.0 if mean else 1.0
        t = abs(mean) / (self.sd / math.sqrt(self.n))
        return min(1.0, 2.0 * _t_cdf(-t, self.dof))

    def at(self, level: float) -> Interval:
        """The same pairs' interval at another ``level``."""
        if self.sd is None or self.n < 2:
            return evolve(self, level=level)
        mean = math.log(self.estimate)
        half = t_quantile(0.5 + level / 2, self.dof) * self.sd / math.sqrt(self.n)
        return evolve(self, low=_exp(mean - half), high=_exp(mean + half), level=level)

    def detectable(self, power: float = 0.8) -> float | None:
        """The smallest true speed-up (as a fraction, 0.06 for 6%) these runs find with ``power``."""
        if self.sd is None or self.n < 2:
            return None
        df = self.dof
        reach = (t_quantile(0.5 + self.level / 2, df) + t_quantile(power, df)) * self.sd / math.sqrt(self.n)
        return _exp(reach) - 1.0

    def rounds_to_decide(self, resolution: float = 0.05, most: int = 10_000) -> int | None:
        """Paired rounds that would decide (exclude 1, or fit within ±``resolution``) at this level.

        Assumes the spread and the estimate stay what they are now; None with
        fewer than two pairs, ``most`` + 1 when even ``most`` would not do.
        """
        if self.sd is None or self.n < 2:
            return None
        mean = abs(math.log(self.estimate))
        room = max(mean, math.log1p(resolution) - mean)
        if self.sd == 0:
            return self.n
        n = max(self.n, 2)
        while n <= most:
            if t_quantile(0.5 + self.level / 2, self.dof_at(n)) * self.sd / math.sqrt(n) < room:
                return n
            n += 1 if n < 50 else max(1, n // 20)
        return most + 1


def paired_interval(
    reference: Sequence[float],
    variant: Sequence[float],
    level: float = 0.95,
    higher_is_better: bool = False,
) -> Interval | None:
    """The speed-up of ``variant`` over ``reference`` from paired rounds (same index, same round).

    Each pair gives a ratio (reference / variant for times, variant / reference
    for rates). On the log scale the ratios are the paired differences: the
    estimate is their mean (the geometric mean ratio), the interval the
    Student-t interval at ``level`` with n - 1 degrees of freedom. A slow spell
    shared by both runs of a round cancels in its ratio. None when no pair has
    two positive finite values; no interval (``decided`` False) with one pair.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, got {level}")
    logs = [
        math.log(v / r if higher_is_better else r / v)
        for r, v in zip(reference, variant)
        if finite(r) and finite(v) and r > 0 and v > 0
    ]
    n = len(logs)
    if not n:
        return None
    mean = statistics.fmean(logs)
    if n < 2:
        return Interval(n, math.exp(mean), None, None, level)
    sd = statistics.stdev(logs)
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return Interval(n, math.exp(mean), _exp(mean - half), _exp(mean + half), level, sd)


def blocked_intervals(
    values: Mapping[str, Mapping[Block, float]],
    pairs: Sequence[tuple[str, str]],
    level: float = 0.95,
    higher_is_better: bool = False,
) -> list[Interval | None]:
    """The speed-up of each (variant, reference) in ``pairs``, from one fit over every row and round.

    ``values``: each row's figure by block (its round, on its machine). Least
    squares of the log figure on a row term and a block term (the analysis of
    a randomised complete block design): a slow round cancels as in
    :func:`paired_interval`, and the spread left is pooled over every row, so
    the Student t has (rounds - 1) x (rows - 1) degrees of freedom instead of
    rounds - 1. It assumes the rows share one run-to-run spread (the
    machine's). A pair gets :func:`paired_interval` instead (None with no pair
    at all) when its own paired spread is above the other rows' pooled spread
    by more than chance (an F test at 5%), when it has fewer than two rounds in
    common, or when the fit has fewer than two degrees of freedom left.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, got {level}")
    clean = {row: {b: float(v) for b, v in by.items() if finite(v) and v > 0} for row, by in values.items()}
    whole = _BlockFit(clean)
    out: list[Interval | None] = []
    for variant, reference in pairs:
        mine, theirs = clean.get(variant, {}), clean.get(reference, {})
        common = [b for b in theirs if b in mine]
        own = paired_interval([theirs[b] for b in common], [mine[b] for b in common], level, higher_is_better)
        if whole.cov is None or len(common) < 2 or own is None or own.sd is None:
            out.append(own)
            continue
        rest = _BlockFit({row: by for row, by in clean.items() if row not in (variant, reference)})
        if rest.cov is not None and _spreads_more(own.sd, own.n - 1, math.sqrt(2 * rest.sigma2), rest.df):
            out.append(own)  # this pair's runs spread more than the other rows': its own spread
            continue
        mean, se = whole.contrast(reference, variant)
        mean *= -1.0 if higher_is_better else 1.0
        half = t_quantile(0.5 + level / 2, whole.df) * se
        n = len(common)
        out.append(
            Interval(
                n,
                math.exp(mean),
                _exp(mean - half),
                _exp(mean + half),
                level,
                se * math.sqrt(n),
                float(whole.df),
                len(whole.rows),
            )
        )
    return out


class _BlockFit:
    """Least squares of the log figure on row and block: each row's level, the spread left (sigma2)."""

    def __init__(self, values: Mapping[str, Mapping[Block, float]]):
        import numpy as np

        obs = [(row, block, math.log(v)) for row, by in values.items() for block, v in by.items()]
        self.rows = list(dict.fromkeys(row for row, _, _ in obs))
        blocks = list(dict.fromkeys(block for _, block, _ in obs))
        x = np.zeros((len(obs), len(self.rows) + max(len(blocks) - 1, 0)))
        for i, (row, block, _) in enumerate(obs):
            x[i, self.rows.index(row)] = 1.0  # one column per row: no intercept
            if blocks.index(block):
                x[i, len(self.rows) + blocks.index(block) - 1] = 1.0
        self.df = len(obs) - (int(np.linalg.matrix_rank(x)) if obs else 0)
        self.cov = None
        self.sigma2 = math.nan
        if self.df >= 2:
            y = np.array([v for _, _, v in obs])
            self.coef, *_ = np.linalg.lstsq(x, y, rcond=None)
            resid = y - x @ self.coef
            self.sigma2 = float(resid @ resid) / self.df
            self.cov = self.sigma2 * np.linalg.pinv(x.T @ x)

    def contrast(self, high: str, low: str) -> tuple[float, float]:
        """Row ``high``'s level minus row ``low``'s on the log scale, and its standard error."""
        import numpy as np

        assert self.cov is not None
        c = np.zeros(self.cov.shape[0])
        c[self.rows.index(high)] += 1.0
        c[self.rows.index(low)] -= 1.0
        return float(c @ self.coef), math.sqrt(max(float(c @ self.cov @ c), 0.0))


SPREAD_TEST = 0.05  # the F test's level for "this pair's runs spread more than the other rows'"


def _spreads_more(own_sd: float, own_df: int, others_sd: float, others_df: float) -> bool:
    """True when a pair's own spread is above the other rows' by more than chance (one-sided F test)."""
    if others_sd <= 0:
        return own_sd > 0
    f = (own_sd / others_sd) ** 2
    tail = _betainc(others_df / 2, own_df / 2, others_df / (others_df + own_df * f))  # P(F > f)
    return tail < SPREAD_TEST


def holm_levels(p_values: Sequence[float | None], alpha: float) -> list[float]:
    """The confidence of each comparison's interval under Holm's step-down over all of them.

    The comparisons are taken from the smallest p-value up: the k-th (from 0)
    of m is tested at ``alpha / (m - k)`` while every one before it was
    rejected; from the first that is not, the rest share that step's level.
    An interval at its level excludes 1 exactly when Holm rejects "no
    difference", so the family's chance of any false "faster" or "slower" is
    at most ``alpha``. A comparison without a p-value (fewer than two pairs)
    counts in m and gets the last step's level.
    """
    m = len(p_values)
    order = sorted((i for i, p in enumerate(p_values) if p is not None), key=lambda i: p_values[i])  # type: ignore[arg-type,return-value]
    levels = [1.0 - alpha / max(m, 1)] * m
    stopped: float | None = None
    for k, i in enumerate(order):
        step = alpha / (m - k)
        p = p_values[i]
        assert p is not None
        if stopped is None and p <= step:
            levels[i] = 1.0 - step
        else:
            stopped = step if stopped is None else stopped
            levels[i] = 1.0 - stopped
    last = 1.0 - (stopped if stopped is not None else alpha / max(m - len(order), 1))
    for i, p in enumerate(p_values):
        if p is None:
            levels[i] = last
    return levels


def _exp(x: float) -> float:
    """``exp(x)``, capped at ``exp(700)``: two wild pairs at a high level reach past a float's range."""
    return math.exp(min(x, 700.0))


@frozen
class Verdict:
    """What an interval says, in words, and whether it settles the question."""

    word: str  # "faster", "slower", "no detectable difference", "undecided", "reference"
    detail: str  # e.g. "1.08x-1.15x", "within ±3%", "1 paired round; an interval needs 2"
    resolved: bool

    def __str__(self) -> str:
        return f"{self.word} ({self.detail})" if self.detail else self.word


def verdict(interval: Interval | None, resolution: float = 0.05) -> Verdict:
    """Faster / slower when the interval excludes 1; else no detectable difference within ±x%.

    Resolved when the interval excludes 1, or reaches no further than
    ``resolution`` from it (the difference, if any, is smaller than that).
    """
    if interval is None:
        return Verdict("undecided", "no paired round", False)
    low, high, reach = interval.low, interval.high, interval.resolution
    if low is None or high is None or reach is None:
        return Verdict("undecided", f"{interval.n} paired round; an interval needs 2", False)
    if low > 1.0:
        return Verdict("faster", f"{low:.3g}x-{high:.3g}x", True)
    if high < 1.0:
        return Verdict("slower", f"{low:.3g}x-{high:.3g}x", True)
    if reach > 1.0:  # wider than "±100%" says anything: the interval itself
        return Verdict("no detectable difference", f"{low:.3g}x-{high:.3g}x", False)
    shown = f"{100 * reach:.0f}" if reach >= 0.1 else f"{100 * reach:.2g}"
    return Verdict("no detectable difference", f"within ±{shown}%", reach <= resolution)


# -- factorial effects on log time ------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on its CDF)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return 1 - tail if t > 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (continued fraction)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1 - x)
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return front * h / a


@frozen
class Effect:
    """One term of the factorial model, as a speed-up factor (above 1: the term makes it faster)."""

    names: tuple[str, ...]  # one name: a main effect; two: their interaction
    estimate: float
    low: float | None
    high: float | None
    note: str = ""  # e.g. "not estimable: never apart from with_device"

    @property
    def kind(self) -> str:
        return "main" if len(self.names) == 1 else "interaction"

    @property
    def significant(self) -> bool | None:
        if self.low is None or self.high is None:
            return None
        return self.low > 1.0 or self.high < 1.0


@frozen
class EffectFit:
    """Main effects and pairwise interactions on log time, from every successful run."""

    effects: tuple[Effect, ...]
    runs: int
    residual_df: int
    confidence: float
    aliased: tuple[str, ...] = ()  # terms that the design cannot tell apart from others


def fit_effects(
    rows: Sequence[tuple[frozenset[str], int, float]],
    factors: Sequence[str],
    confidence: float = 0.95,
) -> EffectFit:
    """Least squares of log(time) on the factors (0/1), their pairwise products and repeat blocks.

    ``rows`` are (factors switched on, repeat, time) of successful runs. With
    0/1 coding an effect reads against the variant with no factor: a main
    effect is the factor alone, an interaction what the pair adds beyond its
    two main effects. Estimates and intervals are speed-up factors
    (exp(-coefficient)): above 1, the term makes the run faster. A term the
    design cannot separate from earlier ones (two factors never apart, a
    combination the relations refuse) is reported as aliased, not estimated.
    """
    import numpy as np

    rows = [(on, rep, t) for on, rep, t in rows if finite(t) and t > 0]
    terms: list[tuple[str, ...]] = [(f,) for f in factors]
    terms += [(a, b) for i, a in enumerate(factors) for b in factors[i + 1 :]]
    repeats = sorted({rep for _, rep, _ in rows})
    columns = [np.ones(len(rows))]
    names: list[tuple[str, ...] | None] = [None]
    for rep in repeats[1:]:  # block per repeat: interleaved repeats share the machine's state
        columns.append(np.array([1.0 if r == rep else 0.0 for _, r, _ in rows]))
        names.append(None)
    aliased: list[str] = []
    for term in terms:
        col = np.array([1.0 if set(term) <= on else 0.0 for on, _, _ in rows])
        trial = np.column_stack([*columns, col]) if rows else np.zeros((0, len(columns) + 1))
        if rows and np.linalg.matrix_rank(trial) > len(columns):
            columns.append(col)
            names.append(term)
        else:
            aliased.append(" x ".join(term))
    y = np.log([t for _, _, t in rows]) if rows else np.zeros(0)
    x = np.column_stack(columns) if rows else np.zeros((0, len(columns)))
    df = len(rows) - x.shape[1]
    effects: list[Effect] = []
    if len(rows) < x.shape[1] or not rows:
        return EffectFit((), len(rows), max(df, 0), confidence, tuple(aliased))
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    se = None
    if df > 0:
        resid = y - x @ coef
        sigma2 = float(resid @ resid) / df
        cov = sigma2 * np.linalg.inv(x.T @ x)
        se = np.sqrt(np.clip(np.diag(cov), 0, None))
        q = t_quantile(0.5 + confidence / 2, df)
    for i, named in enumerate(names):
        if named is None:
            continue
        est = math.exp(-coef[i])
        if se is None:
            effects.append(Effect(named, est, None, None, "no interval: no residual degrees of freedom"))
        else:
            effects.append(Effect(named, est, math.exp(-coef[i] - q * se[i]), math.exp(-coef[i] + q * se[i])))
    for name in aliased:
        effects.append(
            Effect(
                tuple(name.split(" x ")),
                math.nan,
                None,
                None,
                "not estimable: aliased with terms above in this design",
            )
        )
    return EffectFit(tuple(effects), len(rows), df, confidence, tuple(aliased))
