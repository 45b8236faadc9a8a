"""The claims harness: every practice's claim (:mod:`xlapipe.claims`) held against eager PyTorch on the zoo.

The laws, each a function that raises ``AssertionError`` naming the practice,
the case and what broke:

- :func:`check_trains_as_eager`: the practice (after what it needs) trains the
  case like the eager loop of its claim's reference: every loss and every
  weight (and the average of the weights, under ``ema``) within the claim's
  tolerance of each tensor's norm. Dropout draws other masks on the device
  than on the CPU, so a case with dropout is compared with ``with_device()``
  alone, on the device;
- :func:`check_resumes`: a run saved at a save point and restored into a new
  session continues bit for bit as the run that did not stop (losses, weights,
  practice states) where the claim says it resumes there; elsewhere the save
  is refused with a reason and nothing is written;
- :func:`check_preempted`: SIGTERM inside an epoch under
  ``checkpoint_on_preemption`` saves and stops, and the loop started again
  continues bit for bit, or the pipeline is refused when it is built;
- :func:`check_interrupted`: Ctrl-C in a step, or an error in an evaluation,
  leaves process-wide state as it was and the last completed step's weights;
- :func:`check_refuses`: a case with a feature the claim refuses is refused
  when the pipeline or the session is built, with the claimed message.

:func:`check_claim` runs a law on a (claim, case) pair; ``python -m
xlapipe.testing.harness`` runs them in a fresh process.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from attrs import frozen

from xlapipe import checkpoint
from xlapipe.claims import CLAIMS, LAWS, SAVE_POINTS, Claim, Known, Reference
from xlapipe.pipeline import Pipeline
from xlapipe.session import session
from xlapipe.testing import _plain_state
from xlapipe.testing.zoo import Case
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import OrderError, Transform, builtins, rebuild

builtins()  # the built-in practices and their claims (CLAIMS), which the harness checks

Stop = Callable[[Any], bool]  # (run) -> save and stop here


@frozen
class Trained:
    """What a training run gave: its losses, final weights, and practice states (the average, ...)."""

    losses: list[float]
    weights: dict[str, torch.Tensor]
    states: dict[str, Any]
    average: dict[str, torch.Tensor] | None = None  # under ema: the average, keyed like the weights


def _seed() -> None:
    """Every generator a run draws from, the XLA device's included, set alike for each run."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    if torch_xla._XLAC._xla_runtime_is_initialized():  # else untouched: SPMD must come first (shard_data)
        xm.set_rng_state(0, str(torch_xla.device()))


def pipeline_for(*claims: Claim, extra: Sequence[Transform] = ()) -> list[Transform]:
    """The claims' examples, in order, each after what it needs (``with_device()`` first), then ``extra``."""
    from xlapipe.transforms import with_device

    out: list[Transform] = []
    for transform in [with_device(), *(c.transform() for c in claims), *extra]:
        have = {t.name for t in out}
        if transform.name in have:
            continue
        out += [rebuild(n) for n in sorted(transform.needs - have)]
        out.append(transform)
    return out


def reference_for(transforms: Sequence[Transform]) -> Reference:
    """The eager loop of a pipeline: each practice's reference, merged (none of them may disagree)."""
    merged: dict[str, Any] = {}
    default = Reference()
    for t in transforms:
        ref = claim_for(t).reference(t)
        for name in ("window", "last_window", "clip", "ema", "autocast"):
            value = getattr(ref, name)
            if value != getattr(default, name):
                assert merged.get(name, value) == value, f"two practices change the eager loop's {name}"
                merged[name] = value
    return Reference(**merged)


def tolerance_for(transforms: Sequence[Transform]) -> float:
    return max(claim_for(t).tolerance for t in transforms)


# -- the two loops ------------------------------------------------------------------------------


