"""Accelerate's examples/nlp_example.py, ported to xlapipe: the port docs/porting.md walks through.

BERT on MRPC-shaped sentence pairs with gradient accumulation (when the batch
size is larger than fits), clipping, the linear schedule and evaluation each
epoch. The pairs are generated (examples/nlp_example.py) and the model is
built from a config, so nothing is downloaded.

    python examples/accelerate_nlp_example.py --batch-size 32 --epochs 1
    python examples/accelerate_nlp_example.py --bf16          # on a TPU
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from nlp_example import MODELS, Pairs, make_pairs, pad_to_longest  # noqa: E402  (generated MRPC-shaped pairs)

# isort: split
from torch.utils.data import DataLoader  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup  # noqa: E402

import xlapipe as xp  # noqa: E402

MAX_GPU_BATCH_SIZE = 16
EVAL_BATCH_SIZE = 32


def loss_fn(model, batch):
    return model(**batch).loss


def training_function(config: dict, args: argparse.Namespace) -> dict:
    lr, num_epochs, seed, batch_size = (
        config["lr"],
        config["num_epochs"],
        config["seed"],
        config["batch_size"],
    )

    # If the batch size is too big we use gradient accumulation
    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE

    # Pad to the longest pair, as off TPU; static_shapes below pads to 128 for XLA.
    train_dataloader = DataLoader(
        Pairs(make_pairs(args.train_size, seed)),
        shuffle=True,
        collate_fn=pad_to_longest,
        batch_size=batch_size,
    )
    eval_dataloader = DataLoader(
        Pairs(make_pairs(args.eval_size, seed + 1)),
        shuffle=False,
        collate_fn=pad_to_longest,
        batch_size=EVAL_BATCH_SIZE,
    )

    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(num_labels=2, **MODELS[args.size]))
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=lr)

    # The schedule counts optimizer updates; the run builds it on its own optimizer.
    num_updates = math.ceil(len(train_dataloader) / gradient_accumulation_steps) * num_epochs
    setup = xp.TrainingSetup(
        model,
        optimizer,
        {"train": train_dataloader, "eval": eval_dataloader},
        scheduler=lambda opt: get_linear_schedule_with_warmup(
            opt, num_warmup_steps=100, num_training_steps=num_updates
        ),
    )
    pipeline = xp.Pipeline(
        xp.with_device(),
        xp.hf_traced_masks(),
        xp.static_shapes(length=128),  # "On TPU it's best to pad everything to the same length"
        xp.wrap_loader_mp(),
        xp.accumulate_grad(gradient_accumulation_steps),
        xp.clip_grad_norm(1.0),
    )
    if args.bf16:
        pipeline = pipeline + xp.with_precision("bf16")

    with xp.session(pipeline(setup)) as run:
        for epoch in range(num_epochs):
            for batch in run.batches("train"):
                run.step(batch, loss_fn)

            correct, total = 0, 0
            with run.evaluating():
                for batch in run.batches("eval"):
                    predictions = run.model(**batch).logits.argmax(dim=-1)
                    correct += (run.gather(predictions) == run.gather(batch["labels"])).sum()
                    total += len(run.gather(batch["labels"]))
            eval_metric = {"accuracy": float(correct) / total}
            if run.is_main:
                print(f"epoch {epoch}:", eval_metric, flush=True)
    run.copy_weights_to(model)  # the trained weights, back in the model built above
    return eval_metric


def main() -> None:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--bf16", action="store_true", help="train in bf16 (autocast), as on a TPU")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--size", choices=tuple(MODELS), default="small")
    parser.add_argument("--train-size", type=int, default=3668)
    parser.add_argument("--eval-size", type=int, default=408)
    args = parser.parse_args()
    config = {"lr": 3e-4, "num_epochs": args.epochs, "seed": 42, "batch_size": args.batch_size}
    training_function(config, args)


if __name__ == "__main__":
    main()
