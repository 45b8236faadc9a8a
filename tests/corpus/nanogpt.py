"""karpathy/nanoGPT's ``train.py``, with ``model.py``'s GPT scaled down, ported to xlapipe.

Upstream: https://github.com/karpathy/nanoGPT, ``train.py`` and ``model.py`` at commit
3adf61e154c3fe3fca428ad6bc3818b27a3b8291 (MIT licence, (c) Andrej Karpathy). The GPT
below is written out for these tests after ``model.py``: the same architecture
(pre-norm blocks, LayerNorm with an optional bias, causal self-attention through
``scaled_dot_product_attention``, a GELU MLP, the token embedding tied to the LM
head, N(0, 0.02) init with the residual projections scaled by 1/sqrt(2 n_layer),
cross-entropy with ``ignore_index=-1``) and the same ``configure_optimizers``:
AdamW over two parameter groups, weight decay on the tensors of two or more
dimensions only.

What the port keeps of ``train.py``: its globals as a config (scaled down); the
``torch.manual_seed(1337)`` before the model; the "poor man's data loader"
``get_batch()`` drawing offsets from torch's global generator (the corpus is a
seeded tensor of token ids instead of ``train.bin``); the cosine schedule with
warm-up, ``get_lr(it)``, set by hand on every parameter group of its *own*
optimizer at the top of each iteration; the evaluation every ``eval_interval``
iterations (``estimate_loss()``, ``eval_iters`` batches of each split) followed
by the checkpoint (``always_save_checkpoint``, not at iteration 0); gradient
accumulation (``loss / gradient_accumulation_steps`` per micro-step, the next
batch fetched between forward and backward); clipping at ``grad_clip`` (off at
0.0); ``max_iters + 1`` iterations; and on ``init_from='resume'``, the model
built from the checkpoint's ``model_args`` before anything else.

Left out: DDP, ``torch.compile`` (``compile_step`` is its counterpart here), the
GradScaler (fp32 here: the script's scaler is disabled unless float16),
wandb, MFU. Dropout is 0.0 (the script's default for pretraining): eager CPU
and XLA draw different masks.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import xlapipe as xp
from corpus.common import Average, Result, cpu_state, option
from xlapipe import checkpoint

# -- the model (model.py) --------------------------------------------------------------------------


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    """Layer normalisation whose bias can be left out."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        heads = [
            t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            for t in self.c_attn(x).split(self.n_embd, dim=2)
        ]
        q, k, v = heads
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.size(1)
        assert t <= self.config.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        groups = [
            {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)  # fused only on CUDA


# -- train.py's configuration, scaled down --------------------------------------------------------


@dataclass(frozen=True)
class Config:
    out_dir: str = "out"
    eval_interval: int = 4  # 2000 upstream
    eval_iters: int = 2  # 200
    always_save_checkpoint: bool = True
    init_from: str = "scratch"  # or "resume"
    gradient_accumulation_steps: int = 1  # 5 * 8
    batch_size: int = 4  # 12
    block_size: int = 16  # 1024
    n_layer: int = 2  # 12
    n_head: int = 2  # 12
    n_embd: int = 32  # 768
    dropout: float = 0.0
    bias: bool = False
    vocab_size: int = 64  # the dataset's meta.pkl vocab_size (shakespeare_char's is 65)
    learning_rate: float = 6e-3  # 6e-4: raised so that seven iterations move a tiny model
    max_iters: int = 6  # 600000
    weight_decay: float = 1e-1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # clip gradients at this value, or disable if == 0.0
    decay_lr: bool = True
    warmup_iters: int = 2  # 2000
    lr_decay_iters: int = 6  # 600000
    min_lr: float = 6e-4  # 6e-5
    # Not train.py's: an average of the weights kept by hand (eager) where the port lists ema;
    # and, to simulate a crash, stop right after the first checkpoint is written.
    ema_decay: float | None = None
    stop_after_save: bool = False


def args_for(pipeline: xp.Pipeline, **overrides) -> Config:
    """The script's own options that the pipeline's practices stand for."""
    return Config(
        gradient_accumulation_steps=option(pipeline, "accumulate_grad", "steps", 1),
        grad_clip=option(pipeline, "clip_grad_norm", "max_norm", 0.0),
        ema_decay=option(pipeline, "ema", "decay"),
        **overrides,
    )


def without_checkpoints(cfg: Config) -> Config:
    """Evaluation at iteration 0 only, where train.py never saves."""
    return dataclasses.replace(cfg, eval_interval=cfg.max_iters + 1)


def interrupted(cfg: Config, folder: str) -> Config:
    """The run that crashes right after writing its first checkpoint into ``folder``."""
    return dataclasses.replace(cfg, out_dir=folder, stop_after_save=True)


def resumed(cfg: Config, folder: str) -> Config:
    """The script started again with ``init_from='resume'`` on that folder."""
    return dataclasses.replace(cfg, out_dir=folder, init_from="resume")


def resume_point(cfg: Config) -> int:
    """Micro-steps done before the first checkpoint (written at iteration eval_interval)."""
    return cfg.eval_interval * cfg.gradient_accumulation_steps


FOLDER = "out_dir"  # the option naming the folder its checkpoints go to
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")


def tokens(n: int, vocab_size: int, seed: int) -> torch.Tensor:
    """The dataset's tokens: ``train.bin`` / ``val.bin`` stand-ins, from a generator of their own."""
    return torch.randint(vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


class Data:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.train, self.val = tokens(4096, cfg.vocab_size, 0), tokens(1024, cfg.vocab_size, 1)

    def get_batch(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = self.train if split == "train" else self.val
        bs = self.cfg.block_size
        ix = torch.randint(len(data) - bs, (self.cfg.batch_size,))  # torch's global generator
        x = torch.stack([data[i : i + bs] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + bs] for i in ix])
        return x, y


def get_lr(it: int, cfg: Config) -> float:
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    decay_ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


def model_args_of(cfg: Config) -> dict:
    return dict(
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_embd=cfg.n_embd,
        block_size=cfg.block_size,
        bias=cfg.bias,
        vocab_size=None,
        dropout=cfg.dropout,
    )


def plain_config(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


# -- the script, eager --------------------------------------------------------------------------


def eager(cfg: Config) -> Result:
    """train.py's loop as written, on the CPU (its own torch.save checkpoints and its own resume)."""
    torch.manual_seed(1337)
    data = Data(cfg)
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    iter_num, best_val_loss = 0, 1e9
    model_args = model_args_of(cfg)
    if cfg.init_from == "scratch":
        model_args["vocab_size"] = cfg.vocab_size
        model = GPT(GPTConfig(**model_args))
    else:
        ckpt = torch.load(ckpt_path, map_location="cpu")
        for k in MODEL_KEYS:
            model_args[k] = ckpt["model_args"][k]
        model = GPT(GPTConfig(**model_args))
        state_dict = ckpt["model"]
        for k in list(state_dict):
            if k.startswith("_orig_mod."):
                state_dict[k[len("_orig_mod.") :]] = state_dict.pop(k)
        model.load_state_dict(state_dict)
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), "cpu")
    if cfg.init_from == "resume":
        optimizer.load_state_dict(ckpt["optimizer"])
    ckpt = None
    average = Average(model, cfg.ema_decay) if cfg.ema_decay else None

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(cfg.eval_iters)
            for k in range(cfg.eval_iters):
                X, Y = data.get_batch(split)
                _, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = float(losses.mean())
        model.train()
        return out

    result = Result([], {})
    X, Y = data.get_batch("train")
    gas = cfg.gradient_accumulation_steps
    while True:
        lr = get_lr(iter_num, cfg) if cfg.decay_lr else cfg.learning_rate
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if iter_num % cfg.eval_interval == 0:
            losses = estimate_loss()
            result.evals += [losses["train"], losses["val"]]
            if losses["val"] < best_val_loss or cfg.always_save_checkpoint:
                best_val_loss = losses["val"]
                if iter_num > 0:
                    os.makedirs(cfg.out_dir, exist_ok=True)
                    torch.save(
                        {
                            "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "model_args": model_args,
                            "iter_num": iter_num,
                            "best_val_loss": best_val_loss,
                            "config": plain_config(cfg),
                        },
                        ckpt_path,
                    )
                    result.saves.append(iter_num)
                    if cfg.stop_after_save:
                        break
        for _micro_step in range(gas):
            _, loss = model(X, Y)
            result.losses.append(loss.item())
            loss = loss / gas
            X, Y = data.get_batch("train")
            loss.backward()
        if cfg.grad_clip != 0.0:
            result.norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)))
        optimizer.step()
        if average is not None:
            average.update(model)
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num > cfg.max_iters:
            break
    result.weights = cpu_state(model)
    result.average = average.average if average is not None else None
    return result