def eager(case: Case, reference: Reference) -> Trained:
    """The case trained by a plain PyTorch loop on the CPU, changed as ``reference`` says."""
    _seed()
    model, optimizer = case.build()
    scheduler = case.scheduler(optimizer) if case.scheduler else None
    user_scheduler = case.user_scheduler(optimizer) if case.user_scheduler else None
    params = [p for g in optimizer.param_groups for p in g["params"]]
    average = {k: v.detach().clone() for k, v in model.state_dict().items()} if reference.ema else None
    losses: list[float] = []
    window = steps = 0

    def update() -> None:
        nonlocal window
        divisor = window if reference.last_window == "average" else reference.window
        if divisor > 1:
            scale = torch.tensor(1.0 / divisor)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(scale)
        if reference.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, reference.clip[0], reference.clip[1])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        if average is not None and reference.ema is not None:
            with torch.no_grad():
                for k, v in model.state_dict().items():
                    if v.is_floating_point():
                        average[k].mul_(reference.ema).add_(v, alpha=1.0 - reference.ema)
                    else:
                        average[k].copy_(v)
        window = 0

    loader = case.loader()
    for epoch in range(case.epochs):
        model.train()
        for batch in loader:
            if case.rate is not None:
                case.rate(optimizer, steps)
            autocast = (
                torch.autocast("cpu", dtype=getattr(torch, reference.autocast))
                if reference.autocast
                else contextlib.nullcontext()
            )
            with autocast:
                loss = case.loss_fn(model, batch)
            loss.backward()
            losses.append(float(loss))
            steps += 1
            window += 1
            if window >= reference.window:
                update()
        if window:
            update()
        if case.epoch_end is not None:
            case.epoch_end(user_scheduler or optimizer, epoch)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Trained(losses, weights, {}, average)


def _setup(case: Case) -> TrainingSetup:
    """The case as a user sets it up, every generator seeded alike."""
    _seed()
    model, optimizer = case.build()
    return TrainingSetup(model, optimizer, {"train": case.loader()}, scheduler=case.scheduler)


def train(
    case: Case,
    transforms: Sequence[Transform],
    *,
    stop: Stop | None = None,
    save_to: str | None = None,
    resume_from: str | None = None,
    signal_at: int | None = None,
    interrupt_at: int | None = None,
    evaluation_fails_at: int | None = None,
    evaluate_at: int | None = None,
) -> Trained:
    """The case trained under ``transforms``.

    ``stop(run)``: stop there (after saving to ``save_to``, when given);
    ``resume_from``: restore that checkpoint into this new session first;
    ``signal_at``: send this process SIGTERM before that step (the losses of
    the steps run are in the :class:`Interrupted` raised); ``interrupt_at``:
    Ctrl-C inside that step's forward; ``evaluation_fails_at``: after that
    step, an evaluation under ``run.evaluating()`` raises :class:`EvaluationFailed`
    (for both, the weights the run kept when its session failed are returned); ``evaluate_at``:
    the same evaluation after that step, which does not fail.
    """
    setup = _setup(case)
    optimizer = setup.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)  # the zoo builds one: the user's own
    user_scheduler = case.user_scheduler(optimizer) if case.user_scheduler else None
    losses: list[torch.Tensor] = []
    loss_fn = case.loss_fn if interrupt_at is None else _interrupting(case.loss_fn, interrupt_at)
    run: Any = None
    try:
        with session(Pipeline(*transforms)(setup)) as run:
            if resume_from is not None:
                checkpoint.restore(resume_from, run)
                extra = checkpoint.load(resume_from)["extra"]
                if user_scheduler is not None:
                    user_scheduler.load_state_dict(extra["user_scheduler"])
            for epoch in range(run.epoch, case.epochs):
                run.model.train()
                for batch in run.batches("train"):
                    if case.rate is not None:
                        case.rate(optimizer, run.steps)
                    if signal_at is not None and run.steps == signal_at:
                        os.kill(os.getpid(), signal.SIGTERM)
                    losses.append(run.step(batch, loss_fn))
                    if run.steps in (evaluation_fails_at, evaluate_at):
                        with run.evaluating():
                            case.loss_fn(run.model, batch)  # may change buffers (an LSTM's state)
                            if run.steps == evaluation_fails_at:
                                raise EvaluationFailed(f"evaluation after step {run.steps} failed")
                    if stop is not None and stop(run):
                        _save(run, save_to, user_scheduler)
                        return _trained(run, losses)
                if case.epoch_end is not None:
                    case.epoch_end(user_scheduler or optimizer, epoch)
                if stop is not None and stop(run):
                    _save(run, save_to, user_scheduler)
                    return _trained(run, losses)
            return _trained(run, losses)
    except (KeyboardInterrupt, EvaluationFailed) as failed:
        planned = interrupt_at if isinstance(failed, KeyboardInterrupt) else evaluation_fails_at
        if planned is None or run is None:
            raise
        return Trained([float(v) for v in losses], run.state_dict(), {})
    except SystemExit as stopped:
        if signal_at is None:
            raise
        raise Interrupted([float(v) for v in losses], stopped.code) from stopped


