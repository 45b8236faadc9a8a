"""hf_traced_masks: transformers' masks stay on the device; nothing else changes."""

from __future__ import annotations

import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as met
from transformers import BertConfig, BertForSequenceClassification, masking_utils

import xlapipe as xp
from xlapipe import effects

CONFIG = dict(
    num_hidden_layers=1,
    hidden_size=32,
    num_attention_heads=2,
    intermediate_size=64,
    vocab_size=64,
    num_labels=2,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(**CONFIG)).eval()


def batch(padded: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(4, 12, dtype=torch.long)
    if padded:
        mask[:, 9:] = 0
    return {"input_ids": torch.randint(1, 64, (4, 12), generator=g), "attention_mask": mask}


def executions() -> int:
    data = met.metric_data("ExecuteTime")
    return int(data[0]) if data else 0


def forward(setup: xp.TrainingSetup, padded: bool) -> tuple[torch.Tensor, int]:
    """Logits of one forward in a session, and the XLA executions the forward itself ran."""
    with xp.session(setup) as run, torch.no_grad():
        inputs = xp.to_device(batch(padded), run.device)
        torch_xla.sync()
        before = executions()
        logits = run.model(**inputs).logits
        during = executions() - before
        return logits.cpu(), during


@pytest.mark.parametrize("padded", [False, True])
def test_forward_reads_nothing_on_the_host_and_gives_the_same_logits(padded):
    plain = xp.with_device()(xp.TrainingSetup(bert()))
    traced = xp.hf_traced_masks()(plain)
    plain_logits, plain_runs = forward(plain, padded)
    traced_logits, traced_runs = forward(traced, padded)
    assert plain_runs == 1  # transformers' padding_mask.all() ran a graph mid-forward
    assert traced_runs == 0
    torch.testing.assert_close(traced_logits, plain_logits, rtol=1e-6, atol=1e-6)
    eager = bert()(**batch(padded)).logits
    torch.testing.assert_close(traced_logits, eager.detach(), rtol=1e-4, atol=1e-5)


def test_is_tracing_restored_on_exit_and_on_error():
    original = masking_utils.is_tracing
    setup = xp.Pipeline(xp.with_device(), xp.hf_traced_masks())(xp.TrainingSetup(bert()))
    before = effects.snapshot()
    with xp.session(setup) as run:
        assert masking_utils.is_tracing is not original
        assert masking_utils.is_tracing(torch.ones(1, device=run.device))
        assert not masking_utils.is_tracing(torch.ones(1))
    assert masking_utils.is_tracing is original
    with pytest.raises(ZeroDivisionError):
        with xp.session(setup):
            1 / 0  # noqa: B018 - the error raised inside the session
    assert masking_utils.is_tracing is original
    assert effects.snapshot() == before


def test_trains_like_the_pipeline_without_it():
    def losses(with_masks: bool) -> list[float]:
        model = bert().train()
        data = [{**batch(padded=i % 2 == 1), "labels": torch.tensor([0, 1, 1, 0])} for i in range(4)]
        setup = xp.TrainingSetup(model, lambda p: torch.optim.AdamW(p, lr=1e-2), {"train": data})
        pipeline = xp.Pipeline(xp.with_device(), *([xp.hf_traced_masks()] if with_masks else []))
        with xp.session(pipeline(setup)) as run:
            return [float(run.step(b, lambda m, b: m(**b).loss)) for b in run.loaders["train"]]

    assert losses(True) == pytest.approx(losses(False), rel=1e-6)


def test_described_and_rebuilt():
    pipeline = xp.Pipeline(xp.with_device(), xp.hf_traced_masks())
    assert xp.Pipeline.from_description(pipeline.describe()) == pipeline
    assert pipeline(xp.TrainingSetup(bert())).summary()["effects"] == [
        {"effect": "correct_batch_norm", "device": "xla"},  # with_device's kernel fixes
        {"effect": "correct_elu_gradient", "device": "xla"},
        {"effect": "correct_norm", "device": "xla"},
        {"effect": "correct_extrema", "device": "xla"},
        {"effect": "correct_empty_dims", "device": "xla"},
        {"effect": "correct_diagonal", "device": "xla"},
        {"effect": "correct_interpolate", "device": "xla"},
        {"effect": "correct_batched_svd", "device": "xla"},
        {"effect": "hf_traced_masks"},
    ]


def test_no_host_reads_refuses_a_transformers_model_at_start_unless_masks_are_traced():
    # transformers asks padding_mask.all() on the host in every forward: without hf_traced_masks
    # no_host_reads would refuse the first step; refused when the session starts instead.
    def setup() -> xp.TrainingSetup:
        model = bert().train()
        return xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def loss(model, b):
        return model(**b, labels=torch.zeros(4, dtype=torch.long, device=b["input_ids"].device)).loss

    bare = xp.Pipeline(xp.with_device(), xp.no_host_reads())
    with pytest.raises(ValueError, match=r"Add hf_traced_masks\(\)"):
        with xp.session(bare(setup())):
            pass
    traced = xp.Pipeline(xp.with_device(), xp.hf_traced_masks(), xp.no_host_reads())
    with xp.session(traced(setup())) as run:
        losses = [float(run.step(xp.to_device(batch(True), run.device), loss)) for _ in range(3)]
    with xp.session(xp.Pipeline(xp.with_device(), xp.hf_traced_masks())(setup())) as run:
        want = [float(run.step(xp.to_device(batch(True), run.device), loss)) for _ in range(3)]
    assert losses == want
