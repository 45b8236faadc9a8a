"""The practice subsets each ported script can take, and the slice of them CI runs.

Each script has slots, each slot filled by one of its options or left empty:
every combination is one subset, listed after ``with_device()`` (all fp32; the
pipelines are built, so an order xlapipe refuses would fail here). The slots
are the practices that stand for an option of the script itself
(``accumulate_grad`` for its gradient accumulation steps, ``clip_grad_norm`` for
its clipping, ``wrap_loader_mp`` for torch_xla's ``MpDeviceLoader``) or that
must leave its numbers as they are (``static_shapes``, ``compile_step``), and
``ema``, whose average the eager loop keeps by hand. ``wrap_loader_mp`` and
``static_shapes`` only where the script has loaders (nanoGPT feeds
``get_batch()``), ``static_shapes`` only for text.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import xlapipe as xp
from corpus import glue, mnist, nanogpt

COMPILE = [xp.compile_step(), xp.compile_step(backend="torch_xla")]
# nanoGPT's grad_clip is 1.0, but its tiny GPT's gradient norms are 0.6 to 0.8 here: at 0.7 some
# updates are clipped and some are not (test_corpus.py checks that the clipping is not idle).
NANOGPT_CLIP = xp.clip_grad_norm(0.7)
# run_glue_no_trainer.py does not clip (glue.py); its tiny BERT's norms are 0.001 to 0.53 here.
GLUE_CLIP = xp.clip_grad_norm(0.25)

SLOTS: dict[str, list[list[xp.Transform]]] = {
    "nanogpt": [
        [xp.accumulate_grad(2)],
        [NANOGPT_CLIP],
        # nanoGPT's rate set by hand is data of the compiled update under optimizer=True.
        [*COMPILE, xp.compile_step(optimizer=True)],
        [xp.ema(0.9)],
    ],
    "glue": [
        [xp.accumulate_grad(2)],
        [GLUE_CLIP],
        [xp.static_shapes(length=glue.Args.max_length)],
        [xp.wrap_loader_mp()],
        COMPILE,
    ],
    "mnist": [
        [xp.wrap_loader_mp()],
        COMPILE,
        [xp.ema(0.9)],
    ],
}

# What every pipeline of a script holds besides with_device: the script's own logging cadence.
ALWAYS: dict[str, list[xp.Transform]] = {
    "nanogpt": [],
    "glue": [],
    "mnist": [xp.log_every(mnist.Flags.log_steps, to=mnist.train_update)],
}

MODULES = {"nanogpt": nanogpt, "glue": glue, "mnist": mnist}

# Saves xlapipe refuses, with the words of its refusal: the test asserts them instead of a resume.
REFUSED_SAVES = {
    "compile_step(optimizer=True)": r"checkpoint\.save under compile_step\(optimizer=True\): torch_xla 2\.9's "
    r"dynamo bridge keeps the compiled update's optimizer state apart",
}


# Runs xlapipe refuses: BERT's pooler (tanh, then dropout as an identity) meets torch_xla 2.9's dynamo
# bridge handing graph outputs back out of order; compile_step checks the first run and refuses.
REFUSED_RUNS = {
    "glue+compile_step(openxla)": r"has handed back this graph's outputs in the wrong order \(seen in "
    r"torch_xla 2\.9 when an identity op, such as dropout in eval mode or with p=0, follows tanh, as in "
    r"BERT's pooler\)",
}


@dataclass(frozen=True)
class Case:
    script: str
    practices: tuple[xp.Transform, ...]

    @property
    def pipeline(self) -> xp.Pipeline:
        return xp.Pipeline(xp.with_device(), *ALWAYS[self.script], *self.practices)

    @property
    def module(self):
        return MODULES[self.script]

    @property
    def id(self) -> str:
        def short(t: xp.Transform) -> str:
            if t.name == "compile_step":
                params = dict(t.params)
                return "compile_step" + (
                    "(torch_xla)"
                    if params["backend"] == "torch_xla"
                    else "(optimizer)"
                    if params["optimizer"]
                    else ""
                )
            return t.name

        return self.script + ":" + ("+".join(short(t) for t in self.practices) or "with_device")

    @property
    def refused_run(self) -> str | None:
        """The refusal training under this subset gets (None: it trains)."""
        for t in self.practices:
            if self.script == "glue" and t.name == "compile_step" and dict(t.params)["backend"] == "openxla":
                return REFUSED_RUNS["glue+compile_step(openxla)"]
        return None

    @property
    def refused_save(self) -> str | None:
        """The refusal a checkpoint under this subset gets (None: it saves and resumes)."""
        for t in self.practices:
            if t.name == "compile_step" and dict(t.params)["optimizer"]:
                return REFUSED_SAVES["compile_step(optimizer=True)"]
        return None


def subsets(script: str) -> list[tuple[xp.Transform, ...]]:
    slots = [[None, *options] for options in SLOTS[script]]
    return [tuple(t for t in chosen if t is not None) for chosen in itertools.product(*slots)]


ALL: list[Case] = [Case(script, s) for script in SLOTS for s in subsets(script)]

# The CI slice: each script with its richest subset that trains, saves and resumes (both
# compile_step backends among them).
SLICE: list[Case] = [
    Case(
        "nanogpt",
        (xp.accumulate_grad(2), NANOGPT_CLIP, xp.compile_step(), xp.ema(0.9)),
    ),
    Case(
        "glue",
        (
            xp.accumulate_grad(2),
            GLUE_CLIP,
            xp.static_shapes(length=glue.Args.max_length),
            xp.wrap_loader_mp(),
            xp.compile_step(backend="torch_xla"),  # compile_step() is refused for BERT: REFUSED_RUNS
        ),
    ),
    Case("mnist", (xp.wrap_loader_mp(), xp.compile_step(), xp.ema(0.9))),
]
