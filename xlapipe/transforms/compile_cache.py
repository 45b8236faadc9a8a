"""with_compile_cache: torch_xla's persistent compile cache, for TPU runs.

XLA compiles every new graph; the persistent cache stores the compiled
executables on disk so the next run (or the other hosts of a pod, on a shared
path) loads them instead of compiling. It is switched on by
``torch_xla.runtime.initialize_cache(path, readonly)``, which must run before
the runtime compiles anything. Like ``use_spmd``, it cannot be undone: the
cache (and the ``XLA_PERSISTENT_CACHE_*`` environment variables that carry it)
stays for the rest of the process, after the session ends.

On the CPU runtime torch_xla writes the cache but cannot read it back
("Failed to deserialize executable: UNIMPLEMENTED"), so every run compiles
anyway: there this transform warns and does nothing rather than pretend.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

from attrs import field, frozen

from xlapipe import checks, claims, runtime
from xlapipe.claims import Claim
from xlapipe.transform import Transform, practice, register

PATH_VAR = "XLA_PERSISTENT_CACHE_PATH"
READONLY_VAR = "XLA_PERSISTENT_CACHE_READ_ONLY"
UNSUPPORTED = ("CPU",)

_active: tuple[str, bool] | None = None  # what this process's runtime was started with


class CompileCacheWarning(RuntimeWarning):
    """The persistent compile cache cannot work on this runtime and is left off."""


@frozen
class PersistentCompileCache:
    """The effect: ``initialize_cache(path, readonly)`` before the first compile."""

    path: str = field(validator=checks.text("with_compile_cache", "path (a folder)"))
    readonly: bool = field(default=False, validator=checks.flag("with_compile_cache", "readonly"))
    before_runtime: bool = field(default=True, init=False)  # applied with the environment effects, first

    def apply(self) -> Callable[[], None]:
        global _active
        import torch_xla
        import torch_xla.runtime as xr

        kind = runtime.kind()
        if kind in UNSUPPORTED:
            warnings.warn(
                f"with_compile_cache: the {kind} runtime writes torch_xla's persistent compile "
                "cache but cannot read it back ('Failed to deserialize executable: "
                "UNIMPLEMENTED'), so the cache is left off and every run compiles afresh. "
                "It pays off on TPU.",
                CompileCacheWarning,
                stacklevel=2,
            )
            return lambda: None
        path = os.path.abspath(os.path.expanduser(self.path))
        if _active == (path, self.readonly):
            return lambda: None  # already on in this process, with these settings
        if _active is not None or torch_xla._XLAC._xla_computation_cache_is_initialized():
            raise RuntimeError(
                f"with_compile_cache({self.path!r}): this process's runtime has already "
                + (f"started its compile cache at {_active[0]!r}" if _active else "compiled a graph")
                + "; the persistent cache is chosen once, before the first compile. Make the "
                "session with with_compile_cache the first thing that runs on the device, or "
                "run in a fresh process."
            )
        xr.initialize_cache(path, readonly=self.readonly)
        _active = (path, self.readonly)
        # Not undone on exit: torch_xla reads these variables when it first
        # compiles, which may be after this session, and then keeps the cache
        # for the rest of the process.
        return lambda: None

    def describe(self) -> dict:
        return {"effect": "compile_cache", "path": self.path, "readonly": self.readonly}


@register
def with_compile_cache(path: str, readonly: bool = False) -> Transform:
    """Keep compiled XLA executables in ``path`` across runs (TPU; a warning on CPU).

    ``readonly``: read the cache without adding to it (e.g. every host of a pod
    but one, on a shared path).
    """
    spec = PersistentCompileCache(path, readonly)
    return practice("with_compile_cache", spec, needs=("with_device",), effects=(spec,))


claims.declare(
    Claim(
        "with_compile_cache",
        lambda: with_compile_cache("xla-cache"),
        summary="XLA's persistent compile cache (reads back on TPU only)",
        own_process=True,
    )
)
