"""The doctor's harness for scripts built on xlapipe: note the practices a session opens with.

``xlapipe doctor`` sets ``XLAPIPE_HARNESS=xlapipe.doctor.harness:observe`` in the
script's process; :func:`xlapipe.session` calls it with every setup it opens.
It only reads ``setup.applied`` and ``setup.precision`` and returns the setup
unchanged: the steps are counted at the step markers, as for a plain script.
"""

from __future__ import annotations

import os
from typing import Any

from xlapipe.doctor.probe import DIR_ENV, append


def observe(setup: Any) -> Any:
    """Write which practices ``setup`` has on to the doctor's trace; return ``setup``."""
    folder = os.environ.get(DIR_ENV)
    if folder and os.path.isdir(folder):
        applied = [described(t) for t in getattr(setup, "applied", ())]
        precision = getattr(setup, "precision", None)
        append(
            folder,
            "practices",
            applied=applied,
            precision=repr(precision),
            device=getattr(setup, "device", None),
        )
    return setup


def described(t: Any) -> dict[str, Any]:
    """``t.describe()``; a parameter a description cannot hold (a function of the script) is kept
    aside under ``undescribed`` (its repr), the others are kept: none is dropped silently."""
    try:
        return dict(t.describe())
    except (TypeError, ValueError):
        pass
    from xlapipe.transform import _jsonable

    params: dict[str, Any] = {}
    undescribed: dict[str, str] = {}
    for key, value in getattr(t, "params", ()):
        try:
            params[key] = _jsonable(value, key)
        except (TypeError, ValueError):
            undescribed[key] = repr(value)
    return {"name": t.name, "params": params, "undescribed": undescribed, "shown": repr(t)}
