# One virtual environment, created once and reused; every target goes through it.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.xlapipe-installed
OUT ?= results/nlp-ablation

.PHONY: venv test ablate bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The tests: real torch_xla on the CPU runtime when there is no TPU.
test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
