# jigsawrl — the two set-up commands of the README, each creating its own virtualenv.
#   make demo      three real RL pipelines multiplexed by jigsaw on this CPU through Ray (a few
#                  minutes; installs the engine and ray extras, profiles this CPU once into
#                  profiles/cpu.yaml); progress, measured vs predicted table, timeline and reward
#                  curves land in runs/demo
#   make test      the offline, CPU-only test suite (installs the engine extra: pinned CPU torch)
#   make sim-demo  the simulated comparison on 8 × H100 (no torch needed), in runs/sim-demo
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo sim-demo test lint bench clean

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $@

# torch (engine extra) and ray (ray extra) are pinned and installed in one pip command: torch
# takes the local CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.full: $(VENV)/.core
	$(PIP) -e '.[engine,dev,ray]'
	touch $@

# The real runtime: the engine (pinned CPU torch) and ray extras, without the dev tools.
$(VENV)/.real: $(VENV)/.core
	$(PIP) -e '.[engine,ray]'
	touch $@

# This CPU's sub-stage costs at one thread per logical device (what `run --ray` maps a device
# to), measured (~75 s); the demo's predictions use it. A profile older than PROFILE_MAX_AGE_MIN
# minutes is measured again: a VM's speed drifts, and a profile 63 minutes old predicted the
# real bench 43-57% off where a fresh one was within 9% (docs/BENCHMARKS.md, "Rollouts that
# grow once started").
PROFILE_MAX_AGE_MIN ?= 60
profiles/cpu.yaml: | $(VENV)/.real
	$(VENV)/bin/jigsawrl profile --threads 1 --out $@

demo: $(VENV)/.real
	@find profiles/cpu.yaml -mmin +$(PROFILE_MAX_AGE_MIN) -delete 2>/dev/null || true
	$(MAKE) profiles/cpu.yaml
	$(VENV)/bin/jigsawrl run configs/real/demo.yaml --ray --out runs/demo

sim-demo: $(VENV)/.core
	$(VENV)/bin/jigsawrl simulate configs/two-gsm8k.yaml --policy jigsaw
	$(VENV)/bin/jigsawrl compare configs/two-gsm8k.yaml --policies verl,verl-serial,muxserve,jigsaw --out runs/sim-demo

test: $(VENV)/.full
	$(PY) -m pytest -q

lint: $(VENV)/.full
	$(VENV)/bin/ruff check src tests

bench: $(VENV)/.core
	$(VENV)/bin/jigsawrl bench sim-speed configs/scale-64.yaml

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
