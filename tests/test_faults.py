"""Leaving a training loop early, or by an error, leaves nothing behind and hides nothing."""

from __future__ import annotations

import gc
import multiprocessing
import signal
import threading
import time
import traceback
import weakref

import pytest
import torch

import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_model
from xlapipe.effects import snapshot


class Faulty(torch.utils.data.Dataset):
    """Sample 20 cannot be read."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        if i == 20:
            raise LookupError(f"sample {i} is corrupt")
        return torch.full((8,), float(i % 3)), torch.tensor(i % 2)


def pipeline_setup(loader, **transforms) -> xp.TrainingSetup:
    model = tiny_model()
    pipeline = xp.Pipeline(
        xp.with_device(), xp.wrap_loader_mp(), xp.set_default_tensor_type("float32", device="xla")
    )
    return pipeline(xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": loader}))


def failing_loss(model, batch):
    raise ArithmeticError("the user's step failed")


def alive() -> set:
    """Threads and child processes of this process that are running."""
    return set(threading.enumerate()) | {p.pid for p in multiprocessing.active_children()}


def left_behind(before: set, grace: float = 5.0) -> list[str]:
    """Threads and worker processes started since ``before`` still alive after ``grace`` s.

    A DataLoader's worker queues stop their feeder threads asynchronously after
    the workers are shut down, so give them a moment before calling them leaked.
    """
    deadline = time.monotonic() + grace
    while (extra := alive() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(str(getattr(x, "name", x)) for x in extra)


def process_state() -> dict:
    """``xlapipe.effects.snapshot()`` less the variable pytest itself changes per phase."""
    state = snapshot()
    state["environ"].pop("PYTEST_CURRENT_TEST", None)
    return state


@pytest.fixture
def clean():
    """Check the test leaves no thread, no worker process and no process-wide change."""
    threads, state = alive(), process_state()
    yield
    assert left_behind(threads) == []
    assert process_state() == state


@pytest.mark.parametrize("num_workers", [0, 2])
def test_break_stops_the_device_loader_threads(clean, num_workers):
    threads = alive()
    data = tiny_loader(n=16 * 100).dataset  # more batches than the loader prefetches
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=num_workers)
    with xp.session(pipeline_setup(loader)) as run:
        assert process_state()["default_device"].type == "xla"  # the effect is in force
        for batch in run.loaders["train"]:
            run.step(batch, loss_fn)
            assert left_behind(threads), "the device loader should be running threads here"
            break
        assert left_behind(threads) == []  # stopped at the break, not at session exit


def test_break_outside_a_session_stops_the_threads(clean):
    threads = alive()
    loader = xp.DeviceLoader(tiny_loader(n=16 * 100))
    for _ in loader:
        assert left_behind(threads)
        break
    assert left_behind(threads) == []


def test_error_in_the_step_reaches_the_user_with_its_traceback(clean):
    with pytest.raises(ArithmeticError, match="the user's step failed") as info:
        with xp.session(pipeline_setup(tiny_loader())) as run:
            for batch in run.loaders["train"]:
                run.step(batch, failing_loss)
    assert "failing_loss" in [frame.name for frame in traceback.extract_tb(info.tb)]


def test_ctrl_c_stops_the_threads_and_restores_state(clean):
    steps = 0
    # Python's own SIGINT handler, installed afresh: once (in one full run of the
    # suite) the signal went unseen, as if a native library had taken SIGINT over.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with xp.session(pipeline_setup(tiny_loader())) as run:
                for batch in run.loaders["train"]:
                    run.step(batch, loss_fn)
                    steps += 1
                    signal.raise_signal(signal.SIGINT)  # what Ctrl-C sends
    finally:
        signal.signal(signal.SIGINT, previous)
    assert steps == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_error_in_the_dataset_reaches_the_user(clean, num_workers):
    loader = torch.utils.data.DataLoader(Faulty(), batch_size=8, num_workers=num_workers)
    steps = 0
    with pytest.raises(LookupError, match="sample 20 is corrupt") as info:
        with xp.session(pipeline_setup(loader)) as run:
            for batch in run.loaders["train"]:
                run.step(batch, loss_fn)
                steps += 1
    assert steps == 2  # batches 0 and 1 trained; the one holding sample 20 raised
    if num_workers == 0:
        assert "__getitem__" in [frame.name for frame in traceback.extract_tb(info.tb)]
    else:  # raised in a worker process: torch carries its traceback in the message
        assert 'in __getitem__\n    raise LookupError(f"sample {i} is corrupt")' in str(info.value)


class _Cycle:
    """Unreachable once dropped, holding an XLA tensor: only the garbage collector frees it."""

    def __init__(self, device: torch.device) -> None:
        self.me = self
        self.tensor = torch.ones(4, device=device)


def _collect_and_report(ref, result) -> None:
    gc.collect()
    result.put(ref() is not None)


def test_a_forked_dataloader_worker_never_frees_the_parents_xla_tensors():
    """A worker freeing them would take torch_xla locks another parent thread may hold: a hang.

    Seen in a full run of the suite: a DataLoader worker hung for ever in the
    destructor of an inherited XLA tensor, called by its garbage collector.
    """
    gc.disable()
    try:
        ref = weakref.ref(_Cycle(xp.runtime.device()))  # garbage now, freed only by a collection
        context = multiprocessing.get_context("fork")  # what a DataLoader worker uses on Linux
        result = context.Queue()
        child = context.Process(target=_collect_and_report, args=(ref, result))
        child.start()
        inherited_alive = result.get(timeout=60)
        child.join(60)
    finally:
        gc.enable()
    assert child.exitcode == 0
    assert inherited_alive, "the forked child's garbage collector freed an XLA tensor of the parent"
    gc.collect()
    assert ref() is None  # the parent frees its own
