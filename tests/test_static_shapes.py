"""static_shapes: fixed and bucketed padding through the loaders' collate step."""

import json
import pickle

import numpy as np
import pytest
import torch
from torch import nn

import xlapipe as xp
from xlapipe.transforms import static_shapes
from xlapipe.transforms.static_shapes import PAD_VALUES, PadCollate


class Texts(torch.utils.data.Dataset):
    """Token sequences of the given lengths (ids from 1), label = length parity."""

    def __init__(self, lengths):
        self.lengths = list(lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        n = self.lengths[i]
        ids = 1 + (torch.arange(n) * 7 + i) % 50
        return {
            "input_ids": ids,
            "attention_mask": torch.ones(n, dtype=torch.long),
            "token_type_ids": torch.ones(n, dtype=torch.long),
            "labels": torch.tensor(n % 2),
        }


def pad_longest(items):
    n = max(len(it["input_ids"]) for it in items)
    out = {}
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        out[key] = torch.zeros(len(items), n, dtype=torch.long)
        for row, it in enumerate(items):
            out[key][row, : len(it[key])] = it[key]
    out["labels"] = torch.stack([it["labels"] for it in items])
    return out


def loader(lengths, batch_size=4, **kwargs):
    return torch.utils.data.DataLoader(
        Texts(lengths), batch_size=batch_size, collate_fn=pad_longest, **kwargs
    )


class Bag(nn.Module):
    """Mean of token embeddings under the mask, then a linear head."""

    def __init__(self, dim):
        super().__init__()
        self.embed = nn.Embedding(64, dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, input_ids, attention_mask, **_):
        mask = attention_mask.unsqueeze(-1).float()
        return self.head((self.embed(input_ids) * mask).sum(1) / mask.sum(1))


def bag_loss(model, batch):
    return nn.functional.cross_entropy(model(**batch), batch["labels"])


def setup_of(loaders, dim=8):
    torch.manual_seed(0)
    model = Bag(dim)
    return xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), loaders)


# -- padding -------------------------------------------------------------------------------


def test_pads_every_batch_to_the_fixed_length_with_each_keys_value():
    original = loader([5, 9, 3, 7, 12, 2, 4, 6])
    setup = setup_of({"train": original})
    padded = static_shapes(length=16, pad_values={"input_ids": 99, "attention_mask": 0})(setup)
    batches = list(padded.loaders["train"])
    plain = list(original)
    assert len(batches) == 2
    for got, want in zip(batches, plain):
        n = want["input_ids"].shape[1]
        assert got["input_ids"].shape == got["attention_mask"].shape == (4, 16)
        assert torch.equal(got["input_ids"][:, :n], want["input_ids"])
        assert (got["input_ids"][:, n:] == 99).all()
        assert (got["attention_mask"][:, n:] == 0).all()
        assert torch.equal(got["token_type_ids"], want["token_type_ids"])  # not in pad_values
        assert torch.equal(got["labels"], want["labels"])


def test_buckets_pick_the_smallest_that_holds_the_batch():
    lengths = [3, 5, 9, 30, 33, 60, 64, 8]
    padded = static_shapes(buckets=(64, 16, 32))(setup_of({"train": loader(lengths, batch_size=1)}))
    got = [b["input_ids"].shape[1] for b in padded.loaders["train"]]
    assert got == [16, 16, 16, 32, 64, 64, 64, 16]


def test_the_users_loaders_and_setup_are_untouched():
    original = loader([5, 9, 3, 7])
    collate = original.collate_fn
    setup = setup_of({"train": original})
    new = static_shapes(length=16)(setup)
    assert setup.loaders["train"] is original and original.collate_fn is collate
    assert new.loaders["train"] is not original
    assert isinstance(new.loaders["train"].collate_fn, PadCollate)
    assert [b["input_ids"].shape[1] for b in original] == [9]


def test_keeps_sampler_batch_size_and_options():
    g = torch.Generator().manual_seed(3)
    original = loader(range(1, 11), batch_size=3, shuffle=True, generator=g, drop_last=True)
    new = static_shapes(length=16)(setup_of({"train": original})).loaders["train"]
    assert new.sampler is original.sampler and new.batch_size == 3 and new.drop_last
    assert len(new) == len(original) == 3


def test_drop_last_only_for_the_named_loaders():
    setup = setup_of({"train": loader(range(1, 11)), "eval": loader(range(1, 11))})
    new = static_shapes(length=16, drop_last=("train",))(setup)
    assert [len(b["labels"]) for b in new.loaders["train"]] == [4, 4]
    assert [len(b["labels"]) for b in new.loaders["eval"]] == [4, 4, 2]


def test_loaders_parameter_limits_what_is_rebuilt():
    train, other = loader([3, 4]), loader([3, 4])
    new = static_shapes(length=8, loaders="train")(setup_of({"train": train, "other": other}))
    assert new.loaders["other"] is other and new.loaders["train"] is not train


