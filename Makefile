# make demo  — create .venv when missing, install, run the whole pipeline on the embedded digits set
# make test  — create .venv when missing, run the fast set of the test suite (≤ 5 min on 2 cores; tests marked slow left out)
# make test-all — the whole suite, the slow tests too (what CI runs)
# make lint  — ruff, mypy (the package; the TensorRT modules against tensorrt-stubs), import-linter's contracts
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The onnxruntime/TensorRT extra follows the hardware: gpu where an NVIDIA GPU answers, else cpu.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
EXTRA := $(if $(HAS_GPU),gpu,cpu)
# The dev/test venv pins the torch + torchvision pair that timm needs (constraints-dev.txt); users' CPU installs use
# constraints-cpu.txt (README).
CONSTRAINTS := $(if $(HAS_GPU),,-c constraints-dev.txt)
DEMO_DIR ?= demo

.PHONY: demo test test-all lint typecheck clean

$(BIN)/.installed-$(EXTRA): pyproject.toml constraints-dev.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(CONSTRAINTS) -e ".[$(EXTRA),dev]"
	# tensorrt-stubs declares tensorrt as a dependency, whose libraries only NVIDIA's index serves: types only.
	$(BIN)/python -m pip install -q --no-deps tensorrt-stubs || echo "tensorrt-stubs unavailable: mypy check of the TensorRT modules will be skipped"
	rm -f $(BIN)/.installed-*
	touch $@

install: $(BIN)/.installed-$(EXTRA)

# One pytest worker per core (pytest-xdist; tests/conftest.py pins each worker to its share of the cores). The work
# is handed out test by test (worksteal), so the long tests do not queue behind one worker. TEST_WORKERS=0: one process.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST := $(BIN)/python -m pytest -q --durations=10 $(if $(filter 0 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)
# make test: the newcomer's second step, the fast set; the tests marked `slow` (pyproject's markers: each says why it
# is slow) run in make test-all, which .ci/run runs. Both print their ten slowest tests. Nothing runs only by hand but the full-size models (VITDEPLOY_SLOW=1).
test: $(BIN)/.installed-$(EXTRA)
	$(PYTEST) -m "not slow"

test-all: $(BIN)/.installed-$(EXTRA)
	$(PYTEST)

# Linters are not tests: the suite stays about behaviour. scripts/lint_checks.py adds mypy over the TensorRT modules
# against tensorrt-stubs and the proofs that mypy and both import contracts can fail.
lint: $(BIN)/.installed-$(EXTRA)
	$(BIN)/ruff check vitdeploy tests scripts
	$(BIN)/python -m mypy vitdeploy
	$(BIN)/lint-imports
	$(BIN)/python scripts/lint_checks.py

typecheck: lint

demo: $(BIN)/.installed-$(EXTRA)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh $(DEMO_DIR)

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .cache/test-artifacts
