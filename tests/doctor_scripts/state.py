"""Checks what the doctor promises about the script's process: argv, __main__, sys.path, and the restore.

Writes what it saw to the file named by its first argument: at its start, and
again at exit (atexit runs after the doctor's probe has restored everything).
"""

import atexit
import json
import subprocess
import sys

import tiny
import torch
import torch_xla

seen = {"argv": sys.argv, "name": __name__, "path0": sys.path[0], "file": __file__}


def instrumentation_left() -> dict:
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl
    from torch.nn.modules import module
    from torch.optim import optimizer
    from torch.utils.data import dataloader

    patched = {
        "torch_xla.sync": torch_xla.sync,
        "torch_xla.torch_xla.sync": torch_xla.torch_xla.sync,
        "xm.mark_step": xm.mark_step,
        "xm.xla_device": xm.xla_device,
        "torch.set_default_tensor_type": torch.set_default_tensor_type,
        "DataLoader iterator": dataloader._BaseDataLoaderIter.__next__,
        "PerDeviceLoader.next": pl.PerDeviceLoader.next,
        "torch_xla._XLAC._run_cached_graph": torch_xla._XLAC._run_cached_graph,
        "torch.optim.Optimizer.__init__": torch.optim.Optimizer.__init__,
        "torch.nn.Module.to": torch.nn.Module.to,
        "torch_xla.torch_xla.sync (the submodule)": sys.modules["torch_xla.torch_xla"].sync,
        "subprocess.Popen.__init__": subprocess.Popen.__init__,
    }
    return {
        "wrapped": sorted(
            k
            for k, f in patched.items()
            if "doctor" in getattr(getattr(f, "__code__", None), "co_filename", "")
        ),
        "function_modes": torch._C._len_torch_function_stack(),
        "optimizer_hooks": len(optimizer._global_optimizer_pre_hooks),
        "forward_hooks": len(module._global_forward_pre_hooks),
        "import_hooks": [type(f).__name__ for f in sys.meta_path if "doctor" in type(f).__module__],
    }


def at_exit():
    seen["at_exit"] = instrumentation_left()
    with open(sys.argv[1], "w") as f:
        json.dump(seen, f)


atexit.register(at_exit)
seen["during"] = instrumentation_left()
device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for x, y in tiny.loader(n=64):
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