class EvaluationFailed(Exception):
    """The failure :func:`train` plants in an evaluation."""


class Interrupted(Exception):
    """A run stopped by a signal: the losses of the steps it ran, and the exit status it asked for."""

    def __init__(self, losses: list[float], status: Any) -> None:
        super().__init__(f"stopped with status {status} after {len(losses)} steps")
        self.losses, self.status = losses, status


def _interrupting(loss_fn: Any, at: int) -> Any:
    calls = [0]

    def interrupted(model: Any, batch: Any) -> Any:
        calls[0] += 1
        if calls[0] == at + 1:
            raise KeyboardInterrupt
        return loss_fn(model, batch)

    return interrupted


def _save(run: Any, path: str | None, user_scheduler: Any) -> None:
    if path is None:
        return
    extra = {"user_scheduler": user_scheduler.state_dict()} if user_scheduler is not None else {}
    checkpoint.save(path, run, step=run.steps, extra=extra)


def _trained(run: Any, losses: list[torch.Tensor]) -> Trained:
    from xlapipe.transforms.ema import averaged_weights

    states = {k: _plain_state(v) for k, v in run.practice_states().items()}
    average = averaged_weights(run) if "ema" in states else None
    return Trained([float(v) for v in losses], run.state_dict(), states, average)


# -- comparing ---------------------------------------------------------------------------------


def assert_close(got: Any, want: Any, tolerance: float, what: str) -> None:
    """``got`` within ``tolerance`` of ``want``'s norm (plus 1e-6 per element); exact when 0."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, f"{what}: {got!r} against {want!r}"
        g, w = got.detach().cpu().double(), want.detach().cpu().double()
        if tolerance == 0:
            assert torch.equal(g, w), f"{what} differ (max {(g - w).abs().max().item():.3g}; exact expected)"
            return
        bound = tolerance * max(w.norm().item(), 1.0) + (1e-6 if tolerance else 0.0)
        gap = (g - w).abs().max().item() if w.numel() else 0.0
        assert gap <= bound, f"{what} differ by {gap:.3g} (allowed {bound:.3g})"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (
            f"{what}: keys {sorted(got)} against {sorted(want)}"
        )
        for key in want:
            assert_close(got[key], want[key], tolerance, f"{what}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), (
            f"{what}: {len(got)} against {len(want)}"
        )
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, tolerance, f"{what}[{i}]")
    elif isinstance(want, float):
        bound = tolerance * max(abs(want), 1.0) if tolerance else 0.0
        assert abs(got - want) <= bound, f"{what}: {got!r} against {want!r} (allowed {bound:.3g})"
    else:
        assert got == want, f"{what}: {got!r} against {want!r}"


# -- the laws ----------------------------------------------------------------------------------


def claim_for(transform: Transform) -> Claim:
    """The claim of ``transform``'s practice (a transform without one promises nothing more)."""
    return CLAIMS.get(transform.name) or Claim(transform.name, lambda: transform)