def test_keeps_the_batchs_mapping_type():
    from transformers import BatchEncoding

    data = torch.utils.data.DataLoader(
        Texts([3, 5]), batch_size=2, collate_fn=lambda items: BatchEncoding(pad_longest(items))
    )
    batch = next(iter(static_shapes(length=8)(setup_of({"train": data})).loaders["train"]))
    assert isinstance(batch, BatchEncoding) and batch["input_ids"].shape == (2, 8)


def test_custom_batch_sampler_is_kept():
    sampler = [[0, 1], [2], [3, 4, 5]]
    data = torch.utils.data.DataLoader(Texts(range(1, 7)), batch_sampler=sampler, collate_fn=pad_longest)
    new = static_shapes(length=8)(setup_of({"train": data})).loaders["train"]
    assert [tuple(b["input_ids"].shape) for b in new] == [(2, 8), (1, 8), (3, 8)]
    with pytest.raises(ValueError, match="batch_sampler"):
        static_shapes(length=8, drop_last="train")(setup_of({"train": data}))


def test_collate_pickles_for_worker_processes():
    collate = static_shapes(length=8)(setup_of({"train": loader([3])})).loaders["train"].collate_fn
    again = pickle.loads(pickle.dumps(collate))
    assert again([Texts([3])[0]])["input_ids"].shape == (1, 8)


# -- a value like the others -------------------------------------------------------------------


def test_is_plain_data_that_round_trips():
    pipeline = xp.Pipeline(
        xp.with_device(), static_shapes(buckets=(128, 32, 64), drop_last="train"), xp.wrap_loader_mp()
    )
    description = json.loads(json.dumps(pipeline.describe()))
    assert xp.Pipeline.from_description(description) == pipeline
    assert static_shapes(length=128) == static_shapes(
        length=128, pad_values=dict(static_shapes(length=1).params)["pad_values"]
    )
    assert static_shapes(buckets=(64, 32)) == static_shapes(buckets=[32, 64])


def test_idempotent_and_never_nests():
    setup = setup_of({"train": loader([3, 20])})
    once = static_shapes(length=32)(setup)
    assert static_shapes(length=32)(once) is once
    # a loader that was padded before, handed to a new setup, is re-wrapped, not nested
    again = static_shapes(length=64)(setup_of({"train": once.loaders["train"]}))
    collate = again.loaders["train"].collate_fn
    assert not isinstance(collate.inner, PadCollate)
    assert next(iter(again.loaders["train"]))["input_ids"].shape == (2, 64)


def test_must_come_before_wrap_loader_mp():
    with pytest.raises(xp.OrderError, match="wrap_loader_mp must come after static_shapes"):
        xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(), static_shapes(length=8))
    wrapped = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())(setup_of({"train": loader([3])}))
    plain = xp.TrainingSetup(wrapped.model, wrapped.optimizer, wrapped.loaders)
    with pytest.raises(TypeError, match="before wrap_loader_mp"):
        static_shapes(length=8)(plain)


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "exactly one of length"),
        ({"length": 8, "buckets": (8,)}, "exactly one of length"),
        ({"length": 0}, "positive ints"),
        ({"length": 8.5}, "positive ints"),
        ({"length": (8, 16)}, "use buckets"),
        ({"buckets": ()}, "positive ints"),
        ({"buckets": (32, 32)}, "distinct"),
        ({"length": 8, "pad_values": (("input_ids",),)}, "pairs"),
        ({"length": 8, "pad_values": {}}, "each key once"),
        ({"length": 8, "loaders": ("train",), "drop_last": ("eval",)}, "not in loaders"),
        ({"length": 8, "loaders": (1,)}, "loader names"),
    ],
)
def test_bad_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        static_shapes(**kwargs)


def test_items_longer_than_the_length_are_refused_with_the_fix():
    padded = static_shapes(length=8)(setup_of({"train": loader([3, 12])}))
    with pytest.raises(ValueError, match=r"12 long.*Truncate items.*max_length=8"):
        list(padded.loaders["train"])


def test_loaders_it_cannot_rebuild_are_refused():
    with pytest.raises(TypeError, match="loader 'train' is a list"):
        static_shapes(length=8)(setup_of({"train": [pad_longest([Texts([3])[0]])]}))
    with pytest.raises(KeyError, match="no loader named 'eval'"):
        static_shapes(length=8, loaders="eval")(setup_of({"train": loader([3])}))
    single = torch.utils.data.DataLoader(Texts([3]), batch_size=None)
    with pytest.raises(ValueError, match="batch_size=None"):
        static_shapes(length=8)(setup_of({"train": single}))


def test_batches_it_cannot_pad_are_refused():
    tuples = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 3)), batch_size=2)
    with pytest.raises(TypeError, match="dict batches"):
        list(static_shapes(length=8)(setup_of({"train": tuples})).loaders["train"])
    with pytest.raises(KeyError, match="none of the keys"):
        list(
            static_shapes(length=8, pad_values={"ids": 0})(setup_of({"train": loader([3])})).loaders["train"]
        )
    with pytest.raises(ValueError, match="'labels' is \\[2\\]"):
        list(
            static_shapes(length=8, pad_values={"labels": 0})(setup_of({"train": loader([3, 4])})).loaders[
                "train"
            ]
        )


