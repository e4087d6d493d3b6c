# make demo  — create .venv when missing, install, run the whole pipeline on the embedded digits set
# make test  — create .venv when missing, run the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The onnxruntime/TensorRT extra follows the hardware: gpu where an NVIDIA GPU answers, else cpu.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
EXTRA := $(if $(HAS_GPU),gpu,cpu)
CONSTRAINTS := $(if $(HAS_GPU),,-c constraints-cpu.txt)
DEMO_DIR ?= demo

.PHONY: demo test lint typecheck clean

$(BIN)/.installed-$(EXTRA): pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(CONSTRAINTS) -e ".[$(EXTRA),dev]"
	# tensorrt-stubs declares tensorrt as a dependency, whose libraries only NVIDIA's index serves: types only.
	$(BIN)/python -m pip install -q --no-deps tensorrt-stubs || echo "tensorrt-stubs unavailable: mypy check of the TensorRT modules will be skipped"
	rm -f $(BIN)/.installed-*
	touch $@

install: $(BIN)/.installed-$(EXTRA)

test: $(BIN)/.installed-$(EXTRA)
	$(BIN)/python -m pytest -q

lint: $(BIN)/.installed-$(EXTRA)
	$(BIN)/ruff check vitdeploy tests

# mypy over the TensorRT modules against tensorrt-stubs (the same check the test suite runs)
typecheck: $(BIN)/.installed-$(EXTRA)
	$(BIN)/python -m pytest -q tests/test_typecheck.py tests/test_engine_mypy.py

demo: $(BIN)/.installed-$(EXTRA)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh $(DEMO_DIR)

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
