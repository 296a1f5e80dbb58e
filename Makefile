# Developer entry points. Everything runs inside .venv/ (created on demand), so after any target
# .venv/bin/vgpu-dra exists. Native parts (simulated GPUs, vgpu_hook) have their own Makefiles.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
NATIVE_DIRS := $(patsubst %/Makefile,%,$(wildcard hack/fakegpu/Makefile vgpu_hook/Makefile))
PYTEST_ARGS ?=

.PHONY: all venv native native-test controlplane test unit lint demo bench clean protos

all: venv native

$(VENV)/.stamp: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.stamp

# Rebuild the Cython extension in place when its source changes (editable installs do not).
dra_driver/allocator/_fastquantity.stamp: $(VENV)/.stamp $(wildcard dra_driver/allocator/*.pyx)
	$(PY) setup.py --quiet build_ext --inplace
	touch $@

native: dra_driver/allocator/_fastquantity.stamp
	@for d in $(NATIVE_DIRS); do $(MAKE) --no-print-directory -C $$d || exit 1; done

native-test: native
	@for d in $(NATIVE_DIRS); do $(MAKE) --no-print-directory -C $$d test || exit 1; done

controlplane: venv
	bash hack/testbed/node-packages.sh
	bash hack/testbed/build.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

unit: native
	$(VENV)/bin/pytest -q tests/unit $(PYTEST_ARGS)

# The whole suite: what CI runs.
test: lint native-test controlplane
	$(VENV)/bin/pytest -q -rs tests $(PYTEST_ARGS)

demo: native controlplane
	$(VENV)/bin/vgpu-dra demo

bench: native controlplane
	$(PY) -m bench

clean:
	rm -rf build $(VENV) .mypy_cache .ruff_cache .pytest_cache dra_driver/allocator/*.so \
	    dra_driver/allocator/*.c dra_driver/allocator/*.stamp
	@for d in $(NATIVE_DIRS); do $(MAKE) --no-print-directory -C $$d clean; done
