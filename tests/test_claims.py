"""Every practice's claim held against eager PyTorch on the zoo (xlapipe.claims, xlapipe.testing.harness).

CI runs a fixed, representative slice (SLICE below: every practice on the plain
case and across the save points, every zoo case under with_device, and the
crossings that found defects); ``make fuzz`` runs the whole matrix (every
claim on every case it applies to, every law and save point) and a long
hypothesis profile over pipelines of several practices.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xlapipe as xp
from xlapipe import claims
from xlapipe.claims import Claim, Known, Refusal
from xlapipe.testing import first_broken_relation, harness
from xlapipe.testing.zoo import ZOO, Case, case

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = sorted(n for n, c in claims.CLAIMS.items() if not c.own_process)
POINTS = list(claims.SAVE_POINTS)


def crossings(names, cases, laws):
    """(practice, case, law) triples the claims apply to, each marked as its claim's known failures say."""
    out = []
    for name in names:
        claim = claims.claim_of(name)
        for c in cases:
            if not harness.applicable(claim, c):
                continue
            for law in laws:
                marks = []
                known = harness.known_failure(claim, c, law)
                if known is not None and claim.refusal(c.features) is None:
                    marks.append(pytest.mark.xfail(strict=True, reason=known.reason))
                out.append(pytest.param(name, c.name, law, marks=marks, id=f"{name}-{c.name}-{law}"))
    return out


