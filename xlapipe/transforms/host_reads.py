"""no_host_reads: a step that reads a device tensor on the host is refused, naming the line.

Reading a tensor's value before the step marker (``float(loss)`` for a log
line, ``.item()`` or ``if mask.all():`` in a model's forward, ``print(t)``)
makes torch_xla run the graph traced so far, wait for it, and copy the value
back: an extra execution per read and a graph cut in two, often a new
compilation. It is torch_xla's most common avoidable slow-down, and invisible
in the code. Under this practice torch_xla allows no execution between the
start of the step and its end (``torch_xla._XLAC._set_allow_execution``, what
``torch_xla.compile(full_graph=True)`` uses); a read raises
:class:`HostReadError` with the line that read and the loss function that
called it. Move the read after the step (``log_every``, or read
``run.values`` after a step marker).

Refused with fp16 (the gradient scaler reads ``found_inf`` on the host every
step by design), and, when the session starts, with a transformers model unless
``hf_traced_masks`` is in the pipeline (transformers' mask code reads the mask
on the host in every forward). It excludes ``compile_step``: dynamo (``backend="openxla"``)
runs graphs while it captures them, and ``compile_step(backend="torch_xla",
full_graph=True)`` refuses host reads by itself, with the same error.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from typing import Any

import torch
from attrs import frozen

from xlapipe import claims
from xlapipe.claims import Claim
from xlapipe.hooks import Context, Hook, Step
from xlapipe.transform import Transform, register, unchanged

# torch's, torch_xla's and xlapipe's own frames are never the line to blame.
_LIBRARIES = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "torch_xla") + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(contextlib.__file__) + os.sep,
)  # Python's own library
_UNEXPECTED = "Unexpected execution"


class HostReadError(RuntimeError):
    """A device tensor was read on the host inside a training step."""


def _frames(error: BaseException) -> tuple[str | None, str | None]:
    """(the innermost frame outside torch, torch_xla and xlapipe; the outermost such frame)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(_LIBRARIES)]
    if not frames:
        return None, None
    describe = lambda f: f"{f.filename}:{f.lineno} (in {f.name}): {f.line or ''}".rstrip()  # noqa: E731
    return describe(frames[-1]), describe(frames[0])


def host_read_error(error: RuntimeError) -> RuntimeError:
    """``error`` as a :class:`HostReadError` naming the line, when torch_xla refused an execution."""
    if _UNEXPECTED not in str(error):
        return error
    read, entry = _frames(error)
    where = f" at {read}" if read else ""
    called = f", called from {entry}" if entry and entry != read else ""
    return HostReadError(
        f"a device tensor was read on the host inside the training step{where}{called}. Reading a "
        "value (float(t), t.item(), print(t), `if t.any():`) before the step marker runs the graph "
        "so far as an extra execution. Read it after the step: log_every(...), or run.values after "
        "the next step marker."
    )


@frozen
class NoHostReads(Hook):
    """The hook: no execution allowed between the start and the end of each step."""

    def start(self, run: Context) -> Hook:
        if run.scaler is not None:
            raise ValueError(
                "no_host_reads: fp16's gradient scaler reads found_inf on the host in every step; "
                "train in bf16, or drop no_host_reads"
            )
        from xlapipe.transforms.hf_masks import holds_transformers_model, masks_traced

        if holds_transformers_model(run.model) and not masks_traced():
            raise ValueError(
                "no_host_reads with a transformers model: transformers' attention-mask code asks on "
                "the host whether the mask pads anything (masking_utils: padding_mask.all()) in every "
                "forward, so the first step would be refused. Add hf_traced_masks() to the pipeline "
                "(it builds the masks on the device; harmless where no mask is read), or drop "
                "no_host_reads"
            )
        return self

    def wrap_step(self, step: Step) -> Step:
        import torch_xla

        xlac = torch_xla._XLAC

        def without_reads(batch: Any) -> tuple[torch.Tensor, bool]:
            allowed = xlac._get_allow_execution()
            xlac._set_allow_execution(False)
            try:
                return step(batch)
            except RuntimeError as error:
                raise host_read_error(error) from error
            finally:
                xlac._set_allow_execution(allowed)

        return without_reads


@register
def no_host_reads() -> Transform:
    """Refuse a training step that reads a device tensor on the host, naming the line."""
    return Transform(
        "no_host_reads",
        unchanged,
        needs=("with_device",),
        excludes=("compile_step",),
        hooks=(NoHostReads(),),
        reasons={
            "compile_step": "torch.compile's openxla backend runs graphs while it captures them, and "
            "compile_step(backend='torch_xla', full_graph=True) refuses host reads by itself: remove "
            "no_host_reads and use that",
        },
    )


claims.declare(
    Claim(
        "no_host_reads",
        no_host_reads,
        summary="a host read inside the step is an error naming its line",
        refuses=[claims.Refusal("hf_model", "Add hf_traced_masks", when="session")],
    )
)
