# Developer entry points. Everything runs inside .venv/ (created on demand), so after any target
# .venv/bin/vgpu-dra exists. Native parts (simulated GPUs, vgpu_hook) have their own Makefiles.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
NATIVE_DIRS := $(patsubst %/Makefile,%,$(wildcard hack/fakegpu/Makefile vgpu_hook/Makefile))
PYTEST_ARGS ?=

.PHONY: all venv native native-test controlplane test unit lint demo bench clean protos image image-base image-tree torch

all: venv native

$(VENV)/.stamp: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.stamp

# Rebuild the allocator's Cython extension (_scan) in place when its source changes (editable
# installs do not).
dra_driver/allocator/_scan.stamp: $(VENV)/.stamp $(wildcard dra_driver/allocator/*.pyx)
	$(PY) setup.py --quiet build_ext --inplace
	touch $@

native: dra_driver/allocator/_scan.stamp
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

# PyTorch from PyPI (pinned, with the NVIDIA libraries its CUDA build links, without NVIDIA's CUDA
# runtime) in an environment of its own under ~/.cache/vgpu-dra/torch, for the framework tests
# (docs/frameworks.md). A warm run is a no-op; a fresh one downloads ~2.6 GB (see the doc).
torch:
	bash hack/torch/install.sh

# The whole suite: what CI runs.
test: lint native-test controlplane image-tree torch
	$(VENV)/bin/pytest -q -rs tests $(PYTEST_ARGS)

# torch: step 5 (d) runs PyTorch in the shared pod's container (without it the part is skipped).
demo: native controlplane torch
	$(VENV)/bin/vgpu-dra demo

bench: native controlplane torch
	$(PY) -m bench

# The container image (Dockerfile), built with whichever engine works here (docker, podman or
# buildah; ENGINE=... picks one) and also written as $(IMAGE_ARCHIVE), which a node without a
# registry loads (`ctr -n k8s.io images import`). IMAGE names it; IMAGE_BASE replaces the
# Dockerfile's base (python:3.11-slim). Without an image registry:
#   make image-base image IMAGE_BASE=$(DEBIAN_BASE)   (the base made from Debian packages)
IMAGE         ?= vgpu-dra:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_ARCHIVE ?= build/image/vgpu-dra.tar
IMAGE_BASE    ?=
DEBIAN_BASE   ?= vgpu-dra-base:$(shell . /etc/os-release 2>/dev/null && echo $$VERSION_CODENAME)
IMAGE_TREE    ?= build/image-tree

image:
	sh deploy/image/build-image.sh $(IMAGE) $(IMAGE_ARCHIVE) $(IMAGE_BASE)

# A base image from Debian packages (mmdebstrap; the host's apt mirror and release), imported
# into the engine as $(DEBIAN_BASE); kept once it exists (REBUILD=1 makes it again).
image-base:
	engine=$$(sh deploy/image/engine.sh) && sh deploy/image/debian-base.sh "$$engine" $(DEBIAN_BASE)

# The image's file tree without a container engine (deploy/image/build-tree.sh), for tests and
# for packing into an OCI image elsewhere.
# Built before the tests (which use it read-only) so no test reaches a package index.
# (Tracked files that exist: one deleted in the worktree is no prerequisite.)
IMAGE_TREE_SOURCES := $(wildcard $(shell git ls-files pyproject.toml setup.py dra_driver \
    kubelet_plugin controller vgpu_hook deploy/image 2>/dev/null))

$(IMAGE_TREE)/.built: $(VENV)/.stamp $(IMAGE_TREE_SOURCES)
	sh deploy/image/build-tree.sh $(IMAGE_TREE) $(PY)
	touch $@

image-tree: $(IMAGE_TREE)/.built

clean:
	rm -rf build $(VENV) .mypy_cache .ruff_cache .pytest_cache dra_driver/allocator/*.so \
	    dra_driver/allocator/*.c dra_driver/allocator/*.stamp
	@for d in $(NATIVE_DIRS); do $(MAKE) --no-print-directory -C $$d clean; done
