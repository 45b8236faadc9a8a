"""setup: deprecated environment and APIs in force (the device, runtime and precision are reported, not found)."""

from __future__ import annotations

from xlapipe.doctor.findings import Context, Finding

APIS = {
    "xm.mark_step": ("torch_xla.sync()", None),
    "xm.xla_device": ("torch_xla.device()", None),
    "torch.set_default_tensor_type": (
        "torch.set_default_dtype(torch.float32) (and torch.set_default_device if needed); xlapipe's "
        "set_default_tensor_type() practice sets and restores them",
        {"name": "set_default_tensor_type", "params": {}},
    ),
}
BF16 = {"name": "with_precision", "params": {"name": "bf16", "mode": "autocast"}}
ENV = {
    "XLA_USE_BF16": (
        "computes every float32 tensor in bf16 on the device, weights and optimizer state included",
        "unset it and use bf16 autocast: with torch.autocast('xla', dtype=torch.bfloat16) around the "
        "forward pass (xlapipe: with_precision('bf16'))",
        BF16,
    ),
    "XLA_DOWNCAST_BF16": (
        "stores float32 tensors as bf16 on the device (float64 as float32)",
        "unset it and use bf16 autocast (xlapipe: with_precision('bf16'))",
        BF16,
    ),
    "XLA_USE_FP16": (
        "does nothing in torch_xla 2.9",
        "unset it; for fp16 use torch.autocast('xla', dtype=torch.float16) with torch.amp.GradScaler('xla')",
        None,
    ),
}


def check(context: Context) -> list[Finding]:
    found = []
    seen = set()
    for record in context.timeline.all("deprecated"):
        frames = record.frames()
        if not frames or context.timeline.libraries.kind(frames[0].file) != "user":
            continue  # a library's call, not the script's
        api = str(record.data.get("api"))
        if (api, frames[0]) in seen:
            continue
        seen.add((api, frames[0]))
        instead, practice = APIS.get(api, ("its replacement", None))
        found.append(
            context.finding(
                "setup",
                frames[0],
                count=1.0,
                cost_s=None,
                detail=f"{api}() is deprecated in torch_xla 2.9",
                fix=f"use {instead}",
                practice=practice,
            )
        )
    runtime = context.timeline.first("runtime")
    env = (runtime.data.get("env") or {}) if runtime else {}
    for name, (effect, fix, practice) in ENV.items():
        if env.get(name, "") not in ("", "0"):
            found.append(
                Finding(
                    "setup",
                    "",
                    count=1.0,
                    cost_s=None,
                    detail=f"{name}={env[name]} is in force when the runtime starts (deprecated): it {effect}",
                    fix=fix,
                    practice=practice,
                )
            )
    return found


def setup_info(context: Context) -> dict:
    """What the run trained on: device and runtime, parameters' dtypes, autocast, the practices on."""
    timeline = context.timeline
    runtime = timeline.first("runtime")
    info: dict = {}
    if runtime is not None:
        data = runtime.data
        info["runtime"] = {
            k: data.get(k)
            for k in ("device_type", "devices", "world_size", "default_dtype", "backend", "versions")
        }
        info["runtime"]["env"] = data.get("env") or {}
    info["parameters"] = [
        {"optimizer": r.data.get("optimizer"), "kinds": r.data.get("kinds")} for r in timeline.all("params")
    ]
    states = []
    for r in timeline.all("autocast"):
        state = str(r.data.get("dtype")) if r.data.get("enabled") else "off"
        if state not in states:
            states.append(state)
    info["autocast"] = states
    info["practices"] = context.practices
    return info
