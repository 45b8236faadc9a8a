"""What each practice promises, as data: the claims harness and the docs' table read the same values.

A practice declares one :class:`Claim` next to its code (PyTorch's OpInfo is
the model: each operator states its reference and sample inputs once, and
generic tests cross all of them). The harness (:mod:`xlapipe.testing.harness`)
holds every claim against eager PyTorch on every case of a zoo of what users
bring (:mod:`xlapipe.testing.zoo`):

- **trains as eager**: the practice, with what it needs before it, trains
  each case like the eager loop of :attr:`Claim.reference` (the same
  accumulation, clipping, averaging), losses and weights within
  :attr:`Claim.tolerance` of each tensor's norm;
- **resumes exactly**: a checkpoint at each save point in :attr:`Claim.resumes`,
  restored into a new session, continues bit for bit as the run that did not
  stop; at every other save point, the save is refused with its reason;
- **refuses when built**: a case with a feature in :attr:`Claim.refuses` is
  refused when the pipeline or the session is built, with a message naming
  the cause, never at step N or at a save;
- **known failures** are data too (:class:`Known`, OpInfo's ``DecorateInfo``):
  a strict expected failure, with its reason, that the docs list.

A practice of your own gets the whole battery by declaring its claim::

    xlapipe.claims.declare(Claim("my_practice", example=lambda: my_practice(3)))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from attrs import field, frozen
from attrs.validators import instance_of, is_callable

from xlapipe.transform import Transform, builtins

SAVE_POINTS = {
    "epoch": "between two epochs",
    "mid_epoch": "inside an epoch, after an update",
    "mid_window": "inside an epoch and inside an accumulation window",
    "second_save": "a second save in the epoch a restored run continues",
}
# A refusal comes when the pipeline is built, when the session starts, or (for what only a save can
# meet: a loader whose position inside an epoch is unknown) when a checkpoint is saved at ``points``.
WHEN = ("build", "session", "save")
INSIDE_EPOCH = frozenset({"mid_epoch", "mid_window", "second_save"})


@frozen
class Reference:
    """How a practice changes eager PyTorch's training: the eager loop the harness compares with.

    - ``window``: micro-batches per update (gradients averaged over the window);
      ``last_window``: an epoch's short last window averaged over its own length
      (``"average"``) or summed and divided by ``window`` (``"divide_by_steps"``);
    - ``clip``: ``(max_norm, norm_type)`` for ``clip_grad_norm_`` on each update's gradients;
    - ``ema``: the decay of an average of the weights kept after each update;
    - ``autocast``: the dtype forward runs in (``"bfloat16"``), or None.
    """

    window: int = 1
    last_window: str = "average"
    clip: tuple[float, float] | None = None
    ema: float | None = None
    autocast: str | None = None


def unchanged(_: Transform) -> Reference:
    """The reference of a practice that changes how training runs, not what it computes."""
    return Reference()


def _names(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


def _refusals(value: Iterable[Refusal]) -> tuple[Refusal, ...]:
    return tuple(value)


def _known(value: Iterable[Known]) -> tuple[Known, ...]:
    return tuple(value)


@frozen
class Refusal:
    """Cases with ``feature`` (a zoo feature; ``"!feature"``: cases without it) are refused ``when``
    ("build", "session", or "save" at ``points``), with a message matching the regular expression
    ``match``."""

    feature: str = field(validator=instance_of(str))
    match: str = field(validator=instance_of(str))
    when: str = field(default="session")
    points: frozenset[str] = field(default=INSIDE_EPOCH, converter=_names)

    def __attrs_post_init__(self) -> None:
        if self.when not in WHEN:
            raise ValueError(f"Refusal.when must be one of {WHEN}, got {self.when!r}")
        if not self.points <= set(SAVE_POINTS):
            raise ValueError(
                f"Refusal.points are save points ({', '.join(SAVE_POINTS)}), got {sorted(self.points)}"
            )

    def meets(self, features: set[str]) -> bool:
        """Whether a case with ``features`` is one this refusal is for."""
        if self.feature.startswith("!"):
            return self.feature[1:] not in features
        return self.feature in features


@frozen
class Known:
    """A known failure of ``law`` (``"resumes:epoch"``: at one save point) on cases with ``feature``,
    kept as data with its ``reason``."""

    law: str = field(validator=instance_of(str))
    feature: str = field(validator=instance_of(str))
    reason: str = field(validator=instance_of(str))


LAWS = ("trains_as_eager", "resumes", "preempted", "interrupted", "refuses")


@frozen
class Claim:
    """What the practice ``practice`` promises (see the module docstring).

    ``example`` builds the transform the harness trains; ``reference`` maps it
    to its eager loop; ``tolerance`` is relative to each tensor's norm
    (fp32: 1e-5); ``resumes`` names the save points (:data:`SAVE_POINTS`) that
    resume bit for bit, the others being refused; ``own_process`` says it
    changes what the XLA runtime reads once at start, so the harness runs it
    in a fresh process; ``applies_to`` names the zoo features a case needs for the
    practice to mean anything (``static_shapes``: text), other cases are not
    crossed; ``summary`` is its line in the docs' table.
    """

    practice: str = field(validator=instance_of(str))
    example: Callable[[], Transform] = field(validator=is_callable())
    summary: str = field(default="", validator=instance_of(str))
    reference: Callable[[Transform], Reference] = field(default=unchanged, validator=is_callable())
    tolerance: float = 1e-5
    resumes: frozenset[str] = field(default=frozenset(SAVE_POINTS), converter=_names)
    refuses: tuple[Refusal, ...] = field(default=(), converter=_refusals)
    known: tuple[Known, ...] = field(default=(), converter=_known)
    own_process: bool = False
    applies_to: frozenset[str] = field(default=frozenset(), converter=_names)

    def __attrs_post_init__(self) -> None:
        unknown = sorted(self.resumes - set(SAVE_POINTS))
        if unknown:
            raise ValueError(
                f"{self.practice}'s claim: unknown save points {unknown}; known: {', '.join(SAVE_POINTS)}"
            )
        for known in self.known:
            law, _, point = known.law.partition(":")
            if law not in LAWS or (point and point not in SAVE_POINTS):
                raise ValueError(
                    f"{self.practice}'s claim: unknown law {known.law!r}; laws: {', '.join(LAWS)}"
                )
        if not (isinstance(self.tolerance, float) and 0 <= self.tolerance < 1):
            raise ValueError(
                f"{self.practice}'s claim: tolerance is a float in [0, 1), got {self.tolerance!r}"
            )

    def transform(self) -> Transform:
        """The example, checked to be this practice."""
        made = self.example()
        if not isinstance(made, Transform) or made.name != self.practice:
            raise TypeError(
                f"{self.practice}'s claim: example() must build a {self.practice} transform, got {made!r}"
            )
        return made

    def applies(self, features: Iterable[str]) -> bool:
        """Whether a case with ``features`` is one the practice is for."""
        return self.applies_to <= set(features)

    def refusal(self, features: Iterable[str]) -> Refusal | None:
        """The refusal a case with ``features`` meets when built (the first declared), or None."""
        have = set(features)
        return next((r for r in self.refuses if r.meets(have) and r.when != "save"), None)

    def save_refusal(self, features: Iterable[str], point: str) -> Refusal | None:
        """The refusal a save at ``point`` meets on a case with ``features``, or None."""
        have = set(features)
        return next(
            (r for r in self.refuses if r.when == "save" and r.meets(have) and point in r.points), None
        )

    def known_failure(self, law: str, features: Iterable[str]) -> Known | None:
        """The known failure of ``law`` (``"resumes:epoch"``: at that save point) on such a case, or None."""
        have = set(features)
        laws = {law, law.partition(":")[0]}
        return next((k for k in self.known if k.law in laws and k.feature in have), None)


CLAIMS: dict[str, Claim] = {}


def declare(claim: Claim) -> Claim:
    """Register ``claim`` (one per practice; declaring it again with an equal claim changes nothing)."""
    if not isinstance(claim, Claim):
        raise TypeError(f"declare takes a Claim, got {type(claim).__name__}")
    prior = CLAIMS.get(claim.practice)
    if prior is not None and prior != claim:
        raise ValueError(
            f"{claim.practice} already has a claim; a practice states its promises once (change that claim)"
        )
    CLAIMS[claim.practice] = claim
    return claim


def claim_of(practice: str) -> Claim:
    """The claim of ``practice``; a clear error when it has none."""
    builtins()
    if practice not in CLAIMS:
        raise KeyError(
            f"{practice!r} declares no claim; claimed: {', '.join(sorted(CLAIMS))}. Declare one next to "
            "the practice: xlapipe.claims.declare(Claim(...))"
        )
    return CLAIMS[practice]


def table(claims: Iterable[Claim] | None = None) -> str:
    """The docs' claims table (docs/practices.md), in Markdown."""
    builtins()
    rows = [
        "| practice | promises | trains as eager | resumes exactly at | refuses (when) | known failures |",
        "|---|---|---|---|---|---|",
    ]
    for c in sorted(CLAIMS.values() if claims is None else claims, key=lambda c: c.practice):
        reference = c.reference(c.transform())
        differs = [
            f"{k}={v}"
            for k, v in (
                (f, getattr(reference, f)) for f in ("window", "last_window", "clip", "ema", "autocast")
            )
            if v not in (None, 1, "average")
        ]
        trains = f"within {c.tolerance:g}" + (f" (eager with {', '.join(differs)})" if differs else "")
        resumes = ", ".join(p for p in SAVE_POINTS if p in c.resumes) or "nowhere (saves refused)"
        refuses = (
            "; ".join(
                f"`{r.feature}` ({'saves ' + ', '.join(sorted(r.points)) if r.when == 'save' else r.when})"
                for r in c.refuses
            )
            or "-"
        )
        known = "; ".join(f"{k.law} on `{k.feature}`: {k.reason}" for k in c.known) or "-"
        summary = c.summary + (f" (for {', '.join(sorted(c.applies_to))} cases)" if c.applies_to else "")
        rows.append(f"| `{c.practice}` | {summary} | {trains} | {resumes} | {refuses} | {known} |")
    return "\n".join(rows)
