"""The paths real training scripts take off the examples' road, each as right as the examples (issue 19)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from attrs import frozen

import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_model, tiny_setup
from xlapipe import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))


def shuffled_setup(seed: int = 0, n: int = 96) -> xp.TrainingSetup:
    setup = tiny_setup("adamw", seed=seed)
    generator = torch.Generator().manual_seed(7)
    loader = torch.utils.data.DataLoader(
        tiny_loader(n=n).dataset, batch_size=16, shuffle=True, generator=generator
    )
    return xp.TrainingSetup(setup.model, setup.optimizer, {"train": loader})


def params(run: xp.Run) -> list[torch.Tensor]:
    return [t.clone() for t in run.state_dict().values()]


# -- the learning rate, set by hand -------------------------------------------------------------


def eager_decaying_rate() -> list[float]:
    setup = tiny_setup("adamw")
    losses = []
    for it, batch in enumerate(setup.loaders["train"]):
        for group in setup.optimizer.param_groups:
            group["lr"] = 1e-2 * 0.5**it
        setup.optimizer.zero_grad()
        loss = loss_fn(setup.model, batch)
        loss.backward()
        setup.optimizer.step()
        losses.append(loss.item())
    return losses


def test_a_rate_set_on_the_users_own_optimizer_takes_effect():
    # nanoGPT sets param_group["lr"] on the optimizer it built; the run trained a copy at the first rate.
    setup = tiny_setup("adamw")
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        got = []
        for it, batch in enumerate(run.batches("train")):
            for group in setup.optimizer.param_groups:  # the user's own optimizer
                group["lr"] = 1e-2 * 0.5**it
            got.append(float(run.step(batch, loss_fn)))
        assert run.optimizer.param_groups[0]["lr"] == 1e-2 * 0.5**3
    np.testing.assert_allclose(got, eager_decaying_rate(), rtol=1e-6)


def test_a_rate_set_on_the_users_optimizer_while_the_run_schedules_it_is_refused():
    setup = tiny_setup("adamw").evolve(scheduler=lambda opt: torch.optim.lr_scheduler.LinearLR(opt))
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        batches = list(run.batches("train"))
        run.step(batches[0], loss_fn)
        setup.optimizer.param_groups[0]["lr"] = 0.5
        with pytest.raises(ValueError, match="set by its scheduler"):
            run.step(batches[1], loss_fn)


def test_a_value_set_on_both_optimizers_or_a_group_added_is_refused():
    setup = tiny_setup("adamw")
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        batch = next(iter(run.batches("train")))
        setup.optimizer.param_groups[0]["weight_decay"] = 0.5
        run.optimizer.param_groups[0]["weight_decay"] = 0.25
        with pytest.raises(
            ValueError, match=r"weight_decay of group 0 was set both on your optimizer \(0.5\)"
        ):
            run.step(batch, loss_fn)
    setup = tiny_setup("adamw")
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        setup.optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
        with pytest.raises(ValueError, match="parameter groups .* changed during the session"):
            run.step(next(iter(run.batches("train"))), loss_fn)


def test_reduce_on_plateau_is_stepped_by_the_user_with_its_metric():
    plateau = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)  # noqa: E731
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup("adamw").evolve(scheduler=plateau))) as run:
        for batch in run.batches("train"):
            run.step(batch, loss_fn)  # not stepped after updates: it needs a metric
        assert run.optimizer.param_groups[0]["lr"] == 1e-2
        for metric in (1.0, 2.0):
            run.scheduler.step(metric)
        assert run.optimizer.param_groups[0]["lr"] == 5e-3
    # Built on the user's own optimizer and stepped there: it reaches the run too.
    setup = tiny_setup("adamw")
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(setup.optimizer, factor=0.5, patience=0)
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        batches = list(run.batches("train"))
        for metric in (1.0, 2.0):
            scheduler.step(metric)
        run.step(batches[0], loss_fn)
        assert run.optimizer.param_groups[0]["lr"] == 5e-3


# -- where a run is in its loaders ------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [(), (xp.wrap_loader_mp(),), (xp.accumulate_grad(3), xp.wrap_loader_mp(batches_per_execution=3))],
    ids=["plain", "wrap_loader_mp", "accumulate+batches_per_execution"],
)
def test_a_mid_epoch_resume_of_a_shuffled_loader_is_exact(tmp_path, extra):
    # run_glue --checkpointing_steps then resume: 0.13 off from the first resumed step, no word.
    pipeline = xp.Pipeline(xp.with_device(), *extra)
    torch.manual_seed(0)
    with xp.session(pipeline(shuffled_setup())) as run:
        straight = [float(run.step(b, loss_fn)) for _ in range(3) for b in run.batches("train")]
        final = params(run)
    torch.manual_seed(0)
    with xp.session(pipeline(shuffled_setup())) as run:
        for epoch in range(3):
            for i, batch in enumerate(run.batches("train")):
                run.step(batch, loss_fn)
                if (epoch, i) == (1, 3):
                    checkpoint.save(tmp_path / "mid.pt", run, step=run.steps)
        saver = params(run)
    torch.manual_seed(99)
    with xp.session(pipeline(shuffled_setup(seed=4))) as run:
        checkpoint.restore(tmp_path / "mid.pt", run)
        assert (run.epoch, run.steps) == (1, 10)
        rest = [float(run.step(b, loss_fn)) for _ in range(run.epoch, 3) for b in run.batches("train")]
        resumed = params(run)
    assert rest == straight[10:]
    # Bit for bit the run that saved. A save cuts batches_per_execution's group of steps where the
    # straight run had none, and XLA rounds the two cuts' graphs apart by an ulp (measured 3e-8).
    assert all(torch.equal(a, b) for a, b in zip(resumed, saver))
    if "batches_per_execution" in str(pipeline):
        assert all(torch.allclose(a, b, rtol=0, atol=1e-7) for a, b in zip(resumed, final))
    else:
        assert all(torch.equal(a, b) for a, b in zip(resumed, final))


def test_static_shapes_loaders_resume_mid_epoch_too(tmp_path):
    def text_setup(seed: int = 0) -> xp.TrainingSetup:
        data = torch.Generator().manual_seed(0)  # the same items in every run
        items = [
            {"input_ids": torch.randint(1, 50, (3 + i % 5,), generator=data), "labels": torch.tensor(i % 2)}
            for i in range(40)
        ]
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Flatten(), torch.nn.LazyLinear(2))

        def collate(batch):
            ids = torch.nn.utils.rnn.pad_sequence([b["input_ids"] for b in batch], batch_first=True)
            return {"input_ids": ids, "labels": torch.stack([b["labels"] for b in batch])}

        g = torch.Generator().manual_seed(3)
        loader = torch.utils.data.DataLoader(
            items, batch_size=8, shuffle=True, generator=g, collate_fn=collate
        )
        model(collate(items[:2])["input_ids"].new_zeros(2, 8))  # the lazy layer, built at length 8
        return xp.TrainingSetup(model, lambda p: torch.optim.SGD(p, lr=0.1), {"train": loader})

    def text_loss(model, batch):
        return torch.nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])

    pipeline = xp.Pipeline(xp.with_device(), xp.static_shapes(length=8), xp.wrap_loader_mp())
    with xp.session(pipeline(text_setup())) as run:
        straight = [float(run.step(b, text_loss)) for _ in range(2) for b in run.batches("train")]
    with xp.session(pipeline(text_setup())) as run:
        for i, batch in enumerate(run.batches("train")):
            run.step(batch, text_loss)
            if i == 2:
                checkpoint.save(tmp_path / "text.pt", run, step=run.steps)
    with xp.session(pipeline(text_setup(seed=1))) as run:
        checkpoint.restore(tmp_path / "text.pt", run)
        rest = [float(run.step(b, text_loss)) for _ in range(run.epoch, 2) for b in run.batches("train")]
    assert rest == straight[3:]


def test_a_save_inside_an_epoch_of_a_loader_without_a_position_is_refused(tmp_path):
    def generated():
        yield from tiny_loader()

    class Stream:
        def __iter__(self):
            return generated()

    setup = tiny_setup().evolve(loaders={"train": Stream()})
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            with pytest.raises(ValueError, match="'train' is a Stream, whose position inside an epoch"):
                checkpoint.save(tmp_path / "c.pt", run, step=run.steps)
            break
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
        checkpoint.save(tmp_path / "c.pt", run, step=run.steps)  # at the epoch's boundary: fine
    assert not os.path.exists(tmp_path / ".c.pt.tmp")


@pytest.mark.parametrize("practice", [xp.wrap_loader_mp(), xp.static_shapes(length=8)], ids=lambda t: t.name)
def test_loader_practices_refuse_a_setup_without_loaders(practice):
    # A script feeding run.step from its own get_batch() got no warning, and an ablation "no difference".
    with pytest.raises(ValueError, match="has none: it would do nothing"):
        xp.Pipeline(xp.with_device(), practice)(
            xp.TrainingSetup(tiny_model(), lambda p: torch.optim.SGD(p, lr=0.1))
        )


# -- what a step says, and what survives a failure --------------------------------------------------


def test_the_run_says_whether_the_last_micro_batch_updated():
    with xp.session(xp.Pipeline(xp.with_device(), xp.accumulate_grad(3))(tiny_setup())) as run:
        updated = []
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            updated.append(run.updated)
        assert updated == [False, False, True, False] and run.updates == 2  # the rest applied at the end


def eager_skipping(bad: set[int], window: int = 4) -> list[torch.Tensor]:
    setup = tiny_setup()
    batches = [b for i, b in enumerate(tiny_loader(n=112)) if i not in bad]
    for start in range(0, len(batches), window):
        setup.optimizer.zero_grad()
        part = batches[start : start + window]
        for batch in part:
            (loss_fn(setup.model, batch) / len(part)).backward()
        setup.optimizer.step()
    return [p.detach() for p in setup.model.parameters()]


def test_a_failed_step_leaves_the_accumulation_window_as_it_was():
    # The failed step zeroed the window's gradients but kept its count (0.0113 from "skip the bad batch").
    def broken(model, batch):
        loss_fn(model, batch).backward()  # half a step: gradients written, then it fails
        raise RuntimeError("a bad batch")

    setup = tiny_setup().evolve(loaders={"train": tiny_loader(n=112)})
    with xp.session(xp.Pipeline(xp.with_device(), xp.accumulate_grad(4))(setup)) as run:
        for i, batch in enumerate(run.batches("train")):
            try:
                run.step(batch, broken if i == 2 else loss_fn)
            except RuntimeError:
                assert run.window == 2
        got = [p.detach().cpu() for p in run.model.parameters()]
    for g, w in zip(got, eager_skipping({2})):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@frozen
class InterruptAfterUpdate(xp.Hook):
    """Sends Ctrl-C (a real SIGINT) in the middle of the second update."""

    def start(self, run):
        return _Interrupting(run)


class _Interrupting(xp.Hook):
    def __init__(self, run):
        self.run = run

    def on_gradients(self):
        if self.run.updates == 1:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_keeps_the_weights_of_the_last_completed_step():
    # Before, the trained weights were thrown away and the error blamed the model's architecture.
    eager = tiny_setup()
    for batch in list(eager.loaders["train"])[:2]:
        eager.optimizer.zero_grad()
        loss_fn(eager.model, batch).backward()
        eager.optimizer.step()
    setup = tiny_setup()
    interrupting = xp.Transform("interrupt", hooks=(InterruptAfterUpdate(),))
    with pytest.raises(KeyboardInterrupt):
        with xp.session(xp.Pipeline(xp.with_device(), interrupting)(setup)) as run:
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
    assert run.steps == 1  # the interrupt came during step 2's update, held until it was traced whole
    run.copy_weights_to()
    for mine, want in zip(setup.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-6)


@frozen
class FailsToClose(xp.Hook):
    def close(self):
        raise RuntimeError("the second error")


def test_an_error_while_closing_never_hides_the_first():
    failing = xp.Transform("fails_to_close", hooks=(FailsToClose(),))
    with pytest.raises(ZeroDivisionError) as raised:
        with xp.session(xp.Pipeline(xp.with_device(), failing)(tiny_setup())):
            1 / 0  # noqa: B018
    assert "while closing the session after it: RuntimeError: the second error" in "".join(
        getattr(raised.value, "__notes__", [])
    )


# -- refusals that were missing or unclear ------------------------------------------------------------


def test_profile_refuses_a_file_for_a_folder_and_says_when_its_window_is_never_reached(tmp_path):
    existing = tmp_path / "a-file"
    existing.write_text("")
    with pytest.raises(ValueError, match="is a file; it must be a folder"):
        xp.profile(out=str(existing))
    pipeline = xp.Pipeline(xp.with_device(), xp.profile(steps=(50, 60), out=str(tmp_path / "trace")))
    with pytest.warns(xp.ProfileWarning, match=r"ended after 4 steps, before the window \(steps 50 to 60\)"):
        with xp.session(pipeline(tiny_setup())) as run:
            for batch in run.batches("train"):
                run.step(batch, loss_fn)


def test_an_empty_checkpoint_file_says_it_is_empty(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"is empty \(0 bytes\)"):
        checkpoint.load(tmp_path / "empty.pt")


# -- what a session leaves behind: nothing ---------------------------------------------------------------


def test_a_compiled_session_leaves_no_inductor_setting_and_no_progress_thread():
    from tqdm import tqdm

    before_env, before_monitor = os.environ.get("TORCHINDUCTOR_CACHE_DIR"), tqdm.monitor
    pipeline = xp.Pipeline(xp.with_device(), xp.compile_step(), xp.log_every(2, to="progress"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with xp.session(pipeline(tiny_setup())) as run:
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before_env
    assert tqdm.monitor is before_monitor


def test_the_ninth_compiled_session_still_compiles_the_update():
    # dynamo kept entries on torch's optimizer code across sessions until its recompile limit (8).
    from torch._dynamo.utils import counters

    from xlapipe.transforms.compile_step import dynamo_caches

    optimizer_code = [c for c in dynamo_caches() if "torch/optim" in c.co_filename]
    for _ in range(10):
        before = counters["stats"]["unique_graphs"]
        compiled = xp.Pipeline(xp.with_device(), xp.compile_step(optimizer=True))
        with xp.session(compiled(tiny_setup("adamw"))) as run:
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
        assert counters["stats"]["unique_graphs"] > before  # this session captured its graphs
    left = {c: n for c, n in dynamo_caches().items() if "torch/optim" in c.co_filename and n}
    assert not left, (left, optimizer_code)


# -- preemption: a real SIGTERM, then the same script again -----------------------------------------

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


# -- dropout: the XLA generator continued wherever the step is compiled, scanned or batched ------------


def dropout_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 2)
    )


def dropout_setup(seed: int = 0) -> xp.TrainingSetup:
    model = dropout_model(seed)
    return xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": tiny_loader(n=192)})


def losses_saving_and_resumed(pipeline: xp.Pipeline, path, save_after: int = 5):
    import torch_xla

    def read(values):
        return [float(v) for v in values]

    torch_xla.manual_seed(5)
    with xp.session(pipeline(dropout_setup())) as run:
        straight = read([run.step(b, loss_fn) for b in run.batches("train")])
    torch_xla.manual_seed(5)
    with xp.session(pipeline(dropout_setup())) as run:
        saving = []
        for i, batch in enumerate(run.batches("train")):
            saving.append(run.step(batch, loss_fn))
            if i + 1 == save_after:
                checkpoint.save(path, run, step=run.steps)
        saving = read(saving)
    torch_xla.manual_seed(77)  # the resumed process's own generator is elsewhere
    with xp.session(pipeline(dropout_setup(seed=3))) as run:
        checkpoint.restore(path, run)
        rest = read([run.step(b, loss_fn) for b in run.batches("train")])
    return straight, saving, rest


@pytest.mark.parametrize(
    "extra",
    [
        (),
        (xp.wrap_loader_mp(batches_per_execution=3),),
        (xp.compile_step(backend="torch_xla"),),
        (xp.compile_step(backend="torch_xla"), xp.wrap_loader_mp()),
    ],
    ids=["lazy", "batches_per_execution=3", "compile_step-torch_xla", "compile_step-torch_xla+loader"],
)
def test_with_dropout_a_resume_draws_what_the_uninterrupted_run_draws(tmp_path, extra):
    # Before: 0.015 to 0.15 off after 24 steps under compile_step, scan_layers, batches_per_execution=3.
    straight, saving, rest = losses_saving_and_resumed(
        xp.Pipeline(xp.with_device(), *extra), tmp_path / "c.pt"
    )
    assert saving == straight  # saving changes nothing in the run that saves (a save mid-graph included)
    assert rest == straight[5:]


def test_dropout_draws_the_same_masks_however_the_steps_are_cut_into_graphs():
    """Each step is seeded from its index: a device loader that traces three steps into one graph
    gives the lazy loop's losses (before, they differed from the third decimal)."""
    import torch_xla

    def losses(*extra):
        torch_xla.manual_seed(5)
        with xp.session(xp.Pipeline(xp.with_device(), *extra)(dropout_setup())) as run:
            return [float(v) for v in [run.step(b, loss_fn) for b in run.batches("train")]]

    plain = losses()
    assert losses(xp.wrap_loader_mp(batches_per_execution=3)) == plain
    np.testing.assert_allclose(losses(xp.compile_step(backend="torch_xla")), plain, rtol=1e-6)


