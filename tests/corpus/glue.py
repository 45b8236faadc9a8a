"""Hugging Face's ``run_glue_no_trainer.py`` on a tiny BERT, ported to xlapipe.

Upstream: https://github.com/huggingface/transformers,
``examples/pytorch/text-classification/run_glue_no_trainer.py`` at commit
a22a4378d97d06b7a1d9abad6e0086d30fdea199 (Apache-2.0, (c) The HuggingFace Inc. team).

What the port keeps: ``set_seed(args.seed)`` first; a shuffled training
``DataLoader`` and an evaluation one, batches padded to the longest item (what
``DataCollatorWithPadding`` does without ``pad_to_multiple_of``); AdamW over two
parameter groups (no weight decay for ``bias`` and ``LayerNorm.weight``);
``get_scheduler(args.lr_scheduler_type, ...)`` with ``num_warmup_steps`` over
``max_train_steps = num_train_epochs * ceil(len(train_dataloader) /
gradient_accumulation_steps)``; ``loss / gradient_accumulation_steps``; a
checkpoint every ``--checkpointing_steps`` updates (``step_{n}``) and
``--resume_from_checkpoint`` continuing mid-epoch; the stop at
``max_train_steps``; the accuracy of each epoch on the evaluation set.

What it changes, and why:

- The script's accumulation updates when ``step % gradient_accumulation_steps == 0
  or step == len(train_dataloader) - 1``: on the first micro-batch of each
  epoch, then every k-th (Accelerate's off-by-one, docs/porting.md), dividing
  the last, shorter window by k as well. ``accumulate_grad(k)`` updates on the
  k-th micro-batch and averages a short last window over its own length, so
  ``eager(args)`` takes ``accumulation="every_k"`` (the default) to be the loop
  the port is: ``(step + 1) % k == 0 or step == len - 1``, the loss divided by
  its window's length. ``accumulation="as_written"`` is the script's own loop
  (the two agree for k = 1, the script's default).
- ``--checkpointing_steps`` is checked on updates only (``run.updated``):
  under plain ``Accelerator()`` the script checks it on every micro-batch and,
  with k > 1, saves the same ``step_{n}`` again on the micro-batches after it.
- The resume needs no ``skip_first_batches``: ``run.batches`` continues the
  epoch where the checkpoint was written.
- Clipping is not in the script: with ``max_grad_norm`` set, both loops clip
  before the update (``accelerator.clip_grad_norm_``, as Accelerate's docs add it).

Left out: the dataset download and tokenizer (token ids are generated; 0 pads,
2 is ``[CLS]``, 3 ``[SEP]``), ``from_pretrained`` (a ``BertConfig`` of two
layers of width 32, dropout 0: eager CPU and XLA draw different masks),
trackers, the hub, the metric library (accuracy is counted).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification, get_scheduler, set_seed

import xlapipe as xp
from corpus.common import Average, Result, cpu_state, option
from xlapipe import checkpoint


@dataclass(frozen=True)
class Args:
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    learning_rate: float = 1e-3  # 5e-5 upstream: raised so that a dozen updates move a tiny model
    weight_decay: float = 0.01  # 0.0 upstream: set, so that the two groups differ
    num_train_epochs: int = 2
    max_train_steps: int | None = None
    gradient_accumulation_steps: int = 1
    lr_scheduler_type: str = "linear"
    num_warmup_steps: int = 2
    seed: int = 42
    output_dir: str = "out"
    checkpointing_steps: str | None = "4"
    resume_from_checkpoint: str | None = None
    max_length: int = 24
    # Not the script's: clipping (see the docstring), an average of the weights kept by hand
    # (eager) where the port lists ema, the accumulation loop of the eager run, the data's size,
    # and, to simulate a crash, a stop right after the first checkpoint is written.
    max_grad_norm: float | None = None
    ema_decay: float | None = None
    accumulation: str = "every_k"
    train_size: int = 44
    eval_size: int = 16
    stop_after_save: bool = False


FOLDER = "output_dir"  # the option naming the folder its checkpoints go to


def args_for(pipeline: xp.Pipeline, **overrides) -> Args:
    """The script's own options that the pipeline's practices stand for."""
    return Args(
        gradient_accumulation_steps=option(pipeline, "accumulate_grad", "steps", 1),
        max_grad_norm=option(pipeline, "clip_grad_norm", "max_norm"),
        ema_decay=option(pipeline, "ema", "decay"),
        **overrides,
    )


def without_checkpoints(args: Args) -> Args:
    return dataclasses.replace(args, checkpointing_steps=None)


def interrupted(args: Args, folder: str) -> Args:
    """The run that crashes right after writing its first checkpoint into ``folder``."""
    return dataclasses.replace(args, output_dir=folder, stop_after_save=True)


def resumed(args: Args, folder: str) -> Args:
    """The script started again with ``--resume_from_checkpoint`` on that checkpoint."""
    path = os.path.join(folder, f"step_{args.checkpointing_steps}.pt")
    return dataclasses.replace(args, output_dir=folder, resume_from_checkpoint=path)


def resume_point(args: Args) -> int:
    """Micro-batches trained before the first checkpoint (``step_{checkpointing_steps}``)."""
    updates = int(args.checkpointing_steps)
    per_epoch = math.ceil(batches_per_epoch(args) / args.gradient_accumulation_steps)
    epoch, within = divmod(updates, per_epoch)
    return epoch * batches_per_epoch(args) + within * args.gradient_accumulation_steps


def batches_per_epoch(args: Args) -> int:
    return math.ceil(args.train_size / args.per_device_train_batch_size)


# -- data and model ----------------------------------------------------------------------------


def pairs(n: int, seed: int, vocab_size: int = 64) -> list[dict[str, torch.Tensor]]:
    """Tokenized sentence pairs, ``[CLS] a [SEP] b [SEP]``, of 3 to 9 tokens each, with a label."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(n):
        a = torch.randint(4, vocab_size, (int(torch.randint(3, 10, (), generator=g)),), generator=g)
        b = torch.randint(4, vocab_size, (int(torch.randint(3, 10, (), generator=g)),), generator=g)
        ids = torch.cat([torch.tensor([2]), a, torch.tensor([3]), b, torch.tensor([3])])
        types = torch.cat(
            [torch.zeros(len(a) + 2, dtype=torch.long), torch.ones(len(b) + 1, dtype=torch.long)]
        )
        items.append(
            {
                "input_ids": ids,
                "token_type_ids": types,
                "attention_mask": torch.ones_like(ids),
                "labels": torch.randint(2, (), generator=g),
            }
        )
    return items


