"""What an ablation is asked, as four small values checked when they are built.

- :class:`Variants`: which pipelines to compare, and against which one.
- :class:`Judging`: the figure compared and how it is decided (confidence,
  resolution, tolerance of the recommendation, rounds, budget).
- :class:`Runs`: how each run is run and measured (time limit,
  interpreter, the workload contract or the session's own measurement).
- :class:`Output`: where the results go and what is shown meanwhile.

Bad input is refused here, with what to do, before anything runs.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import field, frozen

from xlapipe.ablation.variants import DESIGNS, MODES


def parse_duration(value: str | float) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``1h``, ``1h30m``; refuses non-finite and non-positive ones."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", text)
        if not text or parts is None or not any(parts.groups()):
            raise ValueError(f"a duration is seconds or e.g. 90s, 30m, 1h, 1h30m; got {value!r}")
        h, m, sec = (float(g) if g else 0.0 for g in parts.groups())
        seconds = 3600 * h + 60 * m + sec
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"a duration must be a positive, finite number of seconds, got {value!r}")
    return seconds


def positive_seconds(value: Any, what: str) -> float:
    """``value`` as a positive, finite number of seconds, or a ValueError naming ``what``."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{what} must be a positive, finite number of seconds, got {value!r}")
    return seconds


@frozen
class TargetMetric:
    """A metric value to reach: ``>= value`` (accuracy-like) or ``<= value`` (loss-like)."""

    value: float
    higher_is_better: bool = True

    @classmethod
    def parse(cls, text: str | float | TargetMetric) -> TargetMetric:
        """``0.8`` or ``>=0.8`` (reach at least), ``<=0.3`` (reach at most)."""
        if isinstance(text, TargetMetric):
            return text
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            value, higher = float(text), True
        else:
            raw = str(text).strip()
            higher = not raw.startswith("<=")
            number = raw[2:] if raw.startswith((">=", "<=")) else raw
            try:
                value = float(number)
            except ValueError:
                raise ValueError(f"a target metric is a number, >=NUMBER or <=NUMBER; got {text!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"a target metric must be finite, got {text!r}")
        return cls(value, higher)

    def reached(self, value: float) -> bool:
        return value >= self.value if self.higher_is_better else value <= self.value

    def __str__(self) -> str:
        return f"{'>=' if self.higher_is_better else '<='}{self.value:g}"


def _target(value: str | float | TargetMetric | None) -> TargetMetric | None:
    return None if value is None else TargetMetric.parse(value)


def _budget(value: str | float | None) -> float | None:
    return None if value is None else parse_duration(value)


def _names(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    return tuple(n.strip() for n in items if n.strip())


def _imports(value: str | Sequence[str]) -> tuple[str, ...]:
    return _names(value) or ()


def _count(least: int) -> Callable[[Any, Any, Any], None]:
    def check(_: object, attribute: Any, value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{attribute.name} must be a whole number of at least {least}, got {value!r}")

    return check


def _fraction(low_open: bool) -> Callable[[Any, Any, Any], None]:
    def check(_: object, attribute: Any, value: Any) -> None:
        ok = (
            isinstance(value, (int, float))
            and math.isfinite(value)
            and (value > 0 if low_open else value >= 0)
        )
        if not ok:
            kind = "positive" if low_open else "non-negative"
            raise ValueError(f"{attribute.name} must be a {kind} fraction (0.05 reads 5%), got {value!r}")

    return check


def _confidence(_: object, __: object, value: Any) -> None:
    if not (isinstance(value, (int, float)) and 0 < value < 1):
        raise ValueError(f"confidence must be between 0 and 1 (e.g. 0.95), got {value!r}")


def _choice(choices: Sequence[str], what: str) -> Callable[[Any, Any, Any], None]:
    def check(_: object, __: object, value: Any) -> None:
        if value is not None and value not in choices:
            raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")

    return check


@frozen
class Variants:
    """Which pipelines an ablation compares (see :func:`xlapipe.ablation.plan` for the modes).

    ``pipeline`` is the full pipeline (a Pipeline, its description or that
    description as JSON text; default: the one the script trains with).
    ``baseline`` names the transforms of the baseline variant, ``reference``
    the variant the table compares against (default: the baseline).
    ``explicit`` lists the pipelines of mode ``"explicit"``. ``eager_reference``
    adds eager PyTorch on the CPU as a reference row; ``aa`` adds the last row
    a second time (an A/A pair: the noise floor of the runs). ``imports`` are
    modules to import first: they register transforms of your own.
    """

    mode: str = field(default="leave-one-out", validator=_choice(MODES, "ablation mode"))
    pipeline: Any = None
    baseline: tuple[str, ...] | None = field(default=None, converter=_names)
    reference: str | None = None
    factors: tuple[str, ...] | None = field(default=None, converter=_names)
    order: tuple[str, ...] | None = field(default=None, converter=_names)
    cumulative: bool = True
    explicit: Sequence[Any] | None = None
    design: str | None = field(default=None, validator=_choice(DESIGNS, "design"))
    eager_reference: bool = False
    aa: bool = False
    imports: tuple[str, ...] = field(default=(), converter=_imports)


@frozen
class Judging:
    """How the runs are judged: the figure, the intervals, the verdicts, the rounds.

    Every variant runs ``repeats`` interleaved rounds; with ``until_resolved``
    the reference and the variants still unresolved get more rounds, up to
    ``max_rounds`` or until ``budget`` (seconds or "25m") is spent. A variant
    is looked at after each round from the ``repeats``-th on: at most
    :attr:`looks` times, so each interval is at :attr:`level`
    (``1 - (1 - confidence) / looks``) and all its looks together hold
    ``confidence``. Resolved: the interval excludes 1, or holds 1 and reaches
    no further than ``resolution`` from it. The recommendation keeps the
    reference's final loss and metric within ``tolerance``; ``target_metric``
    (``0.8``, ``"<=0.3"``) gives the time to reach it from ``metric_history``.
    """

    figure: str = "epoch_s"
    confidence: float = field(default=0.95, validator=_confidence)
    resolution: float = field(default=0.05, validator=_fraction(low_open=True))
    tolerance: float = field(default=0.02, validator=_fraction(low_open=False))
    target_metric: TargetMetric | None = field(default=None, converter=_target)
    repeats: int = field(default=3, validator=_count(1))
    until_resolved: bool = True
    max_rounds: int = field(default=6, validator=_count(2))
    budget: float | None = field(default=None, converter=_budget)

    @property
    def rounds(self) -> int:
        """The most rounds any variant gets."""
        return max(self.max_rounds, self.repeats) if self.until_resolved else self.repeats

    @property
    def looks(self) -> int:
        """How many times a variant's interval may be looked at (after each round from ``repeats`` on)."""
        return self.rounds - max(self.repeats, 2) + 1 if self.until_resolved else 1

    @property
    def level(self) -> float:
        """The confidence of each interval, so that all of a variant's looks hold ``confidence``."""
        return 1.0 - (1.0 - self.confidence) / max(self.looks, 1)


def _seconds_or_none(value: Any) -> float | None:
    return None if value is None else positive_seconds(value, "timeout")


def _env(value: Mapping[str, str] | None) -> dict[str, str]:
    return dict(value or {})


def _resources(value: Mapping[str, float] | str | None) -> dict[str, float] | None:
    """Ray resources a run holds, from a mapping or its JSON text; each amount positive."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f'ray_resources is a JSON object such as {{"TPU": 4}}, got {value!r}') from None
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f'ray_resources is a non-empty mapping such as {{"TPU": 4}}, got {value!r}')
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"ray_resources: {k!r} needs a positive amount, got {v!r}")
        out[k] = float(v)
    return out


def _address(_: object, __: object, value: Any) -> None:
    if value is None:
        return
    ok = isinstance(value, str) and (
        value == "auto" or value.startswith("ray://") or re.fullmatch(r"[^\s:]+:\d+", value) is not None
    )
    if not ok:
        raise ValueError(
            f"--ray takes 'auto' (on a machine of the cluster) or the head node's HOST:PORT "
            f"(e.g. 10.0.0.2:6379), got {value!r}"
        )


@frozen
class Runs:
    """How each run is run and measured.

    Each run is a fresh interpreter (:mod:`xlapipe.child_process`).
    ``timeout``: seconds per run; None sizes it from the
    work (a variant's first run may take up to an hour, or what is left of the
    budget; later runs up to four times its longest). ``contract``: the script
    follows the workload contract (``--print-pipeline``, ``--pipeline``,
    ``--report``); otherwise it runs unchanged and the session measures it,
    leaving out the first ``warmup`` steps, and ``metric`` names the number
    it prints to compare (``accuracy`` reads ``accuracy 0.84`` or
    ``accuracy: 0.84``). ``retry_failed``: on resume, run recorded failures again.
    """

    timeout: float | None = field(default=None, converter=_seconds_or_none)
    python: str = field(default=sys.executable)
    env: dict[str, str] = field(factory=dict, converter=_env)
    contract: bool = False
    warmup: int = field(default=5, validator=_count(0))
    metric: str | None = None
    retry_failed: bool = True
    ray: str | None = field(default=None, validator=_address)
    ray_resources: dict[str, float] | None = field(default=None, converter=_resources)


def _folder(value: str | os.PathLike) -> Path:
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"the output folder {str(path)!r} is a file; give a folder (it is created if missing)"
        )
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"the output folder {str(path)!r} is inside {str(parent)!r}, which is a file")
    return path


def say(text: str) -> None:
    """Print a line at once (a log file redirected from the command sees each run as it ends)."""
    print(text, flush=True)


@frozen
class Output:
    """Where the results go (``folder``), and what is shown meanwhile."""

    folder: Path = field(default=Path("results/ablation"), converter=_folder)
    progress: bool = True  # a progress bar with the time left and the rows still undecided
    echo: Callable[[str], None] | None = say  # one line per run; None: silent
