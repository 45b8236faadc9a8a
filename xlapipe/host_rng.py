"""The process-global generators of the host: Python's ``random``, NumPy's global one, torch's CPU one.

As plain data and CPU tensors (a weights-only load reads them back), for
checkpoints and for the loader positions that replay an epoch from them.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Mapping
from typing import Any

import torch


def host_rng_state() -> dict[str, Any]:
    """Python's, NumPy's (when installed) and torch's CPU global generator states."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    with contextlib.suppress(ImportError):
        import numpy as np

        np_state = np.random.get_state(legacy=False)
        state["numpy"] = {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype("int64")),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        }
    return state


def set_host_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what :func:`host_rng_state` took (a generator it did not save is left alone)."""
    random.setstate(tuple(v if not isinstance(v, list) else tuple(v) for v in state["python"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy as np

            s = state["numpy"]
            np.random.set_state(
                {
                    "bit_generator": s["bit_generator"],
                    "state": {"key": s["key"].numpy().astype(np.uint32), "pos": s["pos"]},
                    "has_gauss": s["has_gauss"],
                    "gauss": s["gauss"],
                }
            )
