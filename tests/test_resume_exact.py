"""Resumes that users found inexact (issue 27): the user's optimizer's rates, loaders changed between
save and restore, resumed twice in an epoch, and data whose randomness is not the loader's own."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_model
from xlapipe import checkpoint

# -- the user's optimizer: rates set on it, before and after a restore -----------------------------


def user_optimizer(kind: str, params, tensor_rate: bool) -> torch.optim.Optimizer:
    lr = torch.tensor(0.1) if tensor_rate else 0.1
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=lr, foreach=False)  # a tensor rate needs foreach=False


def set_rate(optimizer: torch.optim.Optimizer, how: str, it: int) -> None:
    """The rate the scripts set by hand before step ``it``: halved every third step."""
    for g in optimizer.param_groups:
        if how == "absolute":
            g["lr"] = 0.1 * 0.5 ** (it // 3)
        elif how == "relative" and it % 3 == 0 and it > 0:
            g["lr"] *= 0.5
        elif how == "tensor_fill":
            g["lr"].fill_(0.1 * 0.5 ** (it // 3))  # as torch's schedulers change a tensor rate


def rate(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def eager(kind: str, how: str, epochs: int = 2) -> tuple[list[torch.Tensor], float]:
    model = tiny_model()
    opt = user_optimizer(kind, model.parameters(), how == "tensor_fill")
    it = 0
    for _ in range(epochs):
        for batch in tiny_loader():
            set_rate(opt, how, it)
            opt.zero_grad()
            loss_fn(model, batch).backward()
            opt.step()
            it += 1
    return [p.detach().clone() for p in model.state_dict().values()], rate(opt)


def user_setup(kind: str, how: str) -> tuple[xp.TrainingSetup, torch.optim.Optimizer]:
    model = tiny_model()
    opt = user_optimizer(kind, model.parameters(), how == "tensor_fill")
    return xp.Pipeline(xp.with_device())(xp.TrainingSetup(model, opt, {"train": tiny_loader()})), opt


def train_epoch(run: xp.Run, opt: torch.optim.Optimizer, how: str) -> None:
    for batch in run.batches("train"):
        set_rate(opt, how, run.steps)
        run.step(batch, loss_fn)


@pytest.mark.parametrize("how", ["absolute", "relative", "tensor_fill"])
@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_rates_set_on_the_users_optimizer_follow_eager_across_a_restore(tmp_path, kind, how):
    want, want_rate = eager(kind, how)
    setup, opt = user_setup(kind, how)
    with xp.session(setup) as run:
        train_epoch(run, opt, how)
        checkpoint.save(tmp_path / "c.pt", run, step=run.steps)
        assert rate(run.optimizer) == rate(opt) == pytest.approx(0.1 * 0.5)  # followed before the restore too
    setup, opt = user_setup(kind, how)  # a new process builds its optimizer at the first rate again
    with xp.session(setup) as run:
        checkpoint.restore(tmp_path / "c.pt", run)
        assert rate(opt) == pytest.approx(0.1 * 0.5)  # the user's optimizer holds the restored rate
        if how == "tensor_fill":
            assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)
        train_epoch(run, opt, how)
        got = [t.clone() for t in run.state_dict().values()]
        assert rate(run.optimizer) == want_rate == pytest.approx(0.1 * 0.5**2)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["StepLR", "ExponentialLR"])
def test_a_scheduler_built_on_the_users_optimizer_in_the_session_is_refused_by_name(kind):
    setup, opt = user_setup("sgd", "absolute")
    with xp.session(setup) as run:
        batch = next(iter(run.batches("train")))
        made = getattr(torch.optim.lr_scheduler, kind)(opt, 0.5)  # step_size or gamma  # noqa: F841
        with pytest.raises(
            ValueError, match=rf"scheduler \({kind}\) was built on your optimizer.*{kind}\(run.optimizer"
        ):
            run.step(batch, loss_fn)


# -- data whose randomness is not the loader's own generators ---------------------------------------


def features(n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    return x, (x.sum(1) > 0).long()


class PythonShuffle(torch.utils.data.Sampler):
    """A sampler shuffling with Python's ``random`` (as many scripts write one)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        order = list(range(self.n))
        random.shuffle(order)
        return iter(order)

    def __len__(self) -> int:
        return self.n


class NumpyShuffle(PythonShuffle):
    def __iter__(self):
        return iter(np.random.permutation(self.n).tolist())


class Augmented(torch.utils.data.Dataset):
    """``__getitem__`` adds noise drawn from torch's global generator (a worker's, with workers)."""

    def __init__(self) -> None:
        self.x, self.y = features()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i] + 0.5 * torch.randn(8), self.y[i]


