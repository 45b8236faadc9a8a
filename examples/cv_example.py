"""A small ResNet classifying generated images, trained the TPU way.

The model is a ResNet written in plain torch (no torchvision); the images are
generated here, deterministic by ``--seed``: 10 classes, each a striped
pattern with its own orientation, stripe width and colour, under random
phase, contrast and noise. The same practices, flags and report as the NLP
example (there are no variable shapes here, so no static_shapes).

    python examples/cv_example.py --size tiny --epochs 1 --max-steps 20
    python examples/cv_example.py --accumulate 4 --max-grad-norm 1.0

See docs/examples.md for every flag and the report's fields.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402  (sets PJRT_DEVICE before torch_xla loads)

# isort: split
import torch  # noqa: E402
from torch import nn  # noqa: E402

import xlapipe as xp  # noqa: E402

CLASSES = 10
NOISE = 0.8

MODELS = {  # stage widths and residual blocks per stage
    "base": dict(widths=(64, 128, 256, 512), blocks=2),  # ResNet-18's layout
    "small": dict(widths=(32, 64, 128), blocks=1),
    "tiny": dict(widths=(8, 16), blocks=1),
}
PRESETS = {
    "base": dict(lr=1e-3, batch_size=128, train_size=8192, eval_size=1024, image_size=32),
    "small": dict(lr=2e-3, batch_size=64, train_size=8192, eval_size=1024, image_size=32),
    "tiny": dict(lr=3e-3, batch_size=32, train_size=2048, eval_size=256, image_size=16),
}


# -- data ------------------------------------------------------------------------------


class Stripes(torch.utils.data.Dataset):
    """``n`` images of ``size`` x ``size``; item ``i`` depends only on ``seed`` and ``i``."""

    def __init__(self, n: int, size: int, seed: int):
        self.n, self.size, self.seed = n, size, seed
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        colours = torch.Generator().manual_seed(12345)  # the classes are the same for every seed
        self.colour = 0.3 + 0.7 * torch.rand(CLASSES, 3, generator=colours)
        self.angle = torch.arange(CLASSES) * math.pi / CLASSES
        self.frequency = 2.0 + (torch.arange(CLASSES) % 3).float()
        axis = torch.arange(size, dtype=torch.float32) / size
        self.y, self.x = torch.meshgrid(axis, axis, indexing="ij")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        c = int(self.labels[i])
        phase, contrast = 2 * math.pi * torch.rand((), generator=g), 0.5 + torch.rand((), generator=g)
        along = self.x * math.cos(self.angle[c]) + self.y * math.sin(self.angle[c])
        stripes = torch.sin(2 * math.pi * self.frequency[c] * along + phase)
        image = contrast * self.colour[c][:, None, None] * stripes
        return image + NOISE * torch.randn(3, self.size, self.size, generator=g), self.labels[i]


# -- model -----------------------------------------------------------------------------


class Block(nn.Module):
    """The basic residual block: two 3x3 convolutions, a projection when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """A CIFAR-style ResNet: 3x3 stem, stages that halve the resolution, pooled head."""

    def __init__(self, widths: tuple[int, ...], blocks: int, classes: int = CLASSES):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        layers, cin = [], widths[0]
        for i, width in enumerate(widths):
            for j in range(blocks):
                layers.append(Block(cin, width, 2 if (i > 0 and j == 0) else 1))
                cin = width
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)).mean(dim=(2, 3)))


# -- the workload ----------------------------------------------------------------------


def build(args: argparse.Namespace) -> xp.TrainingSetup:
    """Model, AdamW and loaders, on the CPU."""
    model = ResNet(**MODELS[args.size])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(args.seed)
    train = torch.utils.data.DataLoader(
        Stripes(args.train_size, args.image_size, args.seed),
        batch_size=args.batch_size,
        shuffle=True,
        generator=generator,
    )
    evaluation = torch.utils.data.DataLoader(
        Stripes(args.eval_size, args.image_size, args.seed + 10_000), batch_size=args.batch_size
    )
    return xp.TrainingSetup(model, optimizer, {"train": train, "eval": evaluation})


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def predict(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = batch
    return model(images).argmax(-1), labels


def scheduler(optimizer: torch.optim.Optimizer, total_steps: int, args: argparse.Namespace):
    """Linear warm-up over the first 10% of updates, then linear decay to zero."""
    warmup = max(1, total_steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image-size", type=int, default=None, help="image side in pixels (default: per size)")


WORKLOAD = _common.Workload(
    name="cv",
    description=__doc__.split("\n")[0],
    presets=PRESETS,
    add_flags=add_flags,
    build=build,
    loss_fn=loss_fn,
    predict=predict,
    scheduler=scheduler,
)

if __name__ == "__main__":
    _common.main(WORKLOAD)
