"""Mutation testing of xlapipe's core: plant one plausible bug at a time, run the tests that should catch it.

    .venv/bin/python tools/mutate.py                    # every mutant (what `make mutate` runs)
    .venv/bin/python tools/mutate.py --list             # the mutants; exit 1 if any no longer applies
    .venv/bin/python tools/mutate.py --only ID,ID --jobs 2 --out results/mutation

Each mutant in :data:`MUTANTS` is one bug a user would feel, written as an exact
snippet of a source file and its replacement, with the test files that should
catch it (a targeted subset: a mutant costs one or two minutes, not the whole
suite). For each mutant the repository's files (what git tracks, plus the
working tree's changes and new files it does not ignore) are copied into a
temporary folder, the snippet is replaced there, and
``python -m pytest -x -q -p no:cacheprovider --hypothesis-seed=0 <tests>`` runs
in that copy with a timeout. The checkout itself is only read, so a run killed
at any moment leaves it as it was. Before the mutants, the unmutated copy runs
the same tests: a failing baseline would make every mutant look killed.

Outcomes: ``killed`` (a test failed; the first one is recorded), ``survived``
(every test passed: the suite does not notice this bug), ``timeout``,
``stale`` (the snippet is not in the file exactly once, the file or a test file
is gone: the list must follow the code) and ``error`` (the mutated file does not
compile, or pytest could not run the tests). Stale and error mutants make the
exit status 1. Results: ``<out>/mutation.md`` and ``<out>/mutation.json``,
rewritten after every mutant.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join("results", "mutation")
PYTEST = ("-x", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0")
OUTCOMES = ("killed", "survived", "timeout", "stale", "error")


class Mutant(NamedTuple):
    id: str
    file: str  # relative to the repository
    original: str  # must occur exactly once in the file
    replacement: str
    bug: str  # what a user would see
    tests: tuple[str, ...]  # test files (or node ids) that should catch it


class Result(NamedTuple):
    id: str
    file: str
    bug: str
    outcome: str
    killed_by: str = ""  # the first failing test, for killed mutants
    detail: str = ""  # why stale / error / timeout, or the tail of pytest's output
    seconds: float = 0.0


# -- the mutants -----------------------------------------------------------------------
# Named ``issue15.N-...``: the bugs issue 15 lists as unnoticed by the suite.

T_VALUES, T_PROPS, T_PRACT = "tests/test_values.py", "tests/test_properties.py", "tests/test_practices.py"
T_ABL, T_CKPT, T_FAULTS = "tests/test_ablation.py", "tests/test_checkpoint.py", "tests/test_faults.py"
T_EQUIV, T_SHAPES, T_LAUNCH = (
    "tests/test_equivalence.py",
    "tests/test_static_shapes.py",
    "tests/test_launch.py",
)
T_BAD, T_SMOKE = "tests/test_bad_inputs.py", "tests/test_smoke.py"
T_GUARD = "tests/test_recompile_guard.py"
T_RETRY, T_RUN, T_FEATURES = (
    "tests/test_ablation_retries.py",
    "tests/test_run.py",
    "tests/test_step_features.py",
)
T_CKPT2, T_PRACTICES = "tests/test_checkpoint_safety.py", "tests/test_step_practices.py"
T_PROTOCOL = "tests/test_protocol.py"
T_CHILD = "tests/test_child_process.py"
T_KERNEL = "tests/test_kernel_fixes.py"
T_ROUNDS, T_STUDY, T_INCR = (
    "tests/test_ablation_rounds.py",
    "tests/test_ablation_study.py",
    "tests/test_ablation_increments.py",
)
T_STATS, T_SIM, T_UNCHANGED = (
    "tests/test_ablation_stats.py",
    "tests/test_ablation_simulated.py",
    "tests/test_ablation_unchanged.py",
)

MUTANTS: tuple[Mutant, ...] = (
    # -- the six bugs issue 15 names ------------------------------------------------------
    Mutant(
        "issue15.1-apply-skips-relation-check",
        "xlapipe/transform.py",
        '        check_order([*cast("tuple[Transform, ...]", setup.applied), self])\n',
        "",
        "a transform applied on its own skips the relation check: wrap_loader_mp()(setup) "
        "without with_device is accepted and yields a CPU setup",
        (T_VALUES, T_PROPS, T_SHAPES),
    ),
    Mutant(
        "issue15.2-without-drops-direct-dependents-only",
        "xlapipe/pipeline.py",
        "            if not more:\n                break\n            drop |= more\n",
        "            drop |= more\n            break\n",
        "Pipeline.without(name, dependents=True) removes only what needs name directly; "
        "a transitive dependent stays and the pipeline is refused",
        (T_VALUES, T_ABL),
    ),
    Mutant(
        "fork-child-collects-inherited-xla-tensors",
        "xlapipe/runtime.py",
        "os.register_at_fork(after_in_child=_freeze_inherited_objects)\n",
        "pass\n",
        "a forked DataLoader worker's garbage collector frees the parent's XLA tensors, taking "
        "torch_xla locks another parent thread may hold: the worker hangs now and then",
        (T_FAULTS,),
    ),
    Mutant(
        "issue15.3-effects-env-vars-last",
        "xlapipe/effects.py",
        "key=lambda e: not e.before_runtime)",
        "key=lambda e: e.before_runtime)",
        "environment variables are set after the default device, which starts the runtime first: "
        "the env bf16 route with set_default_tensor_type(device='xla') fails in a fresh process",
        (T_PRACT, T_FAULTS),
    ),
    Mutant(
        "issue15.4a-default-dtype-restored-to-float32",
        "xlapipe/effects.py",
        "        return lambda: torch.set_default_dtype(old)\n",
        "        return lambda: torch.set_default_dtype(torch.float32)\n",
        "after a session the default dtype is float32, not the float64 the user had set",
        (T_PRACT, T_PROPS),
    ),
    Mutant(
        "issue15.4b-default-device-restored-to-cpu",
        "xlapipe/effects.py",
        "        return lambda: torch.set_default_device(old)\n",
        '        return lambda: torch.set_default_device("cpu")\n',
        "after a session the default device is the CPU, not the one the user had set",
        (T_PRACT, T_PROPS, T_FAULTS),
    ),
    Mutant(
        "issue15.5-optimizer-state-dropped-on-move",
        "xlapipe/placement.py",
        "    new.state = defaultdict(dict)\n    new.load_state_dict(state)\n",
        "    new.state = defaultdict(dict)\n",
        "an optimizer that already stepped loses its state (AdamW moments, step count) when "
        "moved to the device, and training jumps",
        (T_PRACT, T_CKPT, T_EQUIV),
    ),
    Mutant(
        "issue15.6a-failed-runs-never-retried",
        "xlapipe/ablation/runner.py",
        '        settled = {"ok"} if self.runs.retry_failed else {"ok", "error", "timeout"}\n',
        '        settled = {"ok", "error", "timeout"}\n',
        "an ablation run again after a failure skips the failed variants instead of retrying them",
        (T_RETRY,),
    ),
    Mutant(
        "issue15.6b-retry-does-not-replace-failure",
        "xlapipe/ablation/results.py",
        '                if prior is None or prior.get("status") != "ok" or r.get("status") == "ok":\n',
        "                if prior is None:\n",
        "a successful retry of a failed ablation run is ignored: the table keeps the failure",
        (T_RETRY,),
    ),
    # -- transform.py -------------------------------------------------------------------------
    Mutant(
        "transform-reapply-other-params-ignored",
        "xlapipe/transform.py",
        "            if prior == self.params:\n",
        "            if prior is not None:\n",
        "applying with_precision('fp16') to a bf16 setup silently keeps bf16 instead of refusing",
        (T_VALUES, T_PROPS, T_BAD),
    ),
    Mutant(
        "transform-exclusion-reason-dropped",
        "xlapipe/transform.py",
        "                    dict(t.reasons).get(other)\n"
        "                    or dict(transforms[position[other]].reasons).get(t.name)\n",
        "                    None\n                    or None\n",
        "compile_step(backend='openxla') with scan_layers is refused without saying why or that "
        "backend='torch_xla' works",
        (T_BAD,),
    ),
    Mutant(
        "transform-effects-not-recorded",
        "xlapipe/training_setup.py",
        "        return tuple(e for t in self.applied for e in t.effects)\n",
        "        return ()\n",
        "set_default_tensor_type and the env precision route do nothing: the effects of the transforms "
        "applied never reach the setup",
        (T_PRACT,),
    ),
    Mutant(
        "check-order-needs-order-inverted",
        "xlapipe/transform.py",
        "            if position[other] > i:\n",
        "            if position[other] < i:\n",
        "a pipeline with with_device before wrap_loader_mp is refused and one with it after is accepted",
        (T_VALUES, T_PROPS),
    ),
    Mutant(
        "check-order-after-inverted",
        "xlapipe/transform.py",
        "            if other in position and position[other] > i:\n",
        "            if other in position and position[other] < i:\n",
        "static_shapes before wrap_loader_mp (the working order) is refused, and the order that "
        "cannot pad is accepted",
        (T_PROPS, T_SHAPES),
    ),
    Mutant(
        "check-order-excludes-one-way",
        "xlapipe/transform.py",
        "            if other in position:\n                why = (",
        "            if other in position and position[other] < i:\n                why = (",
        "compile_step before shard_data is accepted although they cannot be combined",
        (T_PROPS, T_BAD, "tests/test_compile_step.py"),
    ),
    # -- pipeline.py --------------------------------------------------------------------------
    Mutant(
        "pipeline-add-earliest-position",
        "xlapipe/pipeline.py",
        "        for i in range(len(self.transforms), -1, -1):\n",
        "        for i in range(len(self.transforms) + 1):\n",
        "Pipeline.add puts a transform first instead of at the latest position its relations allow",
        (T_VALUES, T_ABL),
    ),
    Mutant(
        "pipeline-without-unknown-name-accepted",
        "xlapipe/pipeline.py",
        "        self[name]\n        drop = {name}\n",
        "        drop = {name}\n",
        "pipeline.without('a typo') returns the whole pipeline, and an ablation measures the wrong thing",
        (T_VALUES, T_ABL),
    ),
    Mutant(
        "pipeline-equality-as-sets",
        "xlapipe/pipeline.py",
        "        return self.transforms == other.transforms\n",
        "        return frozenset(self.transforms) == frozenset(other.transforms)\n",
        "two pipelines listing the same transforms in another order compare equal although what is "
        "listed first acts first: an ablation measures one listing and reports it for the other",
        (T_VALUES, T_PROPS),
    ),
    # -- effects.py ---------------------------------------------------------------------------
    Mutant(
        "envvar-restore-deletes-users-value",
        "xlapipe/effects.py",
        "        if old is None:\n            os.environ.pop(name, None)\n"
        "        else:\n            os.environ[name] = old\n",
        "        os.environ.pop(name, None)\n",
        "an environment variable the user had set is deleted after the session instead of restored",
        ("tests/test_practices.py::test_an_environment_variable_the_user_had_is_restored_not_deleted",),
    ),
    Mutant(
        "envvar-startup-variable-not-refused",
        "xlapipe/effects.py",
        "        if self.before_runtime and in_force != self.value and runtime.started():\n",
        "        if not self.before_runtime and in_force != self.value and runtime.started():\n",
        "XLA_USE_BF16 set after the runtime started is silently ignored: the run is fp32, "
        "not the bf16 asked for",
        (T_PRACT, T_BAD),
    ),
    Mutant(
        "effects-not-restored-on-error",
        "xlapipe/effects.py",
        "        for also in _exit(mine):  # the body's error is the one to see\n"
        '            note(error, f"while restoring process-wide settings after it: '
        '{type(also).__name__}: {also}")\n'
        "        raise\n",
        "        raise\n",
        "when the training loop raises, the default dtype, device and environment stay changed",
        (T_PRACT, T_FAULTS),
    ),
    # -- placement.py -------------------------------------------------------------------------
    Mutant(
        "move-unties-shared-weights",
        "xlapipe/placement.py",
        "            if id(p) not in mapping:\n                mapping[id(p)] = nn.Parameter(convert(p), "
        "requires_grad=p.requires_grad)\n            m._parameters[name] = cast(nn.Parameter, mapping[id(p)])"
        "  # a parameter's copy is one\n",
        "            m._parameters[name] = mapping[id(p)] = nn.Parameter(convert(p), "
        "requires_grad=p.requires_grad)\n",
        "tied weights (embedding and output head) become two tensors on the device and train apart",
        (T_PRACT,),
    ),
    Mutant(
        "move-casts-integer-buffers",
        "xlapipe/placement.py",
        "        cast = dtype if (dtype is not None and t.is_floating_point()) else t.dtype\n",
        "        cast = dtype if dtype is not None else t.dtype\n",
        "downcast to bf16 also converts integer buffers (position ids, BatchNorm's counter)",
        ("tests/test_practices.py::test_downcast_keeps_integer_buffers_and_frozen_parameters_stay_frozen",),
    ),
    Mutant(
        "move-unfreezes-parameters",
        "xlapipe/placement.py",
        "nn.Parameter(convert(p), requires_grad=p.requires_grad)",
        "nn.Parameter(convert(p))",
        "frozen parameters (requires_grad=False) are trained after the move",
        ("tests/test_practices.py::test_downcast_keeps_integer_buffers_and_frozen_parameters_stay_frozen",),
    ),
    Mutant(
        "move-shares-storage-on-cpu",
        "xlapipe/placement.py",
        "device=device or t.device, dtype=cast, copy=True)",
        "device=device or t.device, dtype=cast, copy=False)",
        "on the CPU, training changes the user's own model weights (no copy is made)",
        ("tests/test_practices.py::test_training_on_the_cpu_never_changes_the_users_model",),
    ),
    # -- precision.py -------------------------------------------------------------------------
    Mutant(
        "precision-scaler-for-bf16-not-fp16",
        "xlapipe/precision.py",
        '        return self.name == "fp16"\n',
        "        return self.dtype == torch.bfloat16\n",
        "fp16 trains without a gradient scaler (its small gradients underflow), bf16 gets one it does not need",
        (T_PRACT,),
    ),
    Mutant(
        "precision-autocast-converts-weights",
        "xlapipe/precision.py",
        '        return self.dtype if self.mode == "downcast" and self.name != "fp32" else None\n',
        '        return self.dtype if self.mode != "env" and self.name != "fp32" else None\n',
        "bf16 autocast also converts the weights to bf16: the fp32 master weights are lost",
        (T_PRACT,),
    ),
    Mutant(
        "precision-autocast-dtype-dropped",
        "xlapipe/precision.py",
        "        return torch.autocast(device.type, dtype=self.dtype)\n",
        "        return torch.autocast(device.type)\n",
        "fp16 autocast on XLA computes in bf16 (the device's default autocast type)",
        ("tests/test_practices.py::test_fp16_autocast_computes_in_fp16_on_the_device",),
    ),
    # -- session.py ---------------------------------------------------------------------------
    Mutant(
        "session-loaders-not-closed",
        "xlapipe/run.py",
        "        for loader in [*self.loaders.values(), *self.positions.values()]:\n",
        "        for loader in [*self.positions.values()]:\n",
        "a device loader iterator the user holds (it = iter(loader); next(it) per step) keeps its "
        "threads prefetching after the session ends",
        ("tests/test_practices.py::test_a_device_loader_iterator_held_past_the_session_stops_with_it",),
    ),
    Mutant(
        "session-realize-before-effects",
        "xlapipe/session.py",
        "    with effects.applied(setup.effects):\n        run = realize(setup)\n",
        "    run = realize(setup)\n    with effects.applied(setup.effects):\n",
        "the model is moved before the effects apply: the env precision route is refused in a "
        "fresh process and the default device does not hold while the model is built",
        (T_PRACT, T_LAUNCH),
    ),
    Mutant(
        "session-loader-syncs-forgotten",
        "xlapipe/transforms/loader_mp.py",
        "    marks_step = True\n",
        "    marks_step = False\n",
        "with wrap_loader_mp every step issues two step markers (the loader's and the step's)",
        (T_PRACT,),
    ),
    Mutant(
        "session-optimizer-not-rebound",
        "xlapipe/session.py",
        "    optimizer = placement.build_optimizer(setup.optimizer, model, mapping)\n",
        "    optimizer = setup.optimizer\n",
        "the user's optimizer is used as it is: it steps the CPU parameters, and the model on the "
        "device never trains",
        (T_PRACT, T_EQUIV),
    ),
    # -- step.py ------------------------------------------------------------------------------
    Mutant(
        "step-gradients-accumulate",
        "xlapipe/step.py",
        "                optimizer.zero_grad(set_to_none=True)\n                if self._scheduler_steps:\n",
        "                if self._scheduler_steps:\n",
        "gradients are never cleared: each step adds the previous steps' gradients",
        (T_EQUIV, T_SMOKE),
    ),
    Mutant(
        "step-scaler-never-updated",
        "xlapipe/step.py",
        "            scaler.step(optimizer)\n            scaler.update()\n",
        "            scaler.step(optimizer)\n",
        "fp16: after an overflow the loss scale never backs off, so every later step is skipped",
        (T_PRACT,),
    ),
    Mutant(
        "step-double-step-marker",
        "xlapipe/step.py",
        "        if self.on_xla and not self.marks_elsewhere:\n",
        "        if self.on_xla:\n",
        "with wrap_loader_mp each step is cut by two step markers (an extra graph execution)",
        (T_PRACT,),
    ),
    # -- checkpoint.py ------------------------------------------------------------------------
    Mutant(
        "checkpoint-written-in-place",
        "xlapipe/checkpoint_file.py",
        "    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)\n",
        "    tmp = path\n    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)\n",
        "checkpoint writes are not atomic: a process killed while saving leaves a truncated checkpoint",
        (T_CKPT,),
    ),
    Mutant(
        "checkpoint-rng-not-restored",
        "xlapipe/checkpoint.py",
        '    set_rng_state(state["rng"], run.device)\n',
        "",
        "a resumed run draws other random numbers (dropout, shuffling) than the uninterrupted one",
        (T_CKPT,),
    ),
    Mutant(
        "checkpoint-optimizer-not-restored",
        "xlapipe/checkpoint.py",
        '        run.optimizer.load_state_dict(state["optimizer"])\n',
        "        pass\n",
        "a resumed run starts with fresh optimizer state (AdamW moments lost)",
        (T_CKPT,),
    ),
    Mutant(
        "checkpoint-save-moves-xla-seed",
        "xlapipe/checkpoint.py",
        "    xm.set_rng_state(((marked - _MARK_STEP_ADD) * _MARK_STEP_MUL_INVERSE) % 2**64, str(device))\n",
        "",
        "saving a checkpoint moves the device's random stream on: what the run draws on the device "
        "between steps differs from a run that does not save (each step's dropout is seeded per step)",
        (
            "tests/test_checkpoint.py::test_a_save_leaves_the_devices_draws_between_steps_as_a_run_that_does_not_save",
            T_CKPT,
        ),
    ),
    Mutant(
        "checkpoint-scaler-not-saved",
        "xlapipe/checkpoint.py",
        '        "scaler": run.scaler.state_dict() if run.scaler is not None else None,\n',
        '        "scaler": None,\n',
        "an fp16 run's checkpoint lacks the loss scale: restoring it is refused",
        ("tests/test_checkpoint.py::test_an_fp16_runs_checkpoint_holds_its_loss_scale",),
    ),
    # -- training_setup.py --------------------------------------------------------------------
    Mutant(
        "setup-loaders-alias-users-dict",
        "xlapipe/training_setup.py",
        "    return MappingProxyType(dict(value))\n",
        "    return MappingProxyType(value)\n",
        "a setup's loaders change when the user later edits the dict they passed in",
        ("tests/test_values.py::test_a_setup_does_not_follow_later_edits_of_the_users_loader_dict",),
    ),
    Mutant(
        "setup-record-missing-is-empty",
        "xlapipe/training_setup.py",
        "        return next((t.params for t in self.applied if t.name == name), None)\n",
        "        return next((t.params for t in self.applied if t.name == name), ())\n",
        "record() of a transform never applied is () instead of None: with_device() and the other "
        "transforms without parameters are taken as already applied and do nothing",
        (T_VALUES, T_PROPS),
    ),
    # -- transforms/ --------------------------------------------------------------------------
    Mutant(
        "loader-mp-wraps-twice",
        "xlapipe/transforms/loader_mp.py",
        "        name: loader if isinstance(loader, MpDeviceLoader) else DeviceLoader(loader, **options)\n",
        "        name: DeviceLoader(loader, **options)\n",
        "a loader that is already an MpDeviceLoader is wrapped again",
        (T_PRACT,),
    ),
    Mutant(
        "loader-mp-options-dropped",
        "xlapipe/transforms/loader_mp.py",
        "else DeviceLoader(loader, **options)\n",
        "else DeviceLoader(loader)\n",
        "wrap_loader_mp's prefetch sizes and transfer threads are ignored",
        (T_PRACT,),
    ),
    Mutant(
        "loader-mp-break-leaks-threads",
        "xlapipe/device_loader.py",
        "        finally:\n            parallel.close()\n",
        "        finally:\n            pass\n",
        "leaving a loop over the device loader early leaves its worker threads running",
        (T_PRACT, T_FAULTS),
    ),
    Mutant(
        "loader-mp-dataset-error-swallowed",
        "xlapipe/device_loader.py",
        "            self.owner._exception_queue.put(error)\n",
        "            pass\n",
        "an error in the dataset silently ends the epoch early instead of reaching the user",
        (T_FAULTS,),
    ),
    Mutant(
        "static-shapes-bucket-off-by-one",
        "xlapipe/transforms/static_shapes.py",
        "            if length <= size:\n",
        "            if length < size:\n",
        "a batch exactly as long as a bucket is padded to the next bucket, or refused at the largest",
        (T_SHAPES,),
    ),
    Mutant(
        "static-shapes-sampler-dropped",
        "xlapipe/loader_position.py",
        "            batch_size=loader.batch_size,\n            sampler=loader.sampler,\n",
        "            batch_size=loader.batch_size,\n",
        "a shuffling or distributed sampler is lost when a loader is copied (static_shapes' rebuild, "
        "a run's own loader): every epoch and every replica sees the same order",
        (T_SHAPES,),
    ),
    Mutant(
        "static-shapes-users-drop-last-ignored",
        "xlapipe/transforms/static_shapes.py",
        "drop_last=loader.drop_last or drop_last)",
        "drop_last=drop_last)",
        "a loader built with drop_last=True hands out its small last batch again (one more compilation)",
        (T_SHAPES,),
    ),
    Mutant(
        "static-shapes-pad-value-ignored",
        "xlapipe/transforms/static_shapes.py",
        "    out = t.new_full((t.shape[0], size, *t.shape[2:]), value)\n",
        "    out = t.new_zeros((t.shape[0], size, *t.shape[2:]))\n",
        "padding ignores pad_values: input_ids are padded with 0, not the tokenizer's pad id "
        "(1 for RoBERTa), and the padding is read as tokens",
        (T_SHAPES,),
    ),
    Mutant(
        "default-dtype-device-dropped",
        "xlapipe/transforms/default_dtype.py",
        "    effects = [DefaultDtype(dtype)] + ([DefaultDevice(device)] if device else [])\n",
        "    effects = [DefaultDtype(dtype)]\n",
        "set_default_tensor_type(device='xla') leaves new tensors on the CPU",
        (T_PRACT, T_FAULTS),
    ),
    Mutant(
        "default-dtype-xla-needs-nothing",
        "xlapipe/transforms/default_dtype.py",
        '        needs=("with_device",) if device == "xla" else (),\n',
        "        needs=(),\n",
        "set_default_tensor_type(device='xla') without with_device is accepted: the model stays on "
        "the CPU while new tensors go to the device",
        (T_PRACT, T_PROPS),
    ),
    Mutant(
        "model-mp-rewraps-a-wrapper",
        "xlapipe/transforms/model_mp.py",
        "    if isinstance(setup.model, MpModelWrapper):\n        return setup  # never wrap twice\n",
        "",
        "a model the user already wrapped in MpModelWrapper (as torch_xla's examples do) makes "
        "wrap_model_mp fail",
        ("tests/test_practices.py::test_wrap_model_mp_keeps_a_model_the_user_already_wrapped",),
    ),
    # -- ablation/ ----------------------------------------------------------------------------
    Mutant(
        "variants-leave-one-out-keeps-dependents",
        "xlapipe/ablation/variants.py",
        "        smaller = full.without(name, dependents=True)\n",
        "        smaller = full.without(name)\n",
        "leave-one-out of a transform others need fails instead of dropping its dependents",
        (T_ABL,),
    ),
    Mutant(
        "variants-equal-pipelines-measured-twice",
        "xlapipe/ablation/variants.py",
        "        if v.pipeline == variant.pipeline:\n",
        "        if v.name == variant.name:\n",
        "two variants with the same pipeline are both run (twice the time, a misleading table)",
        (T_ABL,),
    ),
    Mutant(
        "variants-add-one-not-cumulative",
        "xlapipe/ablation/variants.py",
        "        if cumulative:\n            current = pipeline\n",
        "",
        "add-one ablation ignores cumulative=True: each step adds one transform to the bare baseline",
        (T_ABL,),
    ),
    Mutant(
        "results-speedup-inverted",
        "xlapipe/ablation/analysis.py",
        "        speedup = mine.median / ref.median if higher else ref.median / mine.median\n",
        "        speedup = ref.median / mine.median if higher else mine.median / ref.median\n",
        "the ablation table reports a variant twice as fast as 0.5x",
        (T_ABL,),
    ),
    Mutant(
        "results-truncated-line-not-fenced",
        "xlapipe/ablation/results.py",
        '                if r.read(1) != b"\\n":',
        '                if r.read(1) == b"\\n":',
        "after a killed writer, the next record is glued to the half line and lost",
        (T_ABL,),
    ),
    Mutant(
        "results-mixes-configs",
        "xlapipe/ablation/results.py",
        '        mine = [r for r in records if r.get("config") == last.get("config")]\n',
        "        mine = records\n",
        "a report of the results folder mixes in runs made with other arguments",
        (T_ABL,),
    ),
    Mutant(
        "stats-interval-normal-not-t",
        "xlapipe/ablation/stats.py",
        "    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)\n",
        "    half = 1.96 * sd / math.sqrt(n)\n",
        "the paired interval takes the normal quantile at every level and every count of rounds: "
        "three rounds claim far more than they know",
        (T_SIM, T_STATS),
    ),
    Mutant(
        "judging-looks-not-split",
        "xlapipe/ablation/options.py",
        "        return 1.0 - (1.0 - self.confidence) / max(self.looks, 1)\n",
        "        return self.confidence\n",
        "each round's look at a variant is at the full confidence: deciding after every round calls "
        "a variant with no effect different more often than the level allows",
        (T_SIM, T_STATS),
    ),
    Mutant(
        "recommend-fastest-median",
        "xlapipe/ablation/recommend.py",
        "    chosen = min(tied, key=lambda s: len(s.variant.pipeline))  # min keeps the earliest of equals\n",
        "    chosen = fastest\n",
        "the recommendation is the fastest median among variants the runs cannot tell apart: a rerun "
        "recommends another pipeline",
        (T_SIM,),
    ),
    # -- the increments' pooled fit and their rounds (issue 28) ---------------------------------
    Mutant(
        "rounds-count-baseline-pairs",
        "xlapipe/ablation/runner.py",
        "    return sum(s.deciding.n for s in analysis.summaries if s.variant.name in names and s.deciding is not None)\n",
        "    return sum(s.interval.n for s in analysis.summaries if s.variant.name in names and s.interval is not None)\n",
        "the rounds for undecided increments stop once the baseline is decided and no longer run, "
        "saying the rows compared failed",
        (T_ROUNDS,),
    ),
    Mutant(
        "blocked-fit-no-round-term",
        "xlapipe/ablation/stats.py",
        "            if blocks.index(block):\n",
        "            if False:\n",
        "the increments' fit leaves out the rounds: a slow round no longer cancels, and the spread "
        "between rounds widens every interval",
        (T_STATS,),
    ),
    Mutant(
        "blocked-fit-no-spread-test",
        "xlapipe/ablation/stats.py",
        "        if rest.cov is not None and _spreads_more(own.sd, own.n - 1, math.sqrt(2 * rest.sigma2), rest.df):\n",
        "        if False:\n",
        "a pair whose runs spread far more than the other rows' gets the pooled interval: too narrow",
        (T_STATS, T_STUDY),
    ),
    Mutant(
        "blocked-fit-f-test-wrong-tail",
        "xlapipe/ablation/stats.py",
        "    return tail < SPREAD_TEST\n",
        "    return tail > 1 - SPREAD_TEST\n",
        "the spread test hands their own interval to the pairs that spread less than the others",
        (T_STATS, T_STUDY),
    ),
    Mutant(
        "blocked-fit-rates-upside-down",
        "xlapipe/ablation/stats.py",
        "        mean *= -1.0 if higher_is_better else 1.0\n",
        "",
        "with --figure steps_per_s the increments read a faster practice as slower",
        (T_STATS,),
    ),
    Mutant(
        "increments-each-pair-at-one-level",
        "xlapipe/ablation/analysis.py",
        "    intervals = {name: None if iv is None else iv.at(lv) for (name, _), iv, lv in zip(pairs, first, levels)}\n",
        "    intervals = dict(zip((name for name, _ in pairs), first))\n",
        "the increments are shown at one comparison's level, not Holm's: a table of five rows calls "
        "a practice with no effect faster more often than the confidence says",
        (T_STUDY, T_INCR),
    ),
    Mutant(
        "ablate-figure-unchecked",
        "xlapipe/ablation/runner.py",
        "    check_figure(judging.figure, {*FIGURES, *store.reported_figures(recorded, judging)})\n",
        "",
        "a typo in --figure runs the whole ablation and decides nothing",
        (T_ABL,),
    ),
    # -- the one runner (xlapipe/child_process.py) ----------------------------------------------
    Mutant(
        "runner-guard-not-a-subreaper",
        "xlapipe/child_process.py",
        "    _prctl(_PR_SET_CHILD_SUBREAPER, 1)\n",
        "",
        "a process the run started outlives it once its own parent has exited (a daemonised helper)",
        (T_CHILD,),
    ),
    Mutant(
        "runner-guard-ignores-its-starters-death",
        "xlapipe/child_process.py",
        "    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)\n",
        "",
        "a runner killed with SIGKILL leaves its run training on the TPU, holding it",
        (T_CHILD,),
    ),
    Mutant(
        "runner-tmpdir-kept",
        "xlapipe/child_process.py",
        "        shutil.rmtree(tmp, ignore_errors=True)\n",
        "        pass\n",
        "every run leaves its temporary files behind: a long ablation fills the disk",
        (T_CHILD,),
    ),
    Mutant(
        "runner-orphaned-folders-kept",
        "xlapipe/child_process.py",
        "                shutil.rmtree(folder, ignore_errors=True)\n",
        "                pass\n",
        "a doctor killed with SIGKILL leaves its run's folder (traces, graphs, temporary files) on disk",
        (T_CHILD,),
    ),
    Mutant(
        "runner-reads-a-stale-result",
        "xlapipe/child_process.py",
        "    if result is not None:\n        Path(result).unlink(missing_ok=True)\n",
        "",
        "a run that writes no result is given the result an earlier run left at the same path",
        (T_CHILD,),
    ),
    Mutant(
        "harness-variant-not-substituted",
        "xlapipe/ablation/harness.py",
        '    variant = Pipeline(*_transforms(setup)) if job["pipeline"] is None else '
        'rebuild_in_script(job["pipeline"])\n',
        "    variant = Pipeline(*_transforms(setup))\n",
        "a script run unchanged trains its own pipeline in every run: every variant measures the same thing",
        (T_UNCHANGED,),
    ),
    Mutant(
        "harness-user-changes-dropped",
        "xlapipe/ablation/harness.py",
        "    return base.evolve(**changes) if changes else base\n",
        "    return base\n",
        "a scheduler the script sets after applying its pipeline is lost in every variant: "
        "they train at another learning rate",
        (T_UNCHANGED,),
    ),
    # -- the hook protocol, the step and the run -------------------------------------------------
    Mutant(
        "accumulate-gradients-not-averaged",
        "xlapipe/step.py",
        "                    p.grad.mul_(scale)\n",
        "                    pass\n",
        "accumulate_grad(k) sums the micro-batches' gradients instead of averaging them: a k times larger step",
        (T_FEATURES,),
    ),
    Mutant(
        "accumulate-last-window-dropped",
        "xlapipe/step.py",
        "        if self.window:\n            self.update()\n",
        "        if self.window:\n            self.window = 0\n"
        "            self.run.optimizer.zero_grad(set_to_none=True)\n",
        "an epoch that ends inside an accumulation window throws its last micro-batches away",
        (T_FEATURES,),
    ),
    Mutant(
        "scheduler-steps-every-micro-batch",
        "xlapipe/step.py",
        "        self.steps += 1\n        self.updated = updated\n",
        "        self.steps += 1\n        self.updated = updated\n"
        "        if self._scheduler_steps and not updated:\n            self.run.scheduler.step()\n",
        "with accumulation the learning-rate schedule advances on every micro-batch, not every update",
        (T_FEATURES,),
    ),
    Mutant(
        "clip-norm-not-kept",
        "xlapipe/transforms/clip.py",
        '        self.run.values["grad_norm"] = norm.detach()\n',
        "",
        "clip_grad_norm's norm never reaches run.values or log_every: the user cannot log it",
        (T_FEATURES,),
    ),
    Mutant(
        "log-every-reads-before-the-marker",
        "xlapipe/transforms/log_metrics.py",
        "        if self.on_xla:\n            import torch_xla.core.xla_model as xm\n\n"
        "            xm.add_step_closure(self._emit, args=(record, values))\n        else:\n",
        "        if False:\n            pass\n        else:\n",
        "log_every reads the loss on the host before the step marker: one extra XLA execution per log",
        (T_FEATURES,),
    ),
    Mutant(
        "run-evaluating-leaves-eval-mode",
        "xlapipe/run.py",
        "            self.model.train(was_training)\n",
        "            pass\n",
        "after run.evaluating() the model stays in eval mode: dropout is off for the rest of training",
        (T_RUN,),
    ),
    Mutant(
        "run-weights-back-in-the-runs-dtype",
        "xlapipe/run.py",
        "    dtypes = {k: v.dtype for k, v in user.state_dict(keep_vars=True).items()}\n",
        "    dtypes: dict[str, torch.dtype] = {}\n",
        "run.state_dict() after a bf16 downcast run hands back bf16 weights to an fp32 model",
        (T_RUN,),
    ),
    Mutant(
        "run-batches-eval-never-marked",
        "xlapipe/run.py",
        "                if own_markers and marked_at == stepper.markers:\n"
        "                    stepper.mark()  # the previous batch's work (evaluation) is still pending\n",
        "                pass\n",
        "an evaluation loop over run.batches() traces every batch into one growing graph",
        (T_RUN,),
    ),
    Mutant(
        "session-failed-run-kept",
        "xlapipe/session.py",
        "            run.release()\n",
        "",
        "a session that failed keeps its device tensors alive: the next step marker trips on them",
        (T_RUN,),
    ),
    Mutant(
        "session-startup-precision-not-checked",
        "xlapipe/session.py",
        "        runtime.check_startup_env({e.name: e.value for e in setup.effects if isinstance(e, EnvVar)})\n",
        "        pass\n",
        "an fp32 session after an XLA_USE_BF16 one in the same process silently computes in bf16",
        (T_RUN,),
    ),
    Mutant(
        "effects-out-of-order-restored-at-once",
        "xlapipe/effects.py",
        "        while _ACTIVE and _ACTIVE[-1].exited:\n            ready.append(_ACTIVE.pop())\n",
        "        _ACTIVE.remove(mine)\n        ready.append(mine)\n",
        "two sessions that end out of order leave the default dtype of the first one behind",
        (T_RUN,),
    ),
    Mutant(
        "loaders-shared-between-runs",
        "xlapipe/session.py",
        "        out[name] = copy_device_loader(loader, tracked) if isinstance(loader, MpDeviceLoader) else tracked\n",
        "        out[name] = loader if isinstance(loader, MpDeviceLoader) else tracked\n",
        "every run of a setup shares its device loaders: one session's exit ends another's epoch",
        (T_RUN,),
    ),
    Mutant(
        "device-loader-drops-batch-types",
        "xlapipe/device_loader.py",
        "        if isinstance(self._input_sharding, dict):\n"
        "            sharded: list = super().send_cpu_data_to_device(batches, device)\n",
        "        if True:\n            sharded: list = super().send_cpu_data_to_device(batches, device)\n",
        "under wrap_loader_mp named-tuple batches arrive as lists and dataclass batches stay on the CPU",
        (T_RUN,),
    ),
    Mutant(
        "host-reads-execution-left-forbidden",
        "xlapipe/transforms/host_reads.py",
        "            finally:\n                xlac._set_allow_execution(allowed)\n",
        "            finally:\n                pass\n",
        "after a step under no_host_reads, reading the returned loss fails: execution stays forbidden",
        (T_PRACTICES,),
    ),
    Mutant(
        "guard-cause-not-named",
        "xlapipe/transforms/recompile_guard.py",
        '            "difference": state.difference(),\n',
        '            "difference": None,\n',
        "recompile_guard says a graph compiled but not which op and shape changed",
        (T_PRACTICES,),
    ),
    # -- the protocol's second edition: one owner for the step, practice state and loader positions --
    Mutant(
        "wrapper-call-check-disabled",
        "xlapipe/step.py",
        "        if not seen.called:\n",
        "        if False:\n",
        "a practice whose wrap_* hook forgets to call what it wraps is not refused: the update (and "
        "the practices inside it) is silently skipped and the run trains nothing",
        (T_PROTOCOL + "::test_a_wrapper_that_drops_what_it_wraps_is_refused_at_its_first_call",),
    ),
    Mutant(
        "update-wrappers-bypassed",
        "xlapipe/step.py",
        '            self._apply = fold(self.hooks, "wrap_apply", self._apply_window)\n',
        "            self._apply = self._apply_window\n",
        "a practice's wrap_apply is never called: whatever it does around the update (a compiled "
        "update, a practice of the user's) is skipped",
        (T_PROTOCOL + "::test_a_practice_wrapping_the_update_is_called_next_to_compile_step",),
    ),
    Mutant(
        "failed-step-counted-in-window",
        "xlapipe/step.py",
        "                self._restore_window(window)\n",
        "                self._restore_window(window)\n                self.window += 1\n",
        "a step that fails (the loss function raised on a bad batch) still counts in the accumulation "
        "window: the next update comes a micro-batch early, averaged over the wrong count",
        ("tests/test_run.py::test_a_failed_step_leaves_the_accumulation_window_as_it_was",),
    ),
    Mutant(
        "accumulation-window-not-restored",
        "xlapipe/step.py",
        '        self.epoch, self.window = int(state.get("epoch", 0)), int(state["window"])\n',
        '        self.epoch, self.window = int(state.get("epoch", 0)), 0\n',
        "a run resumed from a checkpoint saved between micro-batches forgets its open accumulation "
        "window: the saved gradients are averaged into the next window as if they were not there",
        (
            T_PROTOCOL + "::test_a_save_inside_an_accumulation_window_resumes_exactly",
            T_PROTOCOL + "::test_restoring_inside_a_window_replaces_the_pending_gradients",
        ),
    ),
    Mutant(
        "checkpoint-practice-state-not-restored",
        "xlapipe/checkpoint.py",
        '    run.load_practice_states(state["practices"])\n',
        "",
        "a resumed run's practices start afresh: ema's average restarts from the restored weights "
        "instead of continuing the saved one",
        (T_PROTOCOL + "::test_a_save_inside_an_accumulation_window_resumes_exactly",),
    ),
    Mutant(
        "loader-position-not-restored",
        "xlapipe/loader_position.py",
        "        self._resume = dict(saved) if inside else None\n",
        "        self._resume = None\n",
        "a run resumed from a checkpoint saved inside an epoch starts that epoch over: it trains "
        "again on the batches the saving run had already trained on",
        ("tests/test_checkpoint.py::test_a_mid_epoch_resume_of_a_shuffled_loader_is_exact",),
    ),
    Mutant(
        "user-optimizer-change-not-copied",
        "xlapipe/user_optimizer.py",
        "                _put(groups[i], key, new[key])\n",
        "                pass\n",
        "a learning rate the script sets on its own optimizer (nanoGPT's get_lr) never reaches the "
        "run: it trains at the first rate",
        ("tests/test_user_optimizer.py::test_a_rate_set_on_the_users_own_optimizer_takes_effect",),
    ),
    Mutant(
        "ema-decay-inverted",
        "xlapipe/transforms/ema.py",
        "                    average.mul_(self.decay).add_(weight.detach(), alpha=1.0 - self.decay)\n",
        "                    average.mul_(1.0 - self.decay).add_(weight.detach(), alpha=self.decay)\n",
        "ema(0.999) keeps 0.1% of its average at each update: the averaged weights are all but the last ones",
        (
            "tests/test_protocol.py::test_ema_moves_its_average_a_tenth_of_the_way_to_the_weights_at_decay_0_9",
        ),
    ),
    Mutant(
        "ema-does-not-follow-replaced-buffers",
        "xlapipe/transforms/ema.py",
        "            self.live[key] = buffer\n",
        "            pass\n",
        "a model that replaces a buffer each batch (an LSTM's carried state) has it averaged from its first "
        "tensor, and averaged_weights(run) fails with a KeyError",
        ("tests/test_claims.py::test_claim_holds[ema-lstm_state-trains_as_eager]",),
    ),
    Mutant(
        "batch-norm-kernel-not-installed",
        "xlapipe/transforms/device.py",
        "    CorrectBatchNorm(),\n",
        "",
        "with_device leaves torch_xla 2.9's batch norm kernel: running_var takes the biased batch variance",
        (T_KERNEL,),
    ),
    Mutant(
        "batch-norm-compiled-op-not-corrected",
        "xlapipe/kernel_fixes.py",
        'BATCH_NORM_OPS = ("native_batch_norm", "_native_batch_norm_legit")\n',
        'BATCH_NORM_OPS = ("native_batch_norm",)\n',
        "a step compiled by dynamo (compile_step()) reaches _native_batch_norm_legit, left uncorrected: "
        "its running_var takes the biased batch variance",
        (T_KERNEL,),
    ),
    Mutant(
        "layer-norm-through-decomposition",
        "xlapipe/kernel_fixes.py",
        "    if training and running_mean is None and running_var is None:\n",
        "    if False:\n",
        "layer norm (batch norm without running statistics) also takes the decomposition: every "
        "transformer's graph changes under with_device, though torch_xla's kernel is right there",
        (T_KERNEL,),
    ),
    Mutant(
        "batch-norm-saved-stats-in-fp32",
        "xlapipe/kernel_fixes.py",
        "    return out, save_mean.to(input.dtype), save_invstd.to(input.dtype)\n",
        "    return out, save_mean, save_invstd\n",
        "the corrected kernel saves fp32 statistics for a bf16 input: torch_xla's backward kernel "
        "refuses the mixed precisions",
        (T_KERNEL,),
    ),
    Mutant(
        "openxla-backend-settings-not-put-back",
        "xlapipe/transforms/compile_step.py",
        "        with _settings_kept(inner):\n",
        "        with contextlib.nullcontext():\n",
        "torch 2.9's openxla backend wraps its backward compiler once more per compiled graph: about "
        "150 graphs into a process every backward fails with RecursionError",
        ("tests/test_compile_step.py::test_the_openxla_backend_keeps_its_settings_across_sessions",),
    ),
    Mutant(
        "fleet-import-found-from-the-workers-folder",
        "xlapipe/ablation/on_node.py",
        "    return top in sys.builtin_module_names or PathFinder.find_spec(top, [cwd, *sys.path]) is not None\n",
        "    return top in sys.builtin_module_names or PathFinder.find_spec(top, [os.getcwd(), *sys.path]) is not None\n",
        "a machine that lacks an --import module in the run's folder passes the check, and every run "
        "on it fails with 'cannot import'",
        ("tests/test_fleet.py::test_import_modules_reach_the_runs_on_the_machines_and_are_checked_on_each",),
    ),
    Mutant(
        "to-decide-counts-the-rounds-already-run",
        "xlapipe/ablation/runner.py",
        '            else f", about {duration((rounds - done) * per_round / self.engine.slots)} more at this run\'s pace"\n',
        '            else f", about {duration(rounds * per_round / self.engine.slots)} more at this run\'s pace"\n',
        "an ablation stopped undecided says the rest would take longer than it would, the rounds already "
        "run counted again",
        ("tests/test_ablation_rounds.py",),
    ),
    Mutant(
        "fleet-first-wave-not-filled",
        "xlapipe/ablation/runner.py",
        "    if not judging.until_resolved or machines <= 1:\n",
        "    if True:\n",
        "3 rounds asked on 8 machines run on 3 while 5 sit idle, and the rounds added for the undecided "
        "rows take a second wave",
        (T_ROUNDS,),
    ),
    Mutant(
        "doctor-pad-length-from-the-newest-graphs",
        "xlapipe/doctor/checks/recompiles.py",
        "            longest = max(max(lengths.values()), longest_seen(context, changes, set(lengths)))\n",
        "            longest = max(lengths.values())\n",
        "the doctor's suggested padding length comes from the graphs compared after warm-up only: "
        "shorter than the longest batch seen, so the suggestion refuses the data's longest batches",
        ("tests/test_doctor.py::test_the_padding_length_is_the_longest_batch_of_the_run_not_the_newest",),
    ),
    Mutant(
        "elu-gradient-from-the-output-formula",
        "xlapipe/kernel_fixes.py",
        "    if is_result:\n",
        "    if True:\n",
        "ELU, CELU and SELU on the device train with 1 + x for the gradient below 0, as torch_xla 2.9 "
        "does, without a word",
        ("tests/test_kernel_fixes.py",),
    ),
    Mutant(
        "norm-kernel-not-installed",
        "xlapipe/transforms/device.py",
        "    CorrectNorm(),\n",
        "",
        "x.norm(p=inf) on the device is torch_xla 2.9's: 1.0 for a largest magnitude of 2.18",
        ("tests/test_kernel_fixes.py",),
    ),
    Mutant(
        "amax-kernel-not-installed",
        "xlapipe/transforms/device.py",
        "    CorrectExtrema(),\n",
        "",
        "x / x.abs().amax() on the device divides x by its own magnitudes: amax() returns x unreduced",
        ("tests/test_kernel_fixes.py",),
    ),
    Mutant(
        "amax-keepdim-shape-lost",
        "xlapipe/kernel_fixes.py",
        "    if keepdim:\n        out = out.reshape(",
        "    if False:\n        out = out.reshape(",
        "x.amax(dim, keepdim=True) on the device drops the reduced dimensions: broadcasting against x goes wrong",
        ("tests/test_kernel_fixes.py",),
    ),
    Mutant(
        "empty-dims-kernel-not-installed",
        "xlapipe/transforms/device.py",
        "    CorrectEmptyDims(),\n",
        "",
        "x.sum(dim=()) and x.mean(dim=[]) on the device return x as it is (var and std: nan), where eager "
        "PyTorch reduces every dimension",
        ("tests/test_claims.py::test_claim_holds[with_device-reductions-trains_as_eager]",),
    ),
    Mutant(
        "empty-dims-vector-norm-left",
        "xlapipe/kernel_fixes.py",
        '    "linalg_vector_norm": 2,\n',
        "",
        "torch.linalg.vector_norm(x, dim=()) on the device returns |x| element by element, not the norm",
        (T_KERNEL,),
    ),
    Mutant(
        "diagonal-kernel-not-installed",
        "xlapipe/transforms/device.py",
        "    CorrectDiagonal(),\n",
        "",
        "torch.diagonal(x) of a 3-D x on the device takes the last two dims' diagonal, in the right shape",
        ("tests/test_claims.py::test_claim_holds[with_device-reductions-trains_as_eager]",),
    ),
    Mutant(
        "diagonal-offset-not-negated",
        "xlapipe/kernel_fixes.py",
        "offset, dim1, dim2 = -offset, 1, 0",
        "offset, dim1, dim2 = offset, 1, 0",
        "x.diagonal(1) of a 3-D x on the device is the one below the main diagonal",
        (T_KERNEL,),
    ),
    Mutant(
        "diagonal-scatter-not-corrected",
        "xlapipe/kernel_fixes.py",
        'DIAGONAL_OPS = {"diagonal_copy": 1, "diagonal_scatter": 2}',
        'DIAGONAL_OPS = {"diagonal_copy": 1}',
        "a write through x.diagonal() of a 3-D x on the device lands elsewhere, and its gradient fails",
        (T_KERNEL,),
    ),
    Mutant(
        "interpolate-kernel-not-installed",
        "xlapipe/transforms/device.py",
        "    CorrectInterpolate(),\n",
        "",
        "F.interpolate(x, scale_factor=1.7) on the device takes other pixels than eager PyTorch, by the "
        "sizes' ratio",
        ("tests/test_claims.py::test_claim_holds[with_device-resize-trains_as_eager]",),
    ),
    Mutant(
        "interpolate-same-size-resampled",
        "xlapipe/kernel_fixes.py",
        "    return out == size or (not bilinear and out == 2 * size)\n",
        "    return not bilinear and out == 2 * size\n",
        "an interpolate whose scale leaves a dimension its size (7 pixels by 1.1) shifts its pixels, where "
        "PyTorch copies them",
        (T_KERNEL,),
    ),
    Mutant(
        "interpolate-gradient-misses-a-tap",
        "xlapipe/kernel_fixes.py",
        ".index_add(dim, high, g * w_high.view(shape))",
        "",
        "a bilinear resize by a scale gives only part of its gradient back to the input pixels",
        (T_KERNEL,),
    ),
    Mutant(
        "batched-svd-kernel-not-installed",
        "xlapipe/transforms/device.py",
        "    CorrectBatchedSvd(),\n",
        "",
        "torch.linalg.svdvals of a batch on the device returns one matrix's shape over the batch's data, "
        "and Vh is V with its first two dimensions swapped",
        ("tests/test_claims.py::test_claim_holds[with_device-batched_svd-trains_as_eager]",),
    ),
    Mutant(
        "batched-svd-empty-factors-stacked",
        "xlapipe/kernel_fixes.py",
        "first if first.numel() == 0 else ",
        "",
        "torch.svd(A, compute_uv=False) of a batch on the device: the empty U and V stacked into the "
        "batch's shape, where PyTorch gives zeros of the full shape",
        (T_KERNEL,),
    ),
    Mutant(
        "batched-svd-of-views",
        "xlapipe/kernel_fixes.py",
        "torch.ops.aten.select_copy(flat, 0, i)",
        "flat.select(0, i)",
        "the SVD of a batch of 5 x 5 matrices on the device: the first matrix's singular values are wrong",
        (T_KERNEL,),
    ),
    Mutant(
        "ops-without-gradient-not-decomposed-under-dynamo",
        "xlapipe/transforms/compile_step.py",
        "            kernel_fixes.DecomposeForAutograd(),\n",
        "",
        "under compile_step no parameter before a std(dim=...), a kl_div or a selu gets a gradient: they "
        "never train",
        (
            "tests/test_claims.py::test_claim_holds[compile_step-std_norm-trains_as_eager]",
            "tests/test_claims.py::test_claim_holds[compile_step-elu-trains_as_eager]",
        ),
    ),
    Mutant(
        "std-left-out-of-the-decomposed-ops",
        "xlapipe/kernel_fixes.py",
        '    "std.dim",\n',
        "",
        "under compile_step a normalisation written with x.std(dim) gets no gradient before it",
        ("tests/test_kernel_fixes.py",),
    ),
    Mutant(
        "doctor-replicas-not-merged",
        "xlapipe/doctor/diagnose.py",
        "            key = (f.kind, f.where)  # one finding however",
        "            key = (f.kind, f.where, process)  # one finding however",
        "a script launched on several chips reports the same host read once per replica, ranked as "
        "many findings, instead of once with the ranks it was found in",
        (
            "tests/test_doctor.py::test_a_script_started_by_torch_xla_launch_is_diagnosed_in_its_replica_with_its_rank",
        ),
    ),
    Mutant(
        "doctor-data-dependent-count-without-earlier",
        "xlapipe/doctor/checks/recompiles.py",
        "in_words(change.new_inputs, change.old_inputs, 'N')",
        "', '.join(change.new_inputs)",
        "a shape made by a mask index is listed ('s64[6,1], s64[6,1], ...') without what it was before",
        ("tests/test_doctor.py::test_a_shape_made_by_a_mask_index_is_blamed_on_it_not_on_the_batch_size",),
    ),
    Mutant(
        "ablate-imports-not-in-runs",
        "xlapipe/ablation/runner.py",
        "    tgt = evolve(resolve_target(target, args, runs.contract), imports=variants.imports)\n",
        "    tgt = resolve_target(target, args, runs.contract)\n",
        "a variant naming a practice of the user's own (--import) that the script never imports fails "
        "every run with 'unknown transform'",
        ("tests/test_ablation_unchanged.py::test_a_function_target_imports_the_practices_its_variants_name",),
    ),
    Mutant(
        "doctor-wrong-result-despite-the-correction",
        "xlapipe/doctor/probe.py",
        '    if fixes is not None and kernel is not None and kernel in getattr(fixes, "_installed", {}):\n',
        "    if False:\n",
        "the doctor tells an xlapipe user whose with_device corrects elu's gradient that it is wrong",
        ("tests/test_doctor.py::test_what_torch_xla_computes_wrong_is_found_first_and_its_fix_is_clean",),
    ),
    Mutant(
        "doctor-interpolate-backward-not-traced-to-its-forward",
        "xlapipe/doctor/probe.py",
        'INTERPOLATE_BACKWARD_ON_CPU = {"bilinear": "aten::upsample_bilinear2d", ',
        "INTERPOLATE_BACKWARD_ON_CPU = {",
        "a bilinear upsampling's backward on the CPU is blamed on loss.backward(), where the user cannot "
        "change it",
        (
            "tests/test_doctor.py::test_a_bilinear_upsamplings_backward_on_the_cpu_is_blamed_on_the_interpolate_line_with_its_fix",
        ),
    ),
    Mutant(
        "doctor-cdist-backward-not-traced-to-its-forward",
        "xlapipe/doctor/probe.py",
        '"pdist": "aten::_pdist", "cdist": "aten::_cdist"}',
        '"pdist": "aten::_pdist"}',
        "torch.cdist's backward on the CPU is blamed on loss.backward(), where the user cannot change it",
        (
            "tests/test_doctor.py::test_cdist_whose_backward_falls_back_is_blamed_on_its_forward_line_and_the_fix_runs_clean",
        ),
    ),
)


# -- checking and applying a mutant ------------------------------------------------------


def stale_reason(mutant: Mutant, repo: str) -> str | None:
    """Why ``mutant`` no longer applies to ``repo`` (None when it does)."""
    path = os.path.join(repo, mutant.file)
    if not os.path.isfile(path):
        return f"{mutant.file} does not exist"
    if mutant.replacement == mutant.original:
        return "the replacement equals the original snippet"
    with open(path, encoding="utf-8") as f:
        count = f.read().count(mutant.original)
    if count != 1:
        where = "is no longer in" if count == 0 else f"occurs {count} times in"
        return f"the original snippet {where} {mutant.file}: update the mutant to the current code"
    missing = [t for t in mutant.tests if not os.path.exists(os.path.join(repo, t.split("::")[0]))]
    if not mutant.tests or missing:
        return f"test file(s) not found: {', '.join(missing) or '(none listed)'}"
    return None


def mutated_source(mutant: Mutant, repo: str) -> str:
    """The mutated text of ``mutant.file`` (it must not be stale)."""
    with open(os.path.join(repo, mutant.file), encoding="utf-8") as f:
        return f.read().replace(mutant.original, mutant.replacement, 1)


def compile_error(mutant: Mutant, repo: str) -> str | None:
    """The SyntaxError of the mutated file, if it has one."""
    try:
        compile(mutated_source(mutant, repo), mutant.file, "exec")
    except SyntaxError as error:
        return f"the mutated {mutant.file} does not compile: {error}"
    return None


# -- a clean copy of the repository ---------------------------------------------------------


def repo_files(repo: str) -> list[str]:
    """What git tracks plus new files it does not ignore, as they are in the working tree."""
    try:
        out = subprocess.run(
            ["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(
            f"mutate: {repo} must be a git checkout (the copy is made of the files git lists): {error}"
        ) from None
    names = sorted({n for n in out.decode().split("\0") if n})
    return [n for n in names if os.path.lexists(os.path.join(repo, n))]  # deleted in the working tree: gone


def copy_repo(repo: str, files: Sequence[str], dest: str) -> None:
    for name in files:
        target = os.path.join(dest, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(repo, name), target, follow_symlinks=False)


# -- running the tests ----------------------------------------------------------------------

_RUNNING: set[subprocess.Popen] = set()
_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set when the run is interrupted: start no more tests
_FIRST_FAILURE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # pytest and whatever it started (forked replicas, ablation runs)
    except ProcessLookupError:
        pass


def _env(copy: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([copy, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.setdefault("PJRT_DEVICE", "CPU")
    return env


def run_tests(copy: str, tests: Sequence[str], timeout: float, python: str) -> tuple[str, int | None, str]:
    """Run pytest on ``tests`` in ``copy``: (outcome, exit code, output)."""
    with _LOCK:
        if _STOPPING.is_set():
            return "error", None, "interrupted before the tests started"
        proc = subprocess.Popen(
            [python, "-m", "pytest", *PYTEST, *tests],
            cwd=copy,
            env=_env(copy),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        _RUNNING.add(proc)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        output, _ = proc.communicate()
        return "timeout", None, output
    finally:
        _kill(proc)  # nothing it started outlives it
        with _LOCK:
            _RUNNING.discard(proc)
    if proc.returncode == 0:
        return "survived", 0, output
    if proc.returncode in (1, 2) and _FIRST_FAILURE.search(output):
        return "killed", proc.returncode, output
    return "error", proc.returncode, output


def foreign_import(copy: str, package: str, python: str) -> str | None:
    """Where ``package`` would be imported from in ``copy``'s test runs, when that is not the copy.

    An installed (e.g. editable) package ahead of the copy on the path would
    test the unmutated code and make every mutant survive.
    """
    code = "import importlib.util, sys; print(importlib.util.find_spec(sys.argv[1]).origin)"
    done = subprocess.run(
        [python, "-c", code, package], cwd=copy, capture_output=True, text=True, env=_env(copy)
    )
    origin = done.stdout.strip()
    inside = os.path.realpath(origin).startswith(os.path.realpath(copy) + os.sep)
    return (
        None
        if done.returncode == 0 and inside
        else (
            f"the tests would import {package} from {origin or done.stderr.strip()[-300:]}, not from the copy"
        )
    )


def _package(mutant: Mutant) -> str:
    """The top-level package (or module) the mutated file belongs to."""
    first = mutant.file.split("/")[0]
    return first[:-3] if first.endswith(".py") else first


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_mutant(mutant: Mutant, repo: str, files: Sequence[str], timeout: float, python: str) -> Result:
    """Apply ``mutant`` to a fresh copy of ``repo`` and run its tests there."""
    reason = stale_reason(mutant, repo)
    if reason:
        return Result(mutant.id, mutant.file, mutant.bug, "stale", detail=reason)
    reason = compile_error(mutant, repo)
    if reason:
        return Result(mutant.id, mutant.file, mutant.bug, "error", detail=reason)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"xlapipe-mutant-{mutant.id}-") as copy:
        copy_repo(repo, files, copy)
        text = mutated_source(mutant, repo)
        target = os.path.join(copy, mutant.file)
        os.unlink(target)  # a new file: never write through to anything the copy shares
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        reason = foreign_import(copy, _package(mutant), python)
        if reason:
            return Result(mutant.id, mutant.file, mutant.bug, "error", detail=reason)
        outcome, code, output = run_tests(copy, mutant.tests, timeout, python)
    seconds = round(time.monotonic() - start, 1)
    if outcome == "killed":
        return Result(
            mutant.id, mutant.file, mutant.bug, "killed", _FIRST_FAILURE.search(output)[1], seconds=seconds
        )
    detail = {
        "survived": "",
        "timeout": f"no result after {timeout:.0f} s\n{_tail(output)}",
        "error": f"pytest exit code {code}\n{_tail(output)}",
    }[outcome]
    return Result(mutant.id, mutant.file, mutant.bug, outcome, detail=detail, seconds=seconds)


def run_baseline(tests: Sequence[str], repo: str, files: Sequence[str], timeout: float, python: str) -> dict:
    """The unmutated copy against ``tests``: they must pass, and import the copy's xlapipe."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="xlapipe-mutant-baseline-") as copy:
        copy_repo(repo, files, copy)
        outcome, code, output = run_tests(copy, tests, timeout, python)
    passed = outcome == "survived"
    return {
        "tests": list(tests),
        "passed": passed,
        "exit_code": code,
        "seconds": round(time.monotonic() - start, 1),
        "output": "" if passed else _tail(output, 40),
    }


