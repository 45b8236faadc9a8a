"""ema and checkpoint_on_preemption: the defects users found (issue 27), each pinned by a test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_setup
from xlapipe import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
EMA = xp.Pipeline(xp.with_device(), xp.ema(0.9))


def equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def trained(run: xp.Run, steps: int = 3) -> None:
    for i, batch in enumerate(run.batches("train")):
        if i == steps:
            break
        run.step(batch, loss_fn)


# -- ema -----------------------------------------------------------------------------------------


def test_a_save_inside_using_averaged_weights_writes_the_model_and_the_average_each_in_its_place(tmp_path):
    with xp.session(EMA(tiny_setup())) as run:
        trained(run)
        weights, average = run.state_dict(), xp.averaged_weights(run)
        assert not equal(weights, average)
        with xp.using_averaged_weights(run):
            assert equal(run.state_dict(), average)  # the block lends the average to the model
            checkpoint.save(tmp_path / "inside.pt", run, step=run.steps)
            assert equal(run.state_dict(), average)  # and still does after the save
        assert equal(run.state_dict(), weights)
    saved = checkpoint.load(tmp_path / "inside.pt")
    assert equal(saved["model"], weights)
    assert equal(saved["practices"]["ema"]["average"], average)
    # A restore inside the block puts each back in its place too.
    with xp.session(EMA(tiny_setup(seed=5))) as run:
        with xp.using_averaged_weights(run):
            checkpoint.restore(tmp_path / "inside.pt", run)
            assert equal(run.state_dict(), average)
        assert equal(run.state_dict(), weights)
        assert equal(xp.averaged_weights(run), average)


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_the_average_is_kept_when_the_session_fails(error):
    with pytest.raises(type(error)):
        with xp.session(EMA(tiny_setup())) as run:
            trained(run)
            average = xp.averaged_weights(run)
            raise error
    assert equal(xp.averaged_weights(run), average)


def test_the_average_is_kept_when_the_session_ends_and_a_run_without_ema_still_says_so():
    with xp.session(EMA(tiny_setup())) as run:
        trained(run)
        average = xp.averaged_weights(run)
    assert equal(xp.averaged_weights(run), average)
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as plain:
        trained(plain, 1)
    with pytest.raises(ValueError, match=r"keeps no average of its weights: add xlapipe.ema\(decay\)"):
        xp.averaged_weights(plain)
    with pytest.raises(RuntimeError, match="boom"):
        with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as plain:
            raise RuntimeError("boom")
    with pytest.raises(ValueError, match=r"keeps no average of its weights: add xlapipe.ema\(decay\)"):
        xp.averaged_weights(plain)


def test_a_restore_refused_for_another_decay_changes_nothing(tmp_path):
    with xp.session(EMA(tiny_setup())) as run:
        trained(run)
        checkpoint.save(tmp_path / "ema.pt", run, step=run.steps)
    other = xp.Pipeline(xp.with_device(), xp.ema(0.5))
    with xp.session(other(tiny_setup(seed=3))) as run:
        trained(run, 1)
        weights, average, steps = run.state_dict(), xp.averaged_weights(run), run.steps
        with pytest.raises(ValueError, match=r"decay 0.9, this run's is 0.5.*Nothing was changed"):
            checkpoint.restore(tmp_path / "ema.pt", run)
        assert equal(run.state_dict(), weights) and equal(xp.averaged_weights(run), average)
        assert run.steps == steps
    # Replaces test_protocol's test_a_checkpoint_with_practice_state_fits_only_a_run_keeping_it.
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as run:
        with pytest.raises(ValueError, match=r"the practices \['ema'\] and this run keeps state for \[\]"):
            checkpoint.restore(tmp_path / "ema.pt", run)


def test_training_inside_using_averaged_weights_is_refused_and_changes_nothing():
    with xp.session(EMA(tiny_setup())) as run:
        trained(run, 1)
        batch = next(iter(run.batches("train")))
        weights, average, steps, epoch = run.state_dict(), xp.averaged_weights(run), run.steps, run.epoch
        with xp.using_averaged_weights(run):
            with pytest.raises(ValueError, match="inside `with xlapipe.using_averaged_weights"):
                run.step(batch, loss_fn)
            with pytest.raises(ValueError, match="inside `with xlapipe.using_averaged_weights"):
                run.end_epoch()
            with pytest.raises(ValueError, match="inside another such block"):
                with xp.using_averaged_weights(run):
                    pass
            assert equal(run.state_dict(), average)
        assert (run.steps, run.epoch) == (steps, epoch)
        assert equal(run.state_dict(), weights) and equal(xp.averaged_weights(run), average)
        run.step(batch, loss_fn)  # outside the block it trains on
        assert run.steps == steps + 1


# -- checkpoint_on_preemption --------------------------------------------------------------------


def preemptible(path, *practices: xp.Transform) -> xp.Pipeline:
    return xp.Pipeline(xp.with_device(), *practices, xp.checkpoint_on_preemption(str(path)))


def preempt(path, setup: xp.TrainingSetup, after: int = 2) -> None:
    """Train ``setup`` under the practice until a SIGTERM (sent to this process) stops it."""
    with pytest.raises(xp.Preempted):
        with xp.session(preemptible(path)(setup)) as run:
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
                if run.steps == after:
                    os.kill(os.getpid(), signal.SIGTERM)
    assert os.path.exists(path)


def test_compile_step_with_the_optimizer_excludes_checkpoint_on_preemption():
    for pair in (
        (xp.compile_step(optimizer=True), xp.checkpoint_on_preemption()),
        (xp.checkpoint_on_preemption(), xp.compile_step(optimizer=True)),
    ):
        with pytest.raises(xp.OrderError, match="with optimizer=True checkpoints are refused"):
            xp.Pipeline(xp.with_device(), *pair)
    xp.Pipeline(xp.with_device(), xp.compile_step(), xp.checkpoint_on_preemption())  # allowed


class Batches:
    """An iterable of batches that is neither a DataLoader, a list, nor a loader with state_dict."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def dropout_setup() -> xp.TrainingSetup:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))
    return xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": tiny_loader()})