def _name(claim: Claim, case: Case) -> str:
    return f"{claim.practice} on {case.name}"


def check_trains_as_eager(claim: Claim, case: Case) -> None:
    """The practice trains ``case`` like its reference loop (see the module docstring)."""
    check_pipeline_trains_as_eager(pipeline_for(claim), case)


def check_pipeline_trains_as_eager(transforms: Sequence[Transform], case: Case) -> None:
    """``transforms`` train ``case`` like the eager loop of their merged references, within the
    loosest of their tolerances."""
    from xlapipe.transforms import with_device

    reference, tolerance = reference_for(transforms), tolerance_for(transforms)
    what = f"{' -> '.join(t.name for t in transforms)} on {case.name}"
    got = train(case, transforms)
    if "dropout" in case.features:  # masks differ between devices: compared with the device alone
        assert reference == Reference(), f"{what}: dropout cases are for practices that keep eager's loop"
        want = train(case, [with_device()])
    else:
        want = eager(case, reference)
    assert_close(got.losses, want.losses, tolerance, f"{what}: the losses")
    assert_close(got.weights, want.weights, tolerance, f"{what}: the weights")
    if want.average is not None:
        assert_close(got.average, want.average, tolerance, f"{what}: the average of the weights")


def stop_at(point: str) -> Stop:
    """Where a run stops to save for ``point`` (the zoo's cases run 2 epochs of 5 batches)."""
    if point == "epoch":
        return lambda run: run.epoch == 1 and run.steps == 5 and run.window == 0
    if point == "mid_window":
        return lambda run: run.steps > 5 and run.window > 0
    if point in ("mid_epoch", "second_save"):
        return lambda run: run.steps > 5 and run.window == 0 and run.epoch == 1 and run.steps < 10
    raise ValueError(f"unknown save point {point!r}; known: {', '.join(SAVE_POINTS)}")


def resumable_pipeline(claim: Claim, point: str) -> list[Transform]:
    """The claim's pipeline, with accumulation for a save inside a window (when it has none)."""
    if point != "mid_window":
        return pipeline_for(claim)
    from xlapipe.transforms import accumulate_grad

    return pipeline_for(claim, extra=[accumulate_grad(2)])


def check_resumes(claim: Claim, case: Case, point: str, folder: str | None = None) -> None:
    """A save at ``point`` resumes bit for bit where claimed, and is refused elsewhere."""
    transforms = resumable_pipeline(claim, point)
    what = f"{_name(claim, case)}, saved {SAVE_POINTS[point]}"
    refusals = [r for t in transforms if (r := claim_for(t).save_refusal(case.features, point)) is not None]
    with _folder(folder) as where:
        path = os.path.join(where, "run.pt")
        if point not in claim.resumes or refusals:
            match = refusals[0].match if refusals else None
            with pytest_raises((ValueError, RuntimeError), what, match):
                train(case, transforms, stop=stop_at(point), save_to=path)
            assert not os.path.exists(path), f"{what}: a refused save wrote {path}"
            return
        whole = train(case, transforms)
        first = train(case, transforms, stop=stop_at(point), save_to=path)
        if point == "second_save":
            second_path = os.path.join(where, "second.pt")
            # the next step after the restore, whatever the window (accumulate_grad(3) first saves at 8)
            again = len(first.losses) + 1
            middle = train(
                case, transforms, resume_from=path, stop=lambda run: run.steps == again, save_to=second_path
            )
            assert os.path.exists(second_path), f"{what}: the restored run never reached its second save"

            rest = train(case, transforms, resume_from=second_path)
            losses = first.losses + middle.losses + rest.losses
        else:
            rest = train(case, transforms, resume_from=path)
            losses = first.losses + rest.losses
        assert_close(losses, whole.losses, 0.0, f"{what}: the losses")
        assert_close(rest.weights, whole.weights, 0.0, f"{what}: the weights")
        assert_close(rest.states, whole.states, 0.0, f"{what}: the practice states")


