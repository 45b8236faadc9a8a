# One virtual environment, created once and reused; every target goes through it.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.xlapipe-installed
OUT ?= results/nlp-ablation

.PHONY: venv test lint long corpus fuzz opsweep ablate bench bench-fleet bench-noise bench-doctor bench-kernels mutate mutate-stats clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq -e '.[test,lint,ray]'  # -qq: errors only (some pip set-ups warn per package about index locations)
	touch $(STAMP)

venv: $(STAMP)

# The tests: real torch_xla on the CPU runtime when there is no TPU. Two at a time (pytest-xdist, one
# torch thread each: the machine has 2 cores), then, alone, the few whose verdict reads wall time
# (marked serial: the doctor's findings), so a neighbour cannot change them.
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadgroup -m "not serial" --durations=25
	$(PY) -m pytest -q -m serial

# The corpus of ported public training scripts (tests/corpus), every practice subset each can
# take, against the script in eager PyTorch, with a resume in a new session each (docs/testing.md).
# `make test` runs its CI slice only.
corpus: $(STAMP)
	$(PY) -m pytest -q tests/test_corpus.py --corpus-full

# The end-to-end checks too long for CI's slice (marked long: the bench's smoke run, the synthetic
# task's learnability in eager PyTorch, scan_layers on GPT-2; about 6 minutes).
long: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 -m long --long

# The claims harness's long profile: every practice's claim on every case of the zoo, every law and
# save point, and 200 drawn pipelines of several practices (each printed as drawn).
# `make test` runs a fixed slice (docs/testing.md). Last run 2026-12-06: 2,905 passed, 10 known failures,
# none failed (about 2 hours on 2 cores shared with other jobs).
fuzz: $(STAMP)
	XLAPIPE_FUZZ=1 $(PY) -m pytest -q -s tests/test_claims.py --claims-full

# Every op of PyTorch's OpInfo database on the XLA device against eager PyTorch (tools/op_sweep.py),
# then again with xlapipe's kernel fixes in force: what a session still gets wrong. About 5 minutes
# each on 2 CPU cores. Results: $(OPSWEEP_OUT)/plain and /corrected, summary.md and results.jsonl.
OPSWEEP_OUT ?= results/op-sweep
opsweep: $(STAMP)
	$(PY) tools/op_sweep.py --out $(OPSWEEP_OUT)/plain
	$(PY) tools/op_sweep.py --corrected --out $(OPSWEEP_OUT)/corrected

# Lint, format and types, configured in pyproject.toml (ruff on the whole repository, mypy on xlapipe/).
# `$(VENV)/bin/ruff format .` applies the formatting that the check asks for.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Which practice buys what, read like the original report and decided: the model on
# the XLA device alone (the baseline), then one practice added per row (static
# shapes first, then the wrappers, then the default tensor type), and eager
# PyTorch on the CPU as an extra reference row. The example runs unchanged: each variant
# replaces its pipeline and the session measures it (one epoch of 12 steps per run; the figure is the median step after
# the warm-up each run shows, at least 3 steps). Each row is compared with the row before
# it, then with the baseline; the last row runs twice (--aa, the A/A pair: the noise floor, which
# must come out "no detectable difference"). Every row gets 3 rounds, each in a fresh seeded random order,
# the undecided ones more (up to 6), within a budget of 25 minutes (2 CPU cores). Each run is a fresh
# interpreter (xlapipe/child_process.py).
# Running it again resumes; remove $(OUT) to start over.
# Results: $(OUT)/ablation.md, .csv, .png, phases.png, recommended.py/.json, results.jsonl.
ABLATE_OPTS ?= --aa --warmup 3 --budget 25m
ABLATE_PLAN ?= --mode add-one --baseline with_device --eager-reference \
	--order static_shapes,hf_traced_masks,wrap_model_mp,wrap_loader_mp,set_default_tensor_type
ABLATE_ARGS ?= --size small --epochs 1 --max-steps 12 --warmup 3 --train-size 192 --eval-size 32
ablate: $(STAMP)
	$(VENV)/bin/xlapipe ablate examples/nlp_example.py --out $(OUT) $(ABLATE_PLAN) $(ABLATE_OPTS) -- $(ABLATE_ARGS)

