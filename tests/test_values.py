"""Setup, transform and pipeline as values: equality, hashing, repr, plain data."""

import json

import pytest
import torch

import xlapipe as xp
from helpers import tiny_loader, tiny_model, tiny_setup

FIVE = [
    xp.with_device(),
    xp.with_precision("fp32"),
    xp.wrap_model_mp(),
    xp.wrap_loader_mp(),
    xp.set_default_tensor_type(),
]


def test_transforms_compare_by_name_and_params():
    assert xp.with_precision("bf16") == xp.with_precision("bf16")
    assert hash(xp.with_precision("bf16")) == hash(xp.with_precision("bf16"))
    assert xp.with_precision("bf16") != xp.with_precision("fp16")
    assert xp.wrap_loader_mp(device_prefetch_size=4) != xp.wrap_loader_mp()
    assert repr(xp.with_precision("bf16")) == "with_precision(mode='autocast', name='bf16')"


def test_pipeline_repr_and_identity():
    assert repr(xp.Pipeline()) == "Pipeline: (identity)"
    assert repr(xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(device_prefetch_size=2))) == (
        "Pipeline: with_device() -> wrap_loader_mp(batchdim=0, batches_per_execution=1, "
        "device_prefetch_size=2, host_to_device_transfer_threads=1, loader_prefetch_size=16)"
    )
    setup = tiny_setup()
    assert xp.Pipeline()(setup) is setup


def test_description_is_json_and_rebuilds_an_equal_pipeline():
    pipeline = xp.Pipeline(*FIVE)
    text = json.dumps(pipeline.describe())
    again = xp.Pipeline.from_description(json.loads(text))
    assert again == pipeline and hash(again) == hash(pipeline)
    assert again.names == pipeline.names


def test_an_outline_keeps_names_params_and_relations_and_plans_like_the_pipeline():
    pipeline = xp.Pipeline(xp.static_shapes(length=8), *FIVE, xp.clip_grad_norm(1.0))
    outline = json.loads(json.dumps(pipeline.outline()))
    again = xp.Pipeline.from_outline(outline)
    assert again == pipeline and again.describe() == pipeline.describe()
    for a, b in zip(again.transforms, pipeline.transforms):
        assert (a.needs, a.after, a.excludes, a.reasons) == (b.needs, b.after, b.excludes, b.reasons)
    # applied, each practice is rebuilt from the registry: the same effects and hooks as the real one
    real, applied = pipeline(tiny_setup()), again(tiny_setup())
    assert [t.name for t in applied.applied] == [t.name for t in real.applied]
    assert [type(h) for h in applied.hooks] == [type(h) for h in real.hooks] != []
    assert applied.effects == real.effects != ()
    # what planning asks of it, it answers as the real pipeline does
    assert again.without("with_device", dependents=True) == pipeline.without("with_device", dependents=True)
    with pytest.raises(xp.OrderError) as real:
        xp.Pipeline(xp.wrap_loader_mp(), xp.with_device())
    with pytest.raises(xp.OrderError) as outlined:
        xp.Pipeline.from_outline(xp.Pipeline(xp.with_device(), xp.wrap_loader_mp()).outline()[::-1])
    assert str(outlined.value) == str(real.value)
    with pytest.raises(ValueError, match='an outline is an object with "name"'):
        xp.Pipeline.from_outline([{"name": "with_device", "nedds": []}])


def test_the_torch_free_list_of_practices_is_the_registered_built_ins():
    from xlapipe.transform import FACTORIES, PRACTICES

    builtins = {n for n, f in FACTORIES.items() if f.__module__.startswith("xlapipe.transforms.")}
    assert builtins == PRACTICES


def test_pipelines_are_equal_when_they_list_the_same_transforms_in_the_same_order():
    a = xp.Pipeline(xp.with_device(), xp.set_default_tensor_type(), xp.wrap_loader_mp())
    same = xp.Pipeline(xp.with_device(), xp.set_default_tensor_type(), xp.wrap_loader_mp())
    other_order = xp.Pipeline(xp.set_default_tensor_type(), xp.with_device(), xp.wrap_loader_mp())
    assert a == same and hash(a) == hash(same) and {a, same} == {a}
    assert a != other_order  # what is listed first acts first: order is part of the value
    assert a != xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())


