"""optimizer: an optimizer built before ``model.to(device)``: it steps the CPU copies, the model never trains.

``module.to(xla_device)`` replaces the parameter objects; an optimizer built
before holds the old CPU tensors. Its ``step()`` then updates tensors no
forward pass uses (their gradients are None), and the model on the device
keeps its initial weights. No error, no warning: the loss just does not go down.
"""

from __future__ import annotations

from xlapipe.doctor.findings import Context, Finding


def check(context: Context) -> list[Finding]:
    found = []
    for record in context.timeline.all("stale_optimizer")[:1]:
        data = record.data
        built = context.frame_of(record, "built")
        moved = context.frame_of(record, "moved")
        stepped = context.frame_of(record, "step")
        where_moved = f" at {context.where(moved)}" if moved else ""
        fix = (
            f"build the optimizer after the model is moved: put this line after {context.where(moved)} "
            f"(`{_code(moved)}`)"
            if moved
            else "build the optimizer after model.to(device)"
        )
        found.append(
            context.finding(
                "optimizer",
                built or stepped,
                count=1.0,
                cost_s=None,
                detail=f"the {data.get('optimizer')} optimizer holds {data.get('cpu')} of its "
                f"{data.get('held')} parameters on the CPU, while the model ({data.get('model')}) ran its "
                f"forward pass on XLA with {data.get('model_params')} parameters of its own: it was built "
                f"before the model was moved{where_moved}. Its step()"
                + (f" at {context.where(stepped)}" if stepped else "")
                + " updates the CPU copies, which get no gradient; the model on the device never trains",
                fix=fix + "; or pass the moved model's parameters to a new optimizer",
            )
        )
    return found


def _code(frame: object) -> str:
    from xlapipe.doctor.frames import source

    return source(frame).split("  #")[0]  # type: ignore[arg-type]
