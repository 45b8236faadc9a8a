"""``xlapipe doctor``: run a training script unchanged and say what is slow, where, and which practice fixes it.

Loaded by the command line only, never by ``import xlapipe``. The pieces:
``probe`` (inside the script's process), ``child`` (running it), ``events``,
``timeline``, ``frames``, ``graphs`` (reading what it did), ``checks``
(one module per kind of finding), ``suggest``, ``report``, ``command``.
Programmatic use: ``from xlapipe.doctor.diagnose import diagnose``.
"""