# -- what it is for: a bounded number of compilations -------------------------------------------


def compiles(pipeline, dim):
    """XLA compilations while training one epoch of mixed-length batches under ``pipeline``."""
    import torch_xla.debug.metrics as met

    longest = [5 + (b * 37) % 56 for b in range(24)]  # per batch: 5 to 60 tokens, shuffled-looking
    lengths = [max(1, n - k) for n in longest for k in range(4)]
    setup = pipeline(setup_of({"train": loader(lengths)}, dim=dim))
    before = met.counter_value("UncachedCompile") or 0
    with xp.session(setup) as run:
        losses = [run.step(batch, bag_loss) for batch in run.loaders["train"]]
        assert torch.isfinite(torch.stack(losses)).all()
    return (met.counter_value("UncachedCompile") or 0) - before


def test_buckets_bound_the_compilations_where_padding_to_longest_does_not():
    # Distinct model widths, so neither run reuses the other's cached graphs.
    longest = compiles(xp.Pipeline(xp.with_device()), dim=19)
    buckets = compiles(xp.Pipeline(xp.with_device(), static_shapes(buckets=(16, 32, 64))), dim=21)
    fixed = compiles(xp.Pipeline(xp.with_device(), static_shapes(length=64), xp.wrap_loader_mp()), dim=23)
    assert buckets <= 3 + 1, buckets  # one graph per bucket, plus the first step's
    assert fixed <= 1 + 1, fixed
    assert buckets >= 2  # the batches do span several buckets
    assert longest >= 10, longest  # 24 batches, most of a new length


# -- token labels (causal language models, token classification) ----------------------------------


def token_batch(length=5, labels=None):
    ids = torch.arange(1, 2 * length + 1).reshape(2, length)
    batch = {"input_ids": ids, "attention_mask": torch.ones(2, length, dtype=torch.long)}
    batch["labels"] = ids.clone() if labels is None else labels
    return batch


@pytest.mark.parametrize(
    "labels, padded",
    [
        (None, True),  # [batch, length] token ids: padded with -100
        (torch.tensor([0, 1]), False),  # one label per sequence
        (torch.ones(2, 5), False),  # float: not token labels
        (torch.ones(2, 7, dtype=torch.long), False),  # another length (a decoder's)
    ],
)
def test_token_labels_as_long_as_the_inputs_are_padded_with_the_ignore_index(labels, padded):
    batch = token_batch(labels=labels)
    got = PadCollate(lambda _: batch, (8,), PAD_VALUES)([None])
    assert got["input_ids"].shape == (2, 8)
    if padded:
        assert torch.equal(got["labels"][:, :5], batch["labels"]) and (got["labels"][:, 5:] == -100).all()
    else:
        assert got["labels"] is batch["labels"]


def test_label_padding_can_be_changed_or_turned_off():
    pads = PAD_VALUES
    assert PadCollate(lambda _: token_batch(), (8,), pads, None)([None])["labels"].shape == (2, 5)
    custom = PadCollate(lambda _: token_batch(), (8,), pads + (("labels", 7),))([None])["labels"]
    assert (custom[:, 5:] == 7).all()
    with pytest.raises(ValueError, match="label_pad_value must be an int"):
        static_shapes(length=8, label_pad_value=-100.0)
    assert static_shapes(length=8) != static_shapes(length=8, label_pad_value=None)


class Tokens(torch.utils.data.Dataset):
    """Token sequences of the given lengths (ids 1 to 63) for a language model."""

    def __init__(self, lengths):
        self.lengths = list(lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(1, 64, (self.lengths[i],), generator=g)


def pad_causal(items):
    """Padded to the longest, as a causal LM's collate does: pads masked, and ignored by the labels."""
    n = max(len(t) for t in items)
    ids = torch.zeros(len(items), n, dtype=torch.long)
    mask = torch.zeros(len(items), n, dtype=torch.long)
    for row, t in enumerate(items):
        ids[row, : len(t)] = t
        mask[row, : len(t)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def lm_loss(model, batch):
    return model(**batch).loss


def test_a_causal_lm_trains_with_the_defaults_and_the_padding_changes_no_loss(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    lengths = [5, 17, 9, 30, 12, 23, 7, 40]
    data = torch.utils.data.DataLoader(Tokens(lengths), batch_size=2, collate_fn=pad_causal)
    setup = xp.TrainingSetup(model, lambda p: torch.optim.AdamW(p, lr=1e-3), {"train": data})

    def losses(pipeline):
        with xp.session(pipeline(setup)) as run:
            return [float(run.step(b, lm_loss)) for _ in range(2) for b in run.batches("train")]

    padded = xp.Pipeline(xp.with_device(), static_shapes(length=64), xp.wrap_loader_mp())
    batch = next(iter(padded(setup).loaders["train"]))
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 64)
    assert (batch["labels"][:, 17:] == -100).all()
    reference = losses(xp.Pipeline())  # eager PyTorch on the CPU, batches as long as their longest
    np.testing.assert_allclose(losses(padded), reference, rtol=2e-5, atol=0)