class Noisy(torch.utils.data.IterableDataset):
    def __iter__(self):
        x, y = features()
        for i in range(len(x)):
            yield x[i] + 0.5 * torch.randn(8), y[i]


def drawing_loader(case: str) -> torch.utils.data.DataLoader:
    x, y = features()
    data = torch.utils.data.TensorDataset(x, y)
    DataLoader = torch.utils.data.DataLoader
    if case == "python_sampler":
        return DataLoader(data, batch_size=16, sampler=PythonShuffle(len(x)))
    if case == "numpy_sampler":
        return DataLoader(data, batch_size=16, sampler=NumpyShuffle(len(x)))
    if case == "augmented":
        return DataLoader(Augmented(), batch_size=16, shuffle=True)
    if case == "augmented_workers":
        return DataLoader(Augmented(), batch_size=16, shuffle=True, num_workers=2)
    assert case == "iterable"
    return DataLoader(Noisy(), batch_size=16)


def seed_host(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def drawing_setup(case: str, extra: tuple, model_seed: int = 0) -> xp.TrainingSetup:
    model = tiny_model(model_seed)
    setup = xp.TrainingSetup(
        model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": drawing_loader(case)}
    )
    return xp.Pipeline(xp.with_device(), *extra)(setup)


def weights(run: xp.Run) -> list[torch.Tensor]:
    return [t.clone() for t in run.state_dict().values()]


CASES = [
    ("python_sampler", ()),
    ("numpy_sampler", ()),
    ("augmented", ()),
    ("augmented_workers", ()),
    ("iterable", ()),
    ("python_sampler", (xp.wrap_loader_mp(),)),
    ("augmented", (xp.wrap_loader_mp(),)),
]


@pytest.mark.parametrize("case,extra", CASES, ids=[c + ("+wrap_loader_mp" if e else "") for c, e in CASES])
def test_a_mid_epoch_resume_redraws_what_the_data_drew(tmp_path, case, extra):
    epochs = 2
    seed_host(0)
    with xp.session(drawing_setup(case, extra)) as run:
        for _ in range(epochs):
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
        straight = weights(run)
    seed_host(0)
    with xp.session(drawing_setup(case, extra)) as run:
        for epoch in range(epochs):
            for i, batch in enumerate(run.batches("train")):
                run.step(batch, loss_fn)
                if (epoch, i) == (1, 2):
                    checkpoint.save(tmp_path / "mid.pt", run, step=run.steps)
        assert all(torch.equal(a, b) for a, b in zip(weights(run), straight))  # saving changed nothing
    seed_host(999)  # a new process starts its generators elsewhere
    with xp.session(drawing_setup(case, extra, model_seed=5)) as run:
        checkpoint.restore(tmp_path / "mid.pt", run)
        assert (run.epoch, run.steps) == (1, 9)
        for _ in range(run.epoch, epochs):
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
        resumed = weights(run)
    assert all(torch.equal(a, b) for a, b in zip(resumed, straight))


# -- resumed twice in one epoch ----------------------------------------------------------------------


def ordered_setup(kind: str, model_seed: int = 0) -> xp.TrainingSetup:
    """Each sample's first feature is its index, so the batches seen can be told apart."""
    x, y = features(128)
    x[:, 0] = torch.arange(128.0)
    data = torch.utils.data.TensorDataset(x, y)
    if kind == "list":
        loader: object = list(torch.utils.data.DataLoader(data, batch_size=16))
    elif kind == "shuffled":
        loader = torch.utils.data.DataLoader(
            data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(3)
        )
    else:
        assert kind == "augmented"
        loader = torch.utils.data.DataLoader(Augmented(), batch_size=16, shuffle=True)
    model = tiny_model(model_seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return xp.Pipeline(xp.with_device())(xp.TrainingSetup(model, opt, {"train": loader}))


def firsts(batch) -> list[int]:
    return [round(v) for v in batch[0][:, 0].cpu().tolist()]


@pytest.mark.parametrize("kind", ["list", "shuffled", "augmented"])
def test_a_loader_resumed_twice_in_one_epoch_neither_repeats_nor_skips(tmp_path, kind):
    seed_host(0)
    with xp.session(ordered_setup(kind)) as run:
        straight = []
        for _ in range(2):
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
                straight.append(firsts(batch))
        want = weights(run)
    seed_host(0)
    seen = []
    with xp.session(ordered_setup(kind)) as run:
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            seen.append(firsts(batch))
            if run.steps == 2:
                checkpoint.save(tmp_path / "first.pt", run, step=run.steps)
                break
    seed_host(1)
    with xp.session(ordered_setup(kind, model_seed=1)) as run:
        checkpoint.restore(tmp_path / "first.pt", run)
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            seen.append(firsts(batch))
            if run.steps == 5:
                checkpoint.save(tmp_path / "second.pt", run, step=run.steps)  # the same epoch again
                break
    seed_host(2)
    with xp.session(ordered_setup(kind, model_seed=2)) as run:
        checkpoint.restore(tmp_path / "second.pt", run)
        assert (run.epoch, run.steps) == (0, 5)
        for _ in range(run.epoch, 2):
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
                seen.append(firsts(batch))
        got = weights(run)
    assert len(seen) == len(straight) == (12 if kind == "augmented" else 16)
    if kind != "augmented":  # (its features carry noise; its weights say the rest)
        assert seen == straight
    assert all(torch.equal(a, b) for a, b in zip(got, want))


# -- a loader changed between save and restore ---------------------------------------------------------


def loader_of(**changes) -> object:
    x, y = features()
    options = {"batch_size": 16, "shuffle": True, "drop_last": False, "n": 96, **changes}
    n = options.pop("n")
    data = torch.utils.data.TensorDataset(x[:n], y[:n])
    if options.pop("as_list", False):
        return list(torch.utils.data.DataLoader(data, batch_size=16))
    return torch.utils.data.DataLoader(data, generator=torch.Generator().manual_seed(3), **options)


def saved_mid_epoch(tmp_path, loader) -> str:
    model = tiny_model()
    setup = xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": loader})
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            checkpoint.save(tmp_path / "c.pt", run, step=run.steps)
            break
    return str(tmp_path / "c.pt")


@pytest.mark.parametrize(
    "saved,changed,message",
    [
        ({}, {"batch_size": 8}, "its batch_size was 16 and is 8 in this run.*saving run's batch_size"),
        ({}, {"shuffle": False}, "its sampler was 'RandomSampler' and is 'SequentialSampler'.*shuffle="),
        ({}, {"n": 80}, "its dataset_length was 96 and is 80 in this run.*saving run's dataset"),
        ({"n": 90}, {"n": 90, "drop_last": True}, "its drop_last was False and is True in this run"),
        ({"as_list": True}, {}, "its kind was 'a list of batches' and is 'a DataLoader' in this run"),
        ({}, {"as_list": True}, "its kind was 'a DataLoader' and is 'a list of batches' in this run"),
    ],
    ids=[
        "batch_size",
        "shuffle",
        "dataset_length",
        "drop_last",
        "list_into_DataLoader",
        "DataLoader_into_list",
    ],
)
def test_a_loader_changed_between_save_and_restore_is_refused_by_field(tmp_path, saved, changed, message):
    path = saved_mid_epoch(tmp_path, loader_of(**saved))
    model = tiny_model(seed=3)
    setup = xp.TrainingSetup(
        model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": loader_of(**changed)}
    )
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        before = weights(run)
        with pytest.raises(
            ValueError, match=f"loader 'train' is not the loader the checkpoint was saved with: {message}"
        ):
            checkpoint.restore(path, run)
        assert all(torch.equal(a, b) for a, b in zip(weights(run), before))  # nothing was changed
        assert not run.positions["train"].inside_epoch


@pytest.mark.parametrize(
    "restored",
    [(), (xp.accumulate_grad(2),), (xp.accumulate_grad(3, last_window="divide_by_steps"),)],
    ids=["no-accumulation", "other-steps", "other-last-window"],
)
def test_an_open_window_restored_into_other_accumulation_is_refused_naming_both(tmp_path, restored):
    def setup() -> xp.TrainingSetup:
        model = tiny_model(seed=3)
        return xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": tiny_loader()})

    path = str(tmp_path / "open.pt")
    saving = xp.Pipeline(xp.with_device(), xp.accumulate_grad(3))
    with xp.session(saving(setup())) as run:
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            if run.window == 2:
                checkpoint.save(path, run, step=run.steps)
                break
    with xp.session(xp.Pipeline(xp.with_device(), *restored)(setup())) as run:
        before = weights(run)
        with pytest.raises(ValueError, match=r"saved inside an accumulation window \(2 micro-batches") as e:
            checkpoint.restore(path, run)
        assert "accumulate_grad(last_window='average', steps=3)" in str(e.value)
        assert (run.steps, run.window) == (0, 0)  # nothing was changed
        assert all(torch.equal(a, b) for a, b in zip(weights(run), before))
    with xp.session(saving(setup())) as run:  # the pipeline that saved it resumes it
        assert checkpoint.restore(path, run) == 2 and run.window == 2