# xlapipe against Accelerate, a hand-written torch_xla loop and eager PyTorch on
# identical work, each run in a fresh process, repeats interleaved (28 minutes
# on 2 quiet CPU cores, up to 50 on a busy machine). Results: $(BENCH_OUT)/results.md and .json.
# See bench/README.md.
BENCH_OUT ?= results/bench
BENCH_ARGS ?= --size full
bench: $(STAMP)
	$(PY) -m pip install --quiet accelerate
	$(PY) -m bench.run $(BENCH_ARGS) --out $(BENCH_OUT)

# The ablation on a fake Ray cluster against this machine alone: the dispatch cost per run and the
# speed-up of three machines, on sleeping runs (about 3 minutes). Results: $(FLEET_OUT)/fleet.json.
FLEET_OUT ?= results/fleet
bench-fleet: $(STAMP)
	$(PY) -m bench.fleet --out $(FLEET_OUT)

# How noisy this machine is, and what that costs the main job: a fixed numpy workload alone, then
# one long run of the example's last row; the rounds and minutes an increment of 10% and 5% would
# need, per steps measured per run (about 7 minutes). Results: $(NOISE_OUT)/results.md and .json.
NOISE_OUT ?= results/noise
bench-noise: $(STAMP)
	$(PY) -m bench.noise --out $(NOISE_OUT)

# The doctor's own cost: every script of its corpus run plain and under `xlapipe doctor`, side by
# side (14 minutes per repeat on 2 quiet cores). Results: $(DOCTOR_COST_OUT)/results.md and .json.
DOCTOR_COST_OUT ?= results/doctor-cost
bench-doctor: $(STAMP)
	$(PY) -m bench.doctor_cost --repeats 2 --out $(DOCTOR_COST_OUT)

# What with_device's corrected kernels cost the host: tracing a BERT step and x.mean(-1) with
# torch_xla's own kernels, with the corrections, and with them but the Python kernels over torch_xla's
# own, in alternating rounds of one process (about 2 minutes). Results: $(KERNEL_COST_OUT)/kernel_cost.json.
KERNEL_COST_OUT ?= results/kernel-cost
bench-kernels: $(STAMP)
	$(PY) -m bench.kernel_cost --repeats 30 --out $(KERNEL_COST_OUT)/kernel_cost.json

# Mutation testing of the core, on demand (not in CI): each bug listed in
# tools/mutate.py is planted in a temporary copy of the repository, one at a
# time, and the tests that should catch it are run there (the checkout is never changed).
# The last full run (2026-12-06), of 105 mutants (132 now): 104 killed, one equivalent (docs/testing.md),
# 52 minutes on 2 CPU cores with make fuzz beside it, the unmutated suite included. Results:
# $(MUTATE_OUT)/mutation.md and .json. See docs/testing.md.
MUTATE_OUT ?= results/mutation
MUTATE_ARGS ?=
mutate: $(STAMP)
	$(PY) tools/mutate.py --out $(MUTATE_OUT) $(MUTATE_ARGS)

# mutmut 3.8.1 on the ablation's statistics ([tool.mutmut] in pyproject.toml: stats.py, its two test
# files), in a virtual environment of its own that sees .venv's packages; one child leaves the other core
# free. On demand, not in CI: its first runs (2026-12-03, in parts) took 42 minutes; docs/testing.md.
MUTMUT_VENV ?= $(VENV)-mutmut
mutate-stats: $(STAMP)
	test -x $(MUTMUT_VENV)/bin/mutmut || { $(PY) -m venv $(MUTMUT_VENV) && \
	  $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	    > $$($(MUTMUT_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-xlapipe-venv.pth && \
	  $(MUTMUT_VENV)/bin/pip install -q mutmut==3.8.1; }
	rm -rf mutants
	$(MUTMUT_VENV)/bin/mutmut run --max-children 1
	$(MUTMUT_VENV)/bin/mutmut results

clean:
	rm -rf $(VENV) $(VENV)-mutmut mutants results .pytest_cache .hypothesis
