# Two commands do everything on a fresh clone:
#   make demo       set up, build the digits demo dataset, train ResNet-50 v1.5 on it, report
#   make test       set up, run the whole test suite, in parallel on every core (pytest-xdist)
# and one is for the edit loop:
#   make test-fast  set up, run the unit tier alone (in process, seconds a test; the tiers are in pytest.ini)
# `make setup` alone creates .venv with requirements.txt, requirements-dev.txt and Horovod (built from source
# with MXNet and Gloo support when missing); `make test` also makes .venv-consumers (`make consumers` alone), the
# PyTorch packages that check export's torchvision weights and that the benchmarks' PyTorch peer runs with
# (requirements-consumers.txt: 2 GB of wheels, 1-2 minutes). Pick another
# MXNet wheel with e.g.
#   make setup MXNET=mxnet-cu112==1.9.1
# (a CUDA build of MXNet; Horovod then also needs HOROVOD_GPU_OPERATIONS=NCCL in the environment).
# After the suite, `make test` runs the unit tier again under the container's twin, .venv-3.8 (`make twin` alone):
# Python 3.8, as NVIDIA's MXNet containers have, with the image's MXNet and numpy and what the Dockerfile installs
# over them (docs/docker.md); where the machine has no Python 3.8, it says so in one line.

PYTHON ?= python3
MXNET ?= mxnet==1.9.1
VENV := .venv
PY := $(VENV)/bin/python
CONSUMERS := .venv-consumers
# The container's twin: pyenv's Python 3.8 (PYENV_ROOT, else ~/.pyenv), else python3.8 on PATH; none, no twin.
PYENV_ROOT ?= $(HOME)/.pyenv
PYTHON38 ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.8.*/bin/python3.8) $(shell command -v python3.8))
TWIN := .venv-3.8
TWIN_PY := $(TWIN)/bin/python
# What the image itself ships, which the Dockerfile never replaces: MXNet (its CPU build here) and numpy, the oldest
# of the supported tags' (pandas 2.0.3 needs 1.20.3 on Python 3.8: docs/docker.md).
CONTAINER_IMAGE := mxnet==1.9.1 numpy==1.20.3
DEMO_DATA := data/demo
DEMO_RUN := runs/demo

.PHONY: setup consumers twin test test-fast test-twin demo clean

setup: $(VENV)/.requirements $(VENV)/.horovod
	# The recipe's own modules byte-compiled, as pip compiles an installed package's: where the environment sets
	# PYTHONDONTWRITEBYTECODE (CI's does), every process would otherwise compile them again on import (0.2 s of
	# each that imports train.py; the suite starts over a hundred). Up-to-date files are skipped.
	$(PY) -m compileall -q rn50 scripts $(wildcard *.py)

# torchvision and timm, the consumers of export's torchvision weights, for the tests, in an environment of their
# own (requirements-consumers.txt says why, why --no-deps, and which of their declared dependencies are needed);
# the benchmarks' PyTorch peer (scripts/pytorch_peer.py) runs there too.
consumers: $(CONSUMERS)/.installed

$(CONSUMERS)/.installed: requirements-consumers.txt
	test -x $(CONSUMERS)/bin/python || $(PYTHON) -m venv $(CONSUMERS)
	$(CONSUMERS)/bin/python -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --no-deps \
		-r requirements-consumers.txt
	touch $@

$(VENV)/.requirements: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	sed '/^mxnet==/d' requirements.txt > $(VENV)/requirements-resolved.txt
	echo '$(MXNET)' >> $(VENV)/requirements-resolved.txt
	# --no-warn-conflicts here and for Horovod: gluoncv and onnxruntime (below) go without some of their declared
	# dependencies on purpose, which pip listed as conflicts, looking like a failure, whenever it installed a
	# package they depend on (Horovod's pyyaml). The filtered pip check after Horovod reports any other conflict.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-warn-conflicts \
		-r $(VENV)/requirements-resolved.txt -r requirements-dev.txt
	# onnxruntime checks exported ONNX models. Every release for Python 3.11 declares numpy>=1.24.2, which
	# mxnet 1.9.1 cannot use; 1.16.3 runs fine on numpy 1.23.5, so it is installed without its declared
	# dependencies (it needs none of them to run a model).
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps onnxruntime==1.16.3
	# GluonCV's resnet*_v1b networks check weight_origins.py's import of GluonCV checkpoints. The tests load
	# model_zoo/resnetv1b.py by file path (it needs only MXNet), so none of the package's declared
	# dependencies (opencv-python, pandas, autocfg, ...) is installed.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps gluoncv==0.10.5.post0
	touch $@

