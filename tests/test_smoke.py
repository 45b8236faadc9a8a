import xlapipe as xp
from helpers import eager_losses, tiny_setup, train_losses


def test_full_fp32_pipeline_matches_eager():
    pipeline = xp.Pipeline(
        xp.with_device(), xp.wrap_model_mp(), xp.wrap_loader_mp(), xp.set_default_tensor_type()
    )
    got = train_losses(pipeline(tiny_setup()), epochs=2)
    want = eager_losses(epochs=2)
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-5 * abs(w)