def check_preempted(claim: Claim, case: Case, folder: str | None = None) -> None:
    """SIGTERM inside an epoch under ``checkpoint_on_preemption``: the run saves at the step's end and
    stops (status 143); started again, it continues bit for bit as the run that was not stopped. Or the
    pipeline is refused when it is built."""
    from xlapipe.transforms import checkpoint_on_preemption

    with _folder(folder) as where:
        transforms = pipeline_for(
            claim, extra=[checkpoint_on_preemption(os.path.join(where, "preempted.pt"))]
        )
        path = next(dict(t.params)["path"] for t in transforms if t.name == "checkpoint_on_preemption")
        what = f"{_name(claim, case)} under checkpoint_on_preemption"
        from xlapipe import effects

        before = _process_state(effects.snapshot())
        try:
            whole = train(case, transforms)
        except (OrderError, ValueError, TypeError, RuntimeError) as refused:
            _refused_when_built(refused, transforms, case, what)
            return
        assert not os.path.exists(path), f"{what}: a run that finished left {path} behind"
        try:
            train(case, transforms, signal_at=7)
        except Interrupted as stopped:
            first = stopped.losses
            assert stopped.status == 128 + signal.SIGTERM, f"{what}: stopped with status {stopped.status}"
        else:
            raise AssertionError(f"{what}: SIGTERM before step 7 did not stop the run")
        assert os.path.exists(path), f"{what}: the run stopped by SIGTERM saved nothing at {path}"
        rest = train(case, transforms)
        assert _process_state(effects.snapshot()) == before, f"{what}: process-wide state not restored"
        # the step SIGTERM arrived in finishes and is saved; its loss goes with the stopped loop
        assert len(first) + 1 + len(rest.losses) == len(whole.losses), (
            f"{what}: {len(rest.losses)} steps after"
        )
        assert_close(
            first + rest.losses,
            whole.losses[: len(first)] + whole.losses[len(first) + 1 :],
            0.0,
            f"{what}: the losses",
        )
        assert_close(rest.weights, whole.weights, 0.0, f"{what}: the weights")
        assert_close(rest.states, whole.states, 0.0, f"{what}: the practice states")


def _refused_when_built(
    refused: BaseException, transforms: Sequence[Transform], case: Case, what: str
) -> None:
    """``refused`` came when the pipeline or the session was built (not at a step), and says why."""
    setup = _setup(case)
    try:
        with session(Pipeline(*transforms)(setup)):
            pass
    except Exception as again:  # noqa: BLE001 - any refusal, as long as it comes before a step
        assert str(again), f"{what}: refused without a message"
        return
    raise AssertionError(f"{what}: refused only after the session started ({refused!r})")


def check_interrupted(claim: Claim, case: Case) -> None:
    """Ctrl-C inside a step's forward, or an error in an evaluation between steps: the session ends,
    process-wide state is as before, and the run keeps the weights of its last completed step."""
    from xlapipe import effects

    transforms = pipeline_for(claim)
    stopped = train(case, transforms, stop=lambda run: run.steps == 7)
    # what an evaluation changes (an LSTM's state buffer) is kept: compared with a run that evaluated
    evaluated = train(case, transforms, stop=lambda run: run.steps == 7, evaluate_at=7)
    ways: list[tuple[str, dict[str, Any], Trained]] = [
        ("Ctrl-C in step 8", {"interrupt_at": 7}, stopped),
        ("an evaluation failing after step 7", {"evaluation_fails_at": 7}, evaluated),
    ]
    for how, kwargs, want in ways:
        what = f"{_name(claim, case)}, {how}"
        before = _process_state(effects.snapshot())
        kept = train(case, transforms, **kwargs)
        assert _process_state(effects.snapshot()) == before, f"{what}: process-wide state not restored"
        assert_close(kept.losses, want.losses, 0.0, f"{what}: the losses")
        assert_close(kept.weights, want.weights, 0.0, f"{what}: the weights kept")