# Horovod 0.28.1 compiles against the installed MXNet (about two minutes on 2 cores). It needs the system
# cmake: the cmake 4 wheel from PyPI rejects Gloo's CMakeLists.
$(VENV)/.horovod: $(VENV)/.requirements
	$(PY) -c 'import horovod.mxnet' 2>/dev/null || \
	HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
	HOROVOD_WITHOUT_PYTORCH=1 PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	$(PY) -m pip install --quiet --disable-pip-version-check --no-warn-conflicts horovod==0.28.1 \
		--no-build-isolation --no-cache-dir
	$(PY) -c 'import horovod.mxnet'
	# pip check, less the dependencies gluoncv and onnxruntime go without on purpose: prints any other conflict
	$(PY) -m pip check | grep -v -e '^gluoncv ' -e '^onnxruntime ' | sed 's/^/pip check: /' || true
	touch $@

# One test process per core (-n auto), each with its share of the cores as OpenMP threads (tests/conftest.py);
# --dist loadgroup runs the multi-worker tests one after another on one of them.
PYTEST := PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest tests -q -p no:cacheprovider -n auto --dist loadgroup

# The container's twin, as the Dockerfile builds the image: the image's packages first, then the constraints
# container_setup.py reads from them, requirements-container.txt under those and requirements-container-nodeps.txt
# without dependencies; then the tests' own (requirements-container-dev.txt; gluoncv as for .venv), pip check as for
# .venv (onnxruntime's numpy>=1.21.6 is among what it leaves out: onnxruntime runs on 1.20.3), and Horovod (as
# for .venv; the container has its own). Its wheel, built against the twin's one MXNet, stays in pip's cache: the
# build takes three minutes on 2 cores the first time; another clone's whole twin then took 1 min 29 s.
twin: $(TWIN)/.horovod

$(TWIN)/.requirements: requirements-container.txt requirements-container-nodeps.txt requirements-container-dev.txt
	@test -n '$(PYTHON38)' || { echo 'error: no Python 3.8 for the twin (pyenv install 3.8.18)' >&2; exit 2; }
	test -x $(TWIN_PY) || $(PYTHON38) -m venv $(TWIN)
	$(TWIN_PY) -m pip install --quiet --disable-pip-version-check --no-warn-conflicts $(CONTAINER_IMAGE)
	$(TWIN_PY) scripts/container_setup.py constraints > $(TWIN)/constraints.txt
	$(TWIN_PY) -m pip install --quiet --disable-pip-version-check --no-warn-conflicts -c $(TWIN)/constraints.txt \
		-r requirements-container.txt -r requirements-container-dev.txt
	$(TWIN_PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-container-nodeps.txt \
		gluoncv==0.10.5.post0
	$(TWIN_PY) -m pip check | grep -v -e '^gluoncv ' -e '^onnxruntime ' | sed 's/^/pip check: /' || true
	touch $@

$(TWIN)/.horovod: $(TWIN)/.requirements
	$(TWIN_PY) -c 'import horovod.mxnet' 2>/dev/null || \
	HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
	HOROVOD_WITHOUT_PYTORCH=1 PATH=$(CURDIR)/$(TWIN)/bin:$$PATH \
	$(TWIN_PY) -m pip install --quiet --disable-pip-version-check --no-warn-conflicts horovod==0.28.1 \
		--no-build-isolation
	$(TWIN_PY) -c 'import horovod.mxnet'
	touch $@

# The twin is made first: the suite's own test_container.py imports every module of the recipe in it.
test: setup $(CONSUMERS)/.installed $(if $(PYTHON38),twin)
	$(PYTEST)
	$(MAKE) --no-print-directory test-twin

test-fast: setup
	$(PYTEST) -m unit

# The unit tier under the container's twin; one line where the machine has no Python 3.8.
ifeq ($(PYTHON38),)
test-twin:
	@echo "make test: no Python 3.8 here (pyenv install 3.8.18): the unit tier under the container's Python skipped"
else
test-twin: twin
	$(TWIN_PY) -m compileall -q rn50 scripts $(wildcard *.py)
	PATH=$(CURDIR)/$(TWIN)/bin:$$PATH $(TWIN_PY) -m pytest tests -m unit -q -p no:cacheprovider -n auto --dist loadgroup
endif

demo: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH PYTHON=$(PY) ./scripts/demo.sh $(DEMO_DATA) $(DEMO_RUN)

clean:
	rm -rf $(DEMO_RUN) $(DEMO_DATA)