# -- the script, ported ---------------------------------------------------------------------------


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    X, Y = batch
    _, loss = model(X, Y)
    return loss


def ported(pipeline: xp.Pipeline, cfg: Config) -> Result:
    """train.py ported: its get_batch() fed to run.step, its rate set on its own optimizer, its
    checkpoint an xlapipe checkpoint whose ``extra`` holds what train.py's dict held (and the batch
    already fetched for the next iteration), its resume building the model from ``model_args``."""
    torch.manual_seed(1337)
    data = Data(cfg)
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    iter_num, best_val_loss = 0, 1e9
    model_args = model_args_of(cfg)
    saved = None
    if cfg.init_from == "scratch":
        model_args["vocab_size"] = cfg.vocab_size
    else:
        saved = checkpoint.load(ckpt_path)["extra"]  # model_args before the model is built
        for k in MODEL_KEYS:
            model_args[k] = saved["model_args"][k]
    model = GPT(GPTConfig(**model_args))
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), "xla")
    setup = xp.TrainingSetup(model, optimizer)  # no loaders: batches come from get_batch()
    result = Result([], {})
    gas = cfg.gradient_accumulation_steps
    with xp.session(pipeline(setup)) as run:
        resumed_at = None
        if saved is not None:
            checkpoint.restore(ckpt_path, run)
            iter_num, best_val_loss = saved["iter_num"], saved["best_val_loss"]
            X, Y = saved["batch"]
            resumed_at = iter_num  # its evaluation ran before the save: not again
        else:
            X, Y = data.get_batch("train")

        def estimate_loss() -> dict[str, float]:
            out = {}
            with run.evaluating():
                for split in ("train", "val"):
                    losses = torch.zeros(cfg.eval_iters)
                    for k in range(cfg.eval_iters):
                        _, loss = run.model(*xp.to_device(data.get_batch(split), run.device))
                        losses[k] = loss.item()
                    out[split] = float(losses.mean())
            return out

        losses = []
        while True:
            lr = get_lr(iter_num, cfg) if cfg.decay_lr else cfg.learning_rate
            for param_group in optimizer.param_groups:  # the script's own optimizer
                param_group["lr"] = lr
            if iter_num % cfg.eval_interval == 0 and iter_num != resumed_at:
                split_losses = estimate_loss()
                result.evals += [split_losses["train"], split_losses["val"]]
                if split_losses["val"] < best_val_loss or cfg.always_save_checkpoint:
                    best_val_loss = split_losses["val"]
                    if iter_num > 0:
                        extra = {
                            "model_args": model_args,
                            "iter_num": iter_num,
                            "best_val_loss": best_val_loss,
                            "config": plain_config(cfg),
                            "batch": (X, Y),
                        }
                        os.makedirs(cfg.out_dir, exist_ok=True)
                        checkpoint.save(ckpt_path, run, step=iter_num, extra=extra)
                        result.saves.append(iter_num)
                        if cfg.stop_after_save:
                            break
            for _micro_step in range(gas):
                losses.append(run.step((X, Y), loss_fn))  # an update every gas micro-steps
                X, Y = data.get_batch("train")
            iter_num += 1
            if iter_num > cfg.max_iters:
                break
        result.losses = [float(v) for v in losses]
        result.weights = run.state_dict()
        if cfg.ema_decay:
            result.average = xp.averaged_weights(run)
    return result