def pad_to_longest(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``DataCollatorWithPadding(tokenizer)``: each batch padded to its longest item (pad id 0)."""
    n = max(len(it["input_ids"]) for it in items)
    batch = {}
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        batch[key] = torch.zeros(len(items), n, dtype=torch.long)
        for row, it in enumerate(items):
            batch[key][row, : len(it[key])] = it[key]
    batch["labels"] = torch.stack([it["labels"] for it in items])
    return batch


def tiny_bert() -> BertForSequenceClassification:
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def build(args: Args):
    """The script up to its training loop: seed, datasets, loaders, model, optimizer, step counts."""
    set_seed(args.seed)
    train_dataset, eval_dataset = pairs(args.train_size, 0), pairs(args.eval_size, 1)
    model = tiny_bert()
    train_dataloader = DataLoader(
        train_dataset,
        shuffle=True,
        collate_fn=pad_to_longest,
        batch_size=args.per_device_train_batch_size,
        generator=torch.Generator().manual_seed(args.seed),
    )
    eval_dataloader = DataLoader(
        eval_dataset, collate_fn=pad_to_longest, batch_size=args.per_device_eval_batch_size
    )
    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": args.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.max_train_steps or args.num_train_epochs * num_update_steps_per_epoch
    num_train_epochs = math.ceil(max_train_steps / num_update_steps_per_epoch)
    return model, train_dataloader, eval_dataloader, optimizer, max_train_steps, num_train_epochs


def checkpointing_steps_of(args: Args) -> int | str | None:
    steps = args.checkpointing_steps
    return int(steps) if steps is not None and steps.isdigit() else steps


# -- the script, eager ----------------------------------------------------------------------------


def eager(args: Args) -> Result:
    """The training loop as written (the accumulation as ``args.accumulation`` says), on the CPU."""
    model, train_dataloader, eval_dataloader, optimizer, max_train_steps, num_train_epochs = build(args)
    lr_scheduler = get_scheduler(
        name=args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=max_train_steps,
    )
    checkpointing_steps = checkpointing_steps_of(args)
    average = Average(model, args.ema_decay) if args.ema_decay else None
    k, n = args.gradient_accumulation_steps, len(train_dataloader)
    result = Result([], {})
    completed_steps = 0
    for _epoch in range(num_train_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            result.losses.append(loss.item())
            if args.accumulation == "as_written":
                update, divisor = step % k == 0 or step == n - 1, k
            else:
                update, divisor = (step + 1) % k == 0 or step == n - 1, min(k, n - step // k * k)
            loss = loss / divisor
            loss.backward()
            if update:
                if args.max_grad_norm is not None:
                    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    result.norms.append(float(norm))
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                completed_steps += 1
                if average is not None:
                    average.update(model)
                if isinstance(checkpointing_steps, int) and completed_steps % checkpointing_steps == 0:
                    result.saves.append(completed_steps)  # accelerator.save_state(f"step_{n}")
            if completed_steps >= max_train_steps:
                break
        model.eval()
        correct = total = 0
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            correct += int((predictions == batch["labels"]).sum())
            total += len(batch["labels"])
        result.evals.append(correct / total)
    result.weights = cpu_state(model)
    result.average = average.average if average is not None else None
    return result


# -- the script, ported ---------------------------------------------------------------------------


def loss_fn(model, batch) -> torch.Tensor:
    return model(**batch).loss


def ported(pipeline: xp.Pipeline, args: Args) -> Result:
    model, train_dataloader, eval_dataloader, optimizer, max_train_steps, num_train_epochs = build(args)
    setup = xp.TrainingSetup(
        model,
        optimizer,
        {"train": train_dataloader, "eval": eval_dataloader},
        scheduler=lambda opt: get_scheduler(
            name=args.lr_scheduler_type,
            optimizer=opt,
            num_warmup_steps=args.num_warmup_steps,
            num_training_steps=max_train_steps,
        ),
    )
    checkpointing_steps = checkpointing_steps_of(args)
    result = Result([], {})
    losses = []
    with xp.session(pipeline(setup)) as run:
        if args.resume_from_checkpoint:
            checkpoint.restore(args.resume_from_checkpoint, run)
        stopped = False
        for _epoch in range(run.epoch, num_train_epochs):
            for batch in run.batches("train"):
                losses.append(run.step(batch, loss_fn))
                if isinstance(checkpointing_steps, int):
                    if run.updated and run.updates % checkpointing_steps == 0:
                        path = os.path.join(args.output_dir, f"step_{run.updates}.pt")
                        os.makedirs(args.output_dir, exist_ok=True)
                        checkpoint.save(path, run, step=run.updates)
                        result.saves.append(run.updates)
                        stopped = args.stop_after_save
                if stopped or run.updates >= max_train_steps:
                    break
            if stopped:
                break
            correct, total = 0, 0
            with run.evaluating():
                for batch in run.batches("eval"):
                    predictions = run.model(**batch).logits.argmax(dim=-1)
                    correct += (run.gather(predictions) == run.gather(batch["labels"])).sum()
                    total += len(run.gather(batch["labels"]))
            result.evals.append(float(correct) / total)
        result.losses = [float(v) for v in losses]
        result.weights = run.state_dict()
        if args.ema_decay:
            result.average = xp.averaged_weights(run)
    return result
