"""BERT sentence-pair classification on an MRPC-shaped task, trained the TPU way.

The workload of the original benchmark: ``BertForSequenceClassification``
(built from a ``BertConfig``: no weights, nothing downloaded), sentence pairs,
2 labels, 3668 training and 408 validation pairs, batch size 16, AdamW with a
linear schedule and 100 warm-up steps. The pairs are generated here,
deterministic by ``--seed``: label 1 when the second sentence is a noisy
reordering of the first, 0 when it is an unrelated sentence on another topic.
Pairs are 20 to 110 tokens long, so how batches are padded matters on XLA.

    python examples/nlp_example.py --size tiny --epochs 1 --max-steps 20
    python examples/nlp_example.py --accumulate 2 --max-grad-norm 1.0 --log-every 10
    python examples/nlp_example.py --without static_shapes --print-pipeline

See docs/examples.md for every flag and the report's fields.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402  (sets PJRT_DEVICE and HF_HUB_OFFLINE before torch_xla loads)

# isort: split
import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup  # noqa: E402

import xlapipe as xp  # noqa: E402

# Token ids as in bert-base-cased; the synthetic words come after them.
PAD, CLS, SEP = 0, 101, 102
FIRST_WORD = 1000
TOPICS, WORDS_PER_TOPIC = 8, 8
MAX_SEGMENT, MAX_PAIR = 52, 110
LR_WARMUP_STEPS = 100

MODELS = {  # BertConfig arguments per size
    "base": dict(
        num_hidden_layers=12,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        vocab_size=28996,
    ),  # bert-base-cased
    "small": dict(
        num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024, vocab_size=28996
    ),
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=128,
        num_attention_heads=2,
        intermediate_size=512,
        vocab_size=2048,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    ),
}
# 2e-5 is the original's rate for fine-tuning a pre-trained BERT; these models
# start from random weights, and the small ones need a larger rate to learn
# within a few hundred steps.
PRESETS = {
    "base": dict(lr=2e-5, batch_size=16, train_size=3668, eval_size=408),
    "small": dict(lr=3e-4, batch_size=16, train_size=3668, eval_size=408),
    "tiny": dict(lr=5e-4, batch_size=16, train_size=3668, eval_size=408),
}


# -- data ------------------------------------------------------------------------------


def _segment_length(rng: random.Random) -> int:
    return min(MAX_SEGMENT, 8 + int(rng.gammavariate(2.0, 1 / 0.12)))


def _sentence(rng: random.Random, topic: int, length: int) -> list[int]:
    return [FIRST_WORD + topic * WORDS_PER_TOPIC + rng.randrange(WORDS_PER_TOPIC) for _ in range(length)]


def _paraphrase(rng: random.Random, a: list[int], topic: int) -> list[int]:
    """``a`` with its chunks reordered, some words swapped, dropped or added."""
    cuts = sorted(rng.randrange(1, len(a)) for _ in range(rng.randrange(1, 3)))
    chunks = [a[s:e] for s, e in zip([0, *cuts], [*cuts, len(a)])]
    rng.shuffle(chunks)
    b = [t for chunk in chunks for t in chunk]
    b = [_sentence(rng, topic, 1)[0] if rng.random() < 0.15 else t for t in b]
    b = [t for t in b if rng.random() > 0.08] or b[:1]
    for _ in range(rng.randrange(4)):
        b.insert(rng.randrange(len(b) + 1), _sentence(rng, topic, 1)[0])
    return b


def make_pairs(n: int, seed: int) -> list[tuple[list[int], list[int], int]]:
    """``n`` tokenised pairs ``(input_ids, token_type_ids, label)``, half of each label."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        topic = rng.randrange(TOPICS)
        a = _sentence(rng, topic, _segment_length(rng))
        label = int(rng.random() < 0.5)
        if label:
            b = _paraphrase(rng, a, topic)
        else:
            other = (topic + rng.randrange(1, TOPICS)) % TOPICS
            b = _sentence(rng, other, _segment_length(rng))
        b = b[: MAX_PAIR - 3 - len(a)]
        pairs.append(([CLS, *a, SEP, *b, SEP], [0] * (len(a) + 2) + [1] * (len(b) + 1), label))
    return pairs


class Pairs(torch.utils.data.Dataset):
    """Pairs as dicts of 1-D tensors, as a tokenizer would give them."""

    def __init__(self, pairs: list[tuple[list[int], list[int], int]]):
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, types, label = self.pairs[i]
        return {
            "input_ids": torch.tensor(ids),
            "token_type_ids": torch.tensor(types),
            "attention_mask": torch.ones(len(ids), dtype=torch.long),
            "labels": torch.tensor(label),
        }


def pad_to_longest(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The usual dynamic padding: each batch as long as its longest pair."""
    length = max(len(item["input_ids"]) for item in items)
    batch = {}
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        out = torch.full((len(items), length), PAD, dtype=torch.long)
        for row, item in enumerate(items):
            out[row, : len(item[key])] = item[key]
        batch[key] = out
    batch["labels"] = torch.stack([item["labels"] for item in items])
    return batch


# -- the workload ----------------------------------------------------------------------


def build(args: argparse.Namespace) -> xp.TrainingSetup:
    """Model, AdamW and loaders, on the CPU."""
    model = BertForSequenceClassification(BertConfig(num_labels=2, **MODELS[args.size]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    train = torch.utils.data.DataLoader(
        Pairs(make_pairs(args.train_size, args.seed)),
        batch_size=args.batch_size,
        shuffle=True,
        generator=generator,
        collate_fn=pad_to_longest,
    )
    evaluation = torch.utils.data.DataLoader(
        Pairs(make_pairs(args.eval_size, args.seed + 10_000)),
        batch_size=args.batch_size,
        collate_fn=pad_to_longest,
    )
    return xp.TrainingSetup(model, optimizer, {"train": train, "eval": evaluation})


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def predict(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return model(**inputs).logits.argmax(-1), batch["labels"]


def scheduler(optimizer: torch.optim.Optimizer, total_steps: int, args: argparse.Namespace):
    """The original's linear schedule: 100 warm-up updates, then linear decay to zero."""
    return get_linear_schedule_with_warmup(optimizer, LR_WARMUP_STEPS, total_steps)


WORKLOAD = _common.Workload(
    name="nlp",
    description=__doc__.split("\n")[0],
    presets=PRESETS,
    build=build,
    loss_fn=loss_fn,
    predict=predict,
    scheduler=scheduler,
    text=True,
    transformers=True,
)

if __name__ == "__main__":
    _common.main(WORKLOAD)