# -- reports --------------------------------------------------------------------------------


def machine() -> str:
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return (
        f"{platform.machine()}, {os.cpu_count()} cores{mem}, {platform.system()}, "
        f"Python {platform.python_version()}"
    )


def score(results: Sequence[Result]) -> dict:
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
    ran = counts["killed"] + counts["survived"] + counts["timeout"]
    return {
        **counts,
        "total": len(results),
        "ran": ran,
        "score": f"{counts['killed']}/{ran}" if ran else "0/0",
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: Sequence[Result], meta: dict) -> str:
    s = score(results)
    others = "".join(f", {s[o]} {o}" for o in ("stale", "error") if s[o])
    lines = [
        "# Mutation testing of xlapipe's core",
        "",
        f"Score: **{s['score']} killed** ({s['survived']} survived, {s['timeout']} timed out{others}; "
        f"{s['total']} mutants).",
        "",
        f"- date: {meta['date']}",
        f"- machine: {meta['machine']}",
        f"- command: `{meta['command']}`",
        f"- code: {meta['git']}",
        f"- baseline: {meta['baseline']}",
        f"- elapsed: {meta.get('elapsed', '-')} (baseline included)",
        "",
        "| id | file | bug | outcome | killed by (or why not run) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        outcome = f"**{r.outcome}**" if r.outcome != "killed" else r.outcome
        why = r.killed_by or (r.detail.splitlines()[0] if r.outcome != "survived" and r.detail else "")
        lines.append(f"| {r.id} | {r.file} | {_cell(r.bug)} | {outcome} | {_cell(why)} |")
    return "\n".join(lines) + "\n"


def write(out: str, results: Sequence[Result], meta: dict) -> None:
    os.makedirs(out, exist_ok=True)
    data = {**meta, "score": score(results), "results": [r._asdict() for r in results]}
    texts = {"mutation.json": json.dumps(data, indent=2) + "\n", "mutation.md": markdown(results, meta)}
    for name, text in texts.items():
        tmp = os.path.join(out, f".{name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out, name))


def git_state(repo: str) -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "?"

    dirty = " with uncommitted changes" if git("status", "--porcelain") not in ("", "?") else ""
    return f"{git('rev-parse', '--abbrev-ref', 'HEAD')} at {git('rev-parse', '--short', 'HEAD')}{dirty}"


# -- command line ---------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools/mutate.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated mutant ids to run (default: all)")
    p.add_argument("--list", action="store_true", help="list the mutants and check they apply; run nothing")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at the same time (default 1)")
    p.add_argument("--out", default=OUT, help=f"folder for mutation.md and mutation.json (default {OUT})")
    p.add_argument(
        "--timeout", type=float, default=600, help="seconds per mutant before it counts as timeout"
    )
    p.add_argument("--baseline-timeout", type=float, default=3600, help="seconds for the unmutated run")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated run (the tests must pass)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.timeout <= 0 or args.baseline_timeout <= 0:
        p.error("timeouts must be positive")
    return args


def select(mutants: Sequence[Mutant], only: str) -> list[Mutant]:
    ids = [m.id for m in mutants]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SystemExit(f"mutate: mutant ids must be unique; repeated: {', '.join(duplicates)}")
    if not only:
        return list(mutants)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in ids]
    if unknown:
        raise SystemExit(f"mutate: unknown mutant id(s) {', '.join(unknown)}; see --list")
    return [m for m in mutants if m.id in wanted]


def list_mutants(mutants: Sequence[Mutant], repo: str, echo: Callable[[str], None]) -> int:
    stale = 0
    for m in mutants:
        reason = stale_reason(m, repo) or compile_error(m, repo)
        stale += reason is not None
        stale_note = f"  STALE: {reason}" if reason else ""
        echo(f"{m.id}  [{m.file}]{stale_note}\n    {m.bug}\n    tests: {' '.join(m.tests)}")
    echo(f"{len(mutants)} mutants, {stale} stale" + (" (fix them: see STALE above)" if stale else ""))
    return 1 if stale else 0


def main(
    argv: Sequence[str] | None = None,
    mutants: Sequence[Mutant] = MUTANTS,
    repo: str = ROOT,
    echo: Callable[[str], None] = print,
) -> int:
    args = parse(argv)
    chosen = select(mutants, args.only)
    if args.list:
        return list_mutants(chosen, repo, echo)
    out = args.out if os.path.isabs(args.out) else os.path.join(repo, args.out)
    files = repo_files(repo)
    start = time.monotonic()
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(),
        "command": " ".join(["tools/mutate.py", *(argv if argv is not None else sys.argv[1:])]),
        "git": git_state(repo),
        "baseline": "skipped (--no-baseline)",
    }
    runnable = [m for m in chosen if not stale_reason(m, repo)]
    if not args.no_baseline and runnable:
        tests = list(dict.fromkeys(t for m in runnable for t in m.tests))
        echo(f"baseline: the unmutated code against {len(tests)} test file(s) ...")
        base = run_baseline(tests, repo, files, args.baseline_timeout, sys.executable)
        meta["baseline"] = f"{'passed' if base['passed'] else 'FAILED'} in {base['seconds']} s"
        if not base["passed"]:
            echo(
                f"mutate: the tests fail without any mutant (exit {base['exit_code']}); fix that first:\n"
                f"{base['output']}"
            )
            write(out, [], {**meta, "baseline_output": base["output"]})
            return 2
        echo(f"baseline: {meta['baseline']}")
    results: dict[str, Result] = {}
    order = [m.id for m in chosen]

    def finished(result: Result) -> None:
        results[result.id] = result
        meta["elapsed"] = f"{(time.monotonic() - start) / 60:.0f} min"
        done = [results[i] for i in order if i in results]
        write(out, done, meta)
        extra = (
            f" by {result.killed_by}"
            if result.killed_by
            else (f": {result.detail.splitlines()[0]}" if result.detail else "")
        )
        echo(f"[{len(done)}/{len(order)}] {result.id}: {result.outcome}{extra} ({result.seconds:.0f} s)")

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    try:
        futures = [pool.submit(run_mutant, m, repo, files, args.timeout, sys.executable) for m in chosen]
        for future in concurrent.futures.as_completed(futures):
            finished(future.result())
    finally:  # normal end, an error, Ctrl-C or SIGTERM: stop every test run, remove every copy
        pool.shutdown(wait=False, cancel_futures=True)
        with _LOCK:
            _STOPPING.set()
            for proc in list(_RUNNING):
                _kill(proc)
        pool.shutdown(wait=True)
        _STOPPING.clear()
    final = [results[i] for i in order]
    s = score(final)
    echo(
        f"mutation score {s['score']} killed; survived: "
        f"{', '.join(r.id for r in final if r.outcome == 'survived') or 'none'}; results in {out}"
    )
    bad = [r for r in final if r.outcome in ("stale", "error")]
    for r in bad:
        echo(f"mutate: {r.id} is {r.outcome}: {r.detail.splitlines()[0]}")
    return 1 if bad else 0


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds: children killed, temporary copies removed


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("mutate: interrupted; the results so far are in the output folder")