def iterable_setup() -> xp.TrainingSetup:
    setup = tiny_setup()
    return xp.TrainingSetup(setup.model, setup.optimizer, {"train": Batches(list(tiny_loader()))})


@pytest.mark.parametrize(
    ("make", "practices", "cause"),
    [
        (dropout_setup, (xp.compile_step(),), r"the model has dropout \(1\) and compile_step"),
        (iterable_setup, (), r"loader 'train' is a Batches, whose position inside an epoch"),
    ],
    ids=["compiled-dropout", "plain-iterable"],
)
def test_a_run_that_could_not_be_saved_at_sigterm_is_refused_when_its_session_starts(
    tmp_path, make, practices, cause
):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError, match=f"checkpoint_on_preemption: .*{cause}"):
        with xp.session(preemptible(tmp_path / "p.pt", *practices)(make())):
            pass
    assert signal.getsignal(signal.SIGTERM) is before


class FunctionalDropout(torch.nn.Module):
    """Dropout no module shows: only the compiled graph does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.last = torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.nn.functional.dropout(self.first(x), 0.2, training=self.training))


def test_a_compiled_forward_that_draws_random_numbers_is_refused_at_the_first_step(tmp_path):
    model = FunctionalDropout()
    setup = xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": tiny_loader()})
    with pytest.raises(ValueError, match=r"could not be saved at a SIGTERM.*random ops \(dropout\)"):
        with xp.session(preemptible(tmp_path / "p.pt", xp.compile_step())(setup)) as run:
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
    assert run.steps == 1


def test_a_finished_run_removes_its_file_and_a_failed_one_keeps_it(tmp_path):
    path = tmp_path / "p.pt"
    preempt(path, tiny_setup())
    with pytest.raises(RuntimeError, match="boom"):
        with xp.session(preemptible(path)(tiny_setup())) as run:
            assert run.steps == 3  # resumed after the step the signal came in
            raise RuntimeError("boom")
    assert path.exists()
    with xp.session(preemptible(path)(tiny_setup())) as run:
        assert run.steps == 3
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
    assert not path.exists()
    with xp.session(preemptible(path)(tiny_setup())) as run:  # the next run starts fresh
        assert run.steps == 0


def test_a_file_of_another_run_is_refused_naming_it_and_what_differs(tmp_path):
    path = tmp_path / "p.pt"
    preempt(path, tiny_setup())
    other = tiny_setup()
    other.optimizer.param_groups[0]["lr"] = 0.2  # another --lr
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError, match=r"p.pt' was written by another run: its optimizer differ") as error:
        with xp.session(preemptible(path)(other)):
            pass
    assert "delete" in str(error.value) and "Nothing was restored" in str(error.value)
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(ValueError, match="its pipeline differ"):  # an ablation's variant
        with xp.session(preemptible(path, xp.ema(0.9))(tiny_setup())):
            pass
    assert path.exists()  # a refused run leaves the file to the run that wrote it
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as run:
        checkpoint.save(path, run, step=0)  # a checkpoint of the user's own at that path
    with pytest.raises(ValueError, match="records no run identity"):
        with xp.session(preemptible(path)(tiny_setup())):
            pass


def test_the_sigterm_handler_is_put_back_when_the_session_fails(tmp_path):
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        for error in (RuntimeError("boom"), KeyboardInterrupt()):
            with pytest.raises(type(error)):
                with xp.session(preemptible(tmp_path / "p.pt")(tiny_setup())) as run:
                    run.step(next(iter(run.batches("train"))), loss_fn)
                    raise error
            assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- a real SIGTERM to the whole process group, with DataLoader workers ---------------------------

GROUP = """
import os, sys
sys.path.insert(0, {tests!r})
import torch, torch_xla
torch_xla.device()
import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_setup

