# Two commands for a fresh machine: `make run` (set up, run the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run demo browser slurm test test-slow test-slurm gpu-check peer-venv clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# The main job: seq2seq with and without attention on the built-in `reverse` task (~2 min on
# 2 cores); prints the score table, writes workdirs/demo/{results.md,results.png} and heatmaps.
run: $(STAMP)
	$(BIN)/python launch.py --experiment=translate \
	  --config=experiments/configs/translate.py:demo --workdir=workdirs/demo \
	  --sweep=model.rnn.decoder=none,bahdanau
	@echo "attention heatmap: workdirs/demo/decoder=bahdanau/attention.png"

# The primitives demo: every score x normalizer learns associative recall (~40 s on 2 cores);
# writes workdirs/primitives_demo/, apart from `run`'s workdirs/demo.
demo: $(STAMP)
	$(BIN)/python -m experiments.demo

# Headless Chromium for the page tests (the run viewer, the reading-focus demo), from the OS
# packages when we are root with apt; otherwise those tests skip with one line saying why.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium and chromium-driver for the browser tests"; \
	  apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; } || \
	  echo "could not install chromium: the browser tests will skip"; \
	else echo "chromium is not installed and this is not root with apt: the browser tests will skip"; fi

# Slurm (slurm-wlm: slurmctld, slurmd and the client commands) and munge for the tests that run
# launch.py's Slurm launcher and srun on a one-node cluster of this machine
# (tests/slurm_cluster.py), from the OS packages when we are root with apt; otherwise, or if the
# cluster does not come up, those tests skip with one line saying why. Then the cluster is
# started, `sinfo` shown, and stopped: `python tests/slurm_cluster.py -- <command>` runs a
# command with it up (SLURM_CONF set).
slurm: $(STAMP)
	@if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
	  && command -v sbatch >/dev/null && command -v munged >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing slurm-wlm and munge for the Slurm tests"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null 2>&1; } || \
	  echo "could not install slurm-wlm and munge: the Slurm tests will skip"; \
	else echo "slurm-wlm is not installed and this is not root with apt: the Slurm tests will skip"; fi
	@$(BIN)/python tests/slurm_cluster.py || echo "the Slurm tests will skip"

# Test files are spread over PYTEST_WORKERS processes (pytest-xdist), each file kept in one
# worker so its module fixtures (a trained run several tests read) are built once. Most tests are
# bound by single-threaded XLA compilation, so two workers use both cores of a CI machine.
# A test that hangs fails after PYTEST_TIMEOUT seconds (pytest-timeout), a worker that dies is
# replaced at most twice, and the whole run is stopped after SUITE_TIMEOUT: a crash fails the
# suite within minutes instead of hanging it.
PYTEST_WORKERS ?= 2
PYTEST_TIMEOUT ?= 900
SUITE_TIMEOUT ?= 3600
test: $(STAMP) browser
	timeout --kill-after=60 $(SUITE_TIMEOUT) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) \
	  --dist=loadfile --max-worker-restart=2 --timeout=$(PYTEST_TIMEOUT) $(PYTEST_ARGS)

# The long end-to-end runs the default suite leaves out (`-m slow`: the multi-device and
# multi-process runs, real sweeps, the pinned demo figures); each names the fast test that keeps
# what it pins covered in `make test`.
test-slow: $(STAMP)
	timeout --kill-after=60 $(SUITE_TIMEOUT) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) \
	  --dist=loadfile --max-worker-restart=2 --timeout=$(PYTEST_TIMEOUT) -m slow $(PYTEST_ARGS)

# launch.py's Slurm launcher and `srun ... --distributed=auto` on a one-node Slurm of this
# machine (tests/test_slurm.py, the `slurm` marker; ~6 min on 2 busy cores, so not in `make test`).
test-slurm: $(STAMP) slurm
	timeout --kill-after=60 $(SUITE_TIMEOUT) $(BIN)/python -m pytest -q -p no:randomly \
	  --timeout=$(PYTEST_TIMEOUT) -m slurm tests/test_slurm.py $(PYTEST_ARGS)

# On a GPU (not yet run on a device, so no time is known): both fused kernels against the float64 references on
# the device, then the speed table against cuDNN, XLA and JAX's Pallas attention, written under
# gpu_check_out/.
# `make gpu-check GPU_CHECK_ARGS=--dry_run` runs the same flow on CPU in interpret mode.
GPU_CHECK_ARGS ?=
gpu-check: $(STAMP)
	$(BIN)/python -m experiments.gpu_check --out=gpu_check_out $(GPU_CHECK_ARGS)

# The peer for the speed sitting (python -m experiments.bench_peer): JoeyNMT and torch in their own
# environment, .peer-venv/ (~6 GB), never a dependency of the project.
peer-venv: .peer-venv/bin/python
.peer-venv/bin/python: peers/requirements.txt
	$(PY) -m venv .peer-venv
	.peer-venv/bin/python -m pip install -q -r peers/requirements.txt

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