def test_without_replace_add():
    pipeline = xp.Pipeline(*FIVE)
    assert pipeline.without("set_default_tensor_type").names == (
        "with_device",
        "with_precision",
        "wrap_model_mp",
        "wrap_loader_mp",
    )
    with pytest.raises(xp.OrderError, match="wrap_model_mp needs with_device"):
        pipeline.without("with_device")
    assert pipeline.without("with_device", dependents=True).names == (
        "with_precision",
        "set_default_tensor_type",
    )
    swapped = pipeline.replace(xp.with_precision("bf16"))
    assert swapped["with_precision"] == xp.with_precision("bf16")
    assert swapped.names == pipeline.names
    with pytest.raises(KeyError, match="no shard_data"):
        pipeline.without("shard_data")
    # add() puts a transform at the latest position its relations allow
    added = xp.Pipeline(xp.set_default_tensor_type()).add(xp.with_device())
    assert added.names == ("set_default_tensor_type", "with_device")
    needs_first = xp.Pipeline(xp.with_device()).add(xp.wrap_loader_mp())
    assert needs_first.names == ("with_device", "wrap_loader_mp")
    with pytest.raises(xp.OrderError, match="already in"):
        needs_first.add(xp.with_device())
    with pytest.raises(xp.OrderError, match="needs with_device"):
        xp.Pipeline().add(xp.wrap_loader_mp())


def test_pipeline_is_immutable_and_contains_names_and_transforms():
    pipeline = xp.Pipeline(xp.with_device())
    with pytest.raises(AttributeError):
        pipeline.transforms = ()
    assert "with_device" in pipeline and xp.with_device() in pipeline
    assert "wrap_loader_mp" not in pipeline and len(pipeline) == 1


def test_setup_is_frozen_and_validated():
    setup = tiny_setup()
    with pytest.raises(AttributeError):
        setup.device = "xla"
    with pytest.raises(ValueError):
        setup.evolve(device="tpu")
    with pytest.raises(TypeError, match="loaders must be a mapping"):
        setup.evolve(loaders=[1, 2])
    with pytest.raises(TypeError):
        setup.loaders["x"] = []  # read-only mapping


def test_record_and_applied_names():
    setup = xp.Pipeline(xp.with_device(), xp.with_precision("bf16"))(tiny_setup())
    assert setup.applied_names == ("with_device", "with_precision")
    assert setup.record("with_precision") == (("mode", "autocast"), ("name", "bf16"))
    assert setup.record("wrap_loader_mp") is None
    assert setup.device == "xla" and setup.precision == xp.Precision("bf16")


def test_transform_params_must_be_plain_data():
    with pytest.raises(TypeError, match="plain data"):
        xp.Transform("x", lambda s: s, {"dtype": torch.float32})


def needs_loader_mp() -> xp.Transform:
    """A user's transform that needs wrap_loader_mp (which needs with_device): a chain of needs."""
    return xp.Transform("needs_loader_mp", lambda setup: setup, needs=("wrap_loader_mp",))


def test_without_dependents_follows_needs_transitively():
    # No built-in transform needs one that needs another: a user's transform makes the chain.
    pipeline = xp.Pipeline(
        xp.with_device(), xp.with_precision("fp32"), xp.wrap_loader_mp(), needs_loader_mp()
    )
    assert pipeline.without("with_device", dependents=True).names == ("with_precision",)
    assert pipeline.without("wrap_loader_mp", dependents=True).names == ("with_device", "with_precision")
    with pytest.raises(xp.OrderError, match="needs_loader_mp needs wrap_loader_mp"):
        pipeline.without("wrap_loader_mp")