def run_law(name: str, case_name: str, law: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # practices that write (a trace, a preemption file) write here
    law, _, point = law.partition(":")
    harness.check_claim(claims.claim_of(name), case(case_name), law, point or "mid_epoch")


PLAIN = [case("plain")]
# Practices that act in the step, its update, the loader or a save: the preemption and interruption
# laws cross them in CI; every other practice under make fuzz.
AROUND_THE_STEP = [
    "accumulate_grad",
    "checkpoint_on_preemption",
    "clip_grad_norm",
    "compile_step",
    "ema",
    "log_every",
    "with_device",
    "wrap_loader_mp",
]
SLICE = (
    crossings(SHARED, PLAIN, ["trains_as_eager", "resumes:mid_window"])
    + crossings(AROUND_THE_STEP, PLAIN, ["preempted", "interrupted"])
    + crossings(["with_device"], ZOO, ["trains_as_eager", "resumes:mid_epoch"])
    + crossings(["with_device"], PLAIN, [f"resumes:{p}" for p in POINTS])
    + crossings(["with_device"], [case("lr_relative"), case("plateau")], ["resumes:epoch"])
    + crossings(["with_device"], [case("lstm_state")], ["interrupted"])  # an evaluation changes its state
    + crossings(["accumulate_grad"], PLAIN, ["resumes:second_save"])  # a second save inside a window
    + crossings(["checkpoint_on_preemption"], [case("iterable")], ["refuses"])
    + crossings(
        ["compile_step"],
        [
            case(n)
            for n in (
                "batched_svd",
                "batchnorm",
                "elu",
                "frozen_bn",
                "lstm_state",
                "reductions",
                "resize",
                "std_norm",
            )
        ],
        ["trains_as_eager"],
    )
    + crossings(
        ["accumulate_grad"],
        [case(n) for n in ("unused_branch", "rate0_group", "dict_batch")],
        ["trains_as_eager"],
    )
    + crossings(["ema"], [case(n) for n in ("batchnorm", "tied")], ["trains_as_eager", "resumes:mid_epoch"])
    + crossings(["ema"], [case("lstm_state")], ["trains_as_eager"])  # a buffer replaced every batch
    + crossings(["clip_grad_norm"], [case("frozen_params")], ["trains_as_eager"])
    + crossings(
        ["wrap_loader_mp"],
        [case(n) for n in ("list_loader", "iterable", "workers")],
        ["trains_as_eager", "resumes:mid_epoch"],
    )
    + crossings(["static_shapes", "hf_traced_masks"], [case("text"), case("hf_bert")], ["trains_as_eager"])
    + crossings(["hf_traced_masks"], PLAIN, ["refuses"])
    + crossings(["scan_layers"], [case("layer_stack")], ["trains_as_eager", "resumes:mid_epoch"])
)
FULL = crossings(
    SHARED, ZOO, ["trains_as_eager", *(f"resumes:{p}" for p in POINTS), "preempted", "interrupted"]
)
SLICED = {p.id for p in SLICE}


@pytest.mark.parametrize(("name", "case_name", "law"), SLICE)
def test_claim_holds(name, case_name, law, tmp_path, monkeypatch):
    run_law(name, case_name, law, tmp_path, monkeypatch)


@pytest.mark.claims_full
@pytest.mark.parametrize(("name", "case_name", "law"), [p for p in FULL if p.id not in SLICED])
def test_claim_holds_everywhere(name, case_name, law, tmp_path, monkeypatch):
    run_law(name, case_name, law, tmp_path, monkeypatch)


# -- pipelines of several practices, drawn ---------------------------------------------------------

FUZZ = os.environ.get("XLAPIPE_FUZZ") == "1"  # make fuzz: the long profile


@settings(
    max_examples=200 if FUZZ else 4,
    derandomize=not FUZZ,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    names=st.lists(
        st.sampled_from([n for n in SHARED if not claims.claim_of(n).applies_to]), unique=True, max_size=4
    ),
    case_name=st.sampled_from(
        ["plain", "batchnorm", "unused_branch", "dict_batch", "tied", "adamw_scheduled"]
    ),
)
def test_drawn_pipelines_train_as_eager(names, case_name):
    chosen = [claims.claim_of(n) for n in names]
    transforms = harness.pipeline_for(*chosen)
    c = case(case_name)
    if first_broken_relation(transforms) is not None:
        with pytest.raises(xp.OrderError):
            xp.Pipeline(*transforms)
        return
    refusal = next((r for cl in chosen if (r := cl.refusal(c.features)) is not None), None)
    known = next((k for cl in chosen if (k := cl.known_failure("trains_as_eager", c.features))), None)
    if FUZZ:
        print(f"drawn: {' -> '.join(t.name for t in transforms)} on {case_name}")
    if refusal is not None or known is not None:
        return  # what one practice refuses or is known to fail is its own crossing's test
    harness.check_pipeline_trains_as_eager(transforms, c)


# -- practices that need a fresh process ------------------------------------------------------------

OWN = sorted(n for n, c in claims.CLAIMS.items() if c.own_process)
OWN_ENV = {"shard_data": {"CPU_NUM_DEVICES": "4"}}


@pytest.mark.parametrize("name", OWN)
def test_claim_holds_in_a_fresh_process(name, tmp_path):
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1", **OWN_ENV.get(name, {})}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "xlapipe.testing.harness",
            name,
            "plain",
            "trains_as_eager",
            "resumes:mid_epoch",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.count("holds") == 2, done.stdout


# -- the harness bites: practices that break their claim are caught -------------------------------


class _Halve(xp.Hook):
    """A practice that silently halves every gradient (a wrong 'average')."""

    def on_gradients(self) -> None:
        for p in self.run.optimizer.param_groups[0]["params"]:
            p.grad.mul_(0.5)

    def start(self, run):
        part = _Halve()
        part.run = run
        return part


class _Counter(xp.Hook):
    """A practice whose per-run state is not in its state_dict (lost at a checkpoint)."""

    def start(self, run):
        part = _Counter()
        part.seen = torch.zeros((), device=run.device)
        part.run = run
        return part

    def after_update(self) -> None:
        self.seen += 1
        with torch.no_grad():
            for p in self.run.optimizer.param_groups[0]["params"]:
                p.mul_(1 - 1e-3 * self.seen)


def _claim(name: str, hook: xp.Hook, **kwargs) -> Claim:
    return Claim(name, lambda: xp.Transform(name, needs=("with_device",), hooks=(hook,)), **kwargs)


def test_the_harness_catches_a_practice_that_trains_differently():
    with pytest.raises(AssertionError, match="halves on plain: the losses"):
        harness.check_trains_as_eager(_claim("halves", _Halve()), case("plain"))


def test_the_harness_catches_state_a_checkpoint_loses():
    with pytest.raises(AssertionError, match="forgets on plain, saved between two epochs"):
        harness.check_resumes(_claim("forgets", _Counter()), case("plain"), "epoch")


def test_the_harness_catches_a_save_that_should_have_been_refused():
    with pytest.raises(AssertionError, match="nothing was refused"):
        harness.check_resumes(_claim("plain_practice", xp.Hook(), resumes=()), case("plain"), "mid_epoch")


def test_the_harness_catches_a_refusal_that_does_not_come():
    claim = _claim("lax", xp.Hook(), refuses=[Refusal("plain", "never said", when="session")])
    with pytest.raises(AssertionError, match="nothing was refused"):
        harness.check_refuses(claim, case("plain"))


# -- the claims themselves ---------------------------------------------------------------------------


def test_every_practice_states_its_claims():
    from xlapipe.transform import FACTORIES

    built_in = {n for n, f in FACTORIES.items() if f.__module__.startswith("xlapipe.transforms.")}
    assert len(built_in) == 20 and built_in <= set(claims.CLAIMS), sorted(built_in - set(claims.CLAIMS))
    for claim in claims.CLAIMS.values():
        assert claim.summary, f"{claim.practice}'s claim has no summary for the docs"
        assert claim.transform().name == claim.practice


def test_refusals_and_known_failures_name_zoo_features():
    from xlapipe.testing.zoo import FEATURES

    for claim in claims.CLAIMS.values():
        named = [r.feature.lstrip("!") for r in claim.refuses] + [k.feature for k in claim.known]
        assert set(named) <= set(FEATURES), (claim.practice, named)
        assert claim.applies_to <= set(FEATURES), claim.practice


def test_the_docs_claims_table_is_current():
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "claims_table.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_claim_is_refused_when_malformed():
    with pytest.raises(ValueError, match="unknown save points"):
        Claim("x", xp.with_device, resumes={"halfway"})
    with pytest.raises(ValueError, match="unknown law"):
        Claim("x", xp.with_device, known=[Known("trains_fast", "plain", "why")])
    with pytest.raises(ValueError, match="tolerance"):
        Claim("x", xp.with_device, tolerance=2.0)
    with pytest.raises(ValueError, match="when must be one of"):
        Refusal("plain", "x", when="later")
    with pytest.raises(TypeError, match="must build a other transform"):
        Claim("other", xp.with_device).transform()
    with pytest.raises(ValueError, match="already has a claim"):
        claims.declare(Claim("with_device", xp.with_device, summary="something else"))
    with pytest.raises(KeyError, match="declares no claim"):
        claims.claim_of("no_such_practice")
    with pytest.raises(ValueError, match="unknown features"):
        Case("bad", {"quantum"}, torch.nn.Identity, list, harness.assert_close)