def test_saves_that_could_not_resume_exactly_with_dropout_are_refused(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"compile_step\(backend='openxla'\) with random ops .*compile_step\(backend='torch_xla'\)",
    ):
        losses_saving_and_resumed(xp.Pipeline(xp.with_device(), xp.compile_step()), tmp_path / "a.pt")
    assert not (tmp_path / "a.pt").exists()
    from scan_models import Stack, dense_batches, dense_loss

    model = Stack(depth=3, dropout=0.2)
    setup = xp.TrainingSetup(
        model, torch.optim.SGD(model.parameters(), lr=0.05), {"train": dense_batches(n=3)}
    )
    with xp.session(xp.Pipeline(xp.with_device(), xp.scan_layers(layers="blocks"))(setup)) as run:
        run.step(next(iter(run.batches("train"))), dense_loss)
        with pytest.raises(ValueError, match="scan_layers with dropout in the scanned layers"):
            checkpoint.save(tmp_path / "b.pt", run, step=1)
        with run.evaluating():
            pass
        run.model.eval()
        checkpoint.save(tmp_path / "b.pt", run, step=1)  # evaluation mode draws nothing: allowed


def test_without_dropout_compiled_and_scanned_runs_resume_exactly(tmp_path):
    from scan_models import Stack, dense_batches, dense_loss

    def stack_setup(seed=0):
        model = Stack(depth=3, seed=seed)
        return xp.TrainingSetup(
            model, torch.optim.SGD(model.parameters(), lr=0.05), {"train": dense_batches(n=6)}
        )

    for name, pipeline in {
        "openxla": xp.Pipeline(xp.with_device(), xp.compile_step()),
        "scan": xp.Pipeline(xp.with_device(), xp.scan_layers(layers="blocks")),
    }.items():
        with xp.session(pipeline(stack_setup())) as run:
            straight = [float(v) for v in [run.step(b, dense_loss) for b in run.batches("train")]]
        with xp.session(pipeline(stack_setup())) as run:
            for i, batch in enumerate(run.batches("train")):
                run.step(batch, dense_loss)
                if i == 2:
                    checkpoint.save(tmp_path / f"{name}.pt", run, step=3)
        with xp.session(pipeline(stack_setup(seed=4))) as run:
            checkpoint.restore(tmp_path / f"{name}.pt", run)
            rest = [float(v) for v in [run.step(b, dense_loss) for b in run.batches("train")]]
        assert rest == straight[3:], name