setup = tiny_setup("adamw")
generator = torch.Generator().manual_seed(7)
loader = torch.utils.data.DataLoader(
    tiny_loader(n=160).dataset, batch_size=16, shuffle=True, generator=generator, num_workers=2
)
setup = xp.TrainingSetup(setup.model, setup.optimizer, {{"train": loader}})
pipeline = xp.Pipeline(xp.with_device(), xp.accumulate_grad(3), xp.ema(0.9), xp.checkpoint_on_preemption({path!r}))
torch.manual_seed(0)
with xp.session(pipeline(setup)) as run:
    print("start", run.epoch, run.steps, flush=True)
    for epoch in range(run.epoch, 3):
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            if run.steps == 13:
                print("ready", flush=True)
                sys.stdin.readline()  # the test sends SIGTERM to the group, then lets it go on
    torch.save({{"weights": run.state_dict(), "average": xp.averaged_weights(run)}}, sys.argv[1])
print("done", flush=True)
"""


def test_sigterm_to_the_process_group_with_dataloader_workers_saves_and_resumes_exactly(tmp_path):
    script = tmp_path / "train.py"
    path = tmp_path / "preempted.pt"
    script.write_text(textwrap.dedent(GROUP.format(tests=HERE, path=str(path))))
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"}

    def train(out: str, kill: bool) -> tuple[int, str, str]:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / out)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("ready"):
                    if kill:
                        os.killpg(proc.pid, signal.SIGTERM)  # what a VM's shutdown sends: everyone
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                    break
            rest, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        return proc.returncode, "".join(lines) + rest, err

    code, out, err = train("straight.pt", kill=False)
    assert code == 0, err[-2000:]
    assert not path.exists()
    code, out, err = train("resumed.pt", kill=True)
    assert code == 143, err[-3000:]
    assert "saved the run after step 14" in err and "done" not in out
    assert path.exists()
    code, out, err = train("resumed.pt", kill=False)
    assert code == 0, err[-2000:]
    assert "start 1 14" in out
    assert not path.exists()  # the run finished: its file is gone
    want, got = torch.load(tmp_path / "straight.pt"), torch.load(tmp_path / "resumed.pt")
    for part in ("weights", "average"):
        for key in want[part]:
            assert torch.equal(got[part][key], want[part][key]), (part, key)


HERE = os.path.dirname(os.path.abspath(__file__))


PREEMPTIBLE = """
import os, sys, time
sys.path.insert(0, {tests!r})
import torch, torch_xla
torch_xla.device()
import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_setup

setup = tiny_setup("adamw")
generator = torch.Generator().manual_seed(7)
loader = torch.utils.data.DataLoader(tiny_loader(n=160).dataset, batch_size=16, shuffle=True, generator=generator)
setup = xp.TrainingSetup(setup.model, setup.optimizer, {{"train": loader}})
practices = [xp.checkpoint_on_preemption({path!r})] if {preemptible} else []
pipeline = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(), xp.accumulate_grad(3), xp.ema(0.9), *practices)
torch.manual_seed(0)
with xp.session(pipeline(setup)) as run:
    print("start", run.epoch, run.steps, flush=True)
    for epoch in range(run.epoch, 3):
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            if {preemptible} and run.steps == 13 and not os.path.exists({path!r}):
                os.kill(os.getpid(), {signal})  # what the TPU VM's agent sends, here mid-epoch
    torch.save({{"weights": run.state_dict(), "average": xp.averaged_weights(run)}}, {out!r})
print("done", flush=True)
"""


def test_sigterm_saves_at_the_step_boundary_and_the_script_resumes_exactly(tmp_path):
    def script(preemptible: bool, out: str) -> str:
        body = PREEMPTIBLE.format(
            tests=HERE,
            path=str(tmp_path / "preempted.pt"),
            preemptible=preemptible,
            out=str(tmp_path / out),
            signal=int(signal.SIGTERM),
        )
        path = tmp_path / f"train_{preemptible}.py"
        path.write_text(textwrap.dedent(body))
        return str(path)

    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"}
    run = lambda path: subprocess.run(  # noqa: E731
        [sys.executable, path], capture_output=True, text=True, env=env, timeout=600
    )
    straight = run(script(False, "straight.pt"))
    assert straight.returncode == 0, straight.stderr[-2000:]
    preemptible = script(True, "resumed.pt")
    first = run(preemptible)
    assert first.returncode == 143, first.stderr[-2000:]
    # The signal came between steps 13 and 14: step 14 ran whole, then the run was saved.
    assert "saved the run after step 14" in first.stderr and "done" not in first.stdout
    assert (tmp_path / "preempted.pt").exists() and not (tmp_path / "resumed.pt").exists()
    second = run(preemptible)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "start 1 14" in second.stdout  # epoch 1 (of 0, 1, 2), after step 14: inside the epoch
    want, got = torch.load(tmp_path / "straight.pt"), torch.load(tmp_path / "resumed.pt")
    for part in ("weights", "average"):
        for key in want[part]:
            assert torch.equal(got[part][key], want[part][key]), (part, key)