def _process_state(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a session must leave as it found it: the snapshot, and who handles SIGTERM and SIGINT."""
    snapshot["environ"].pop("PYTEST_CURRENT_TEST", None)
    return {
        **snapshot,
        "sigterm": signal.getsignal(signal.SIGTERM),
        "sigint": signal.getsignal(signal.SIGINT),
    }


def check_refuses(claim: Claim, case: Case) -> None:
    """A case the claim refuses is refused when built, with the claimed message."""
    refusal = claim.refusal(case.features)
    assert refusal is not None, f"{_name(claim, case)}: the claim refuses none of {sorted(case.features)}"
    setup = _setup(case)
    what = f"{_name(claim, case)} (refused for {refusal.feature} when the {refusal.when} is built)"
    if refusal.when == "build":
        with pytest_raises((OrderError, ValueError, TypeError), what, refusal.match):
            Pipeline(*pipeline_for(claim))(setup)
        return
    realised = Pipeline(*pipeline_for(claim))(setup)
    with pytest_raises(Exception, what, refusal.match):
        with session(realised):
            pass


@contextlib.contextmanager
def pytest_raises(kinds: Any, what: str, match: str | None = None) -> Iterator[None]:
    """Like ``pytest.raises``, without pytest: the block must raise ``kinds`` matching ``match``."""
    try:
        yield
    except kinds as error:
        if match is not None:
            assert re.search(match, str(error)), (
                f"{what}: refused with {error!r}, which does not say {match!r}"
            )
        return
    raise AssertionError(f"{what}: nothing was refused")


@contextlib.contextmanager
def _folder(folder: str | None) -> Iterator[str]:
    if folder is not None:
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="xlapipe-claims-") as made:
        yield made


def known_failure(claim: Claim, case: Case, law: str) -> Known | None:
    """The known failure of ``law`` (``"resumes:epoch"``) on ``case`` that the claim, or the claim of
    anything its pipeline holds (``with_device``'s, say), lists; None when there is none."""
    kind, _, point = law.partition(":")
    transforms = resumable_pipeline(claim, point) if kind == "resumes" else pipeline_for(claim)
    found = (c.known_failure(law, case.features) for c in [claim, *map(claim_for, transforms)])
    return next((k for k in found if k is not None), None)


def applicable(claim: Claim, case: Case) -> bool:
    """Whether the harness crosses ``claim`` with ``case``: the case has what the practice is for, and a
    case with dropout (compared device to device) meets only practices that keep eager's loop."""
    if not claim.applies(case.features):
        return False
    return "dropout" not in case.features or claim.reference(claim.transform()) == Reference()


def check_claim(claim: Claim, case: Case, law: str, point: str = "mid_epoch") -> None:
    """The law ``law`` ("trains_as_eager", "resumes" or "refuses") on ``(claim, case)``: when the claim
    refuses the case, the law checked is the refusal."""
    if claim.refusal(case.features) is not None:
        check_refuses(claim, case)
    elif law == "trains_as_eager":
        check_trains_as_eager(claim, case)
    elif law == "resumes":
        check_resumes(claim, case, point)
    elif law == "preempted":
        check_preempted(claim, case)
    elif law == "interrupted":
        check_interrupted(claim, case)
    else:
        raise ValueError(f"unknown law {law!r}; laws: {', '.join(LAWS)}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m xlapipe.testing.harness PRACTICE CASE LAW[:POINT] ...``: each law on (claim, case),
    in this process (for practices that need a fresh one: ``Claim.own_process``). The XLA runtime is
    left for the practice to start (``shard_data`` switches SPMD on before it)."""
    import sys

    from xlapipe import claims
    from xlapipe.testing.zoo import case

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3:
        print(main.__doc__, file=sys.stderr)
        return 2
    name, case_name, laws = args[0], args[1], args[2:]
    for law in laws:
        kind, _, point = law.partition(":")
        check_claim(claims.claim_of(name), case(case_name), kind, point or "mid_epoch")
        print(f"{name} on {case_name}: {law} holds", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