def test_leave_one_out_drops_transitive_dependents_and_names_them():
    from xlapipe.ablation import leave_one_out

    pipeline = xp.Pipeline(
        xp.with_device(), xp.wrap_loader_mp(), needs_loader_mp(), xp.set_default_tensor_type()
    )
    plan = leave_one_out(pipeline)
    by_name = {v.name: v.pipeline.names for v in plan.variants}
    assert by_name["-with_device (and needs_loader_mp, wrap_loader_mp)"] == ("set_default_tensor_type",)
    assert by_name["-wrap_loader_mp (and needs_loader_mp)"] == ("with_device", "set_default_tensor_type")
    assert by_name["-needs_loader_mp"] == ("with_device", "wrap_loader_mp", "set_default_tensor_type")


def test_an_unregistered_transform_can_be_followed_by_others():
    mine = xp.Transform("mine", lambda setup: setup)
    setup = xp.with_device()(mine(tiny_setup()))
    assert setup.applied_names == ("mine", "with_device")
    assert setup.record("mine") == ()


def test_register_refuses_a_factory_named_unlike_its_transforms():
    def other() -> xp.Transform:
        return xp.Transform("not_other", lambda setup: setup)

    def later(flag: bool) -> xp.Transform:  # cannot be probed without arguments: checked when called
        return xp.Transform("not_later", lambda setup: setup)

    with pytest.raises(ValueError, match="the factory other builds a transform named 'not_other'"):
        xp.register(other)
    checked = xp.register(later)
    try:
        with pytest.raises(ValueError, match="the factory later builds a transform named 'not_later'"):
            checked(True)
    finally:
        from xlapipe.transform import FACTORIES

        FACTORIES.pop("later", None)
    assert "other" not in FACTORIES


def test_pipelines_compose_with_plus():
    base = xp.Pipeline(xp.with_device())
    assert (base + xp.wrap_loader_mp()).names == ("with_device", "wrap_loader_mp")
    assert (xp.Pipeline(xp.set_default_tensor_type()) + base).names == (
        "set_default_tensor_type",
        "with_device",
    )
    assert base + xp.Pipeline() == base
    with pytest.raises(xp.OrderError, match="already in"):
        base + base
    with pytest.raises(TypeError):
        base + "with_device"


def test_removing_what_others_need_names_the_way_out():
    pipeline = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())
    with pytest.raises(
        xp.OrderError,
        match=r"pipeline.without\('with_device', dependents=True\) also removes "
        r"wrap_loader_mp",
    ):
        pipeline.without("with_device")


@pytest.mark.parametrize(
    "description, message",
    [
        ({"name": "with_device"}, "a pipeline description is a list"),
        ([{"params": {}}], 'item 0 of the pipeline description must be an object with a "name"'),
        (["with_device"], "item 0 of the pipeline description must be an object"),
        ([{"name": "with_device", "params": None}], "the params of item 0 (with_device) must be an object"),
        ([{"name": "with_device", "param": {}}], "unknown keys ['param']"),
        ([{"name": "nope"}], "unknown transform 'nope'"),
        ([{"name": "wrap_loader_mp", "params": {"size": 2}}], "cannot rebuild wrap_loader_mp"),
    ],
)
def test_malformed_descriptions_are_refused_clearly(description, message):
    with pytest.raises(ValueError) as info:
        xp.Pipeline.from_description(description)
    assert message in str(info.value)


def test_a_setup_does_not_follow_later_edits_of_the_users_loader_dict():
    loaders = {"train": tiny_loader()}
    setup = xp.TrainingSetup(tiny_model(), None, loaders)
    loaders["eval"] = tiny_loader()
    loaders["train"] = [1, 2, 3]
    assert set(setup.loaders) == {"train"} and isinstance(setup.loaders["train"], torch.utils.data.DataLoader)


@pytest.mark.parametrize("bad", [0.5, "a", None])
def test_scheduler_none_or_a_factory_only(bad):
    if bad is None:
        assert xp.TrainingSetup(tiny_model(), None, scheduler=None).scheduler is None
        return
    with pytest.raises(TypeError, match="scheduler must be a function of the optimizer"):
        xp.TrainingSetup(tiny_model(), None, scheduler=bad)
