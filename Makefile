# jigsawrl — the two set-up commands of the README, each creating its own virtualenv.
#   make demo   simulate two RL pipelines on 8 × H100 under several schedulers and print the
#               comparison (no torch needed); plots and timelines land in runs/demo
#   make test   the offline, CPU-only test suite (installs the engine extra: pinned CPU torch)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test lint bench clean

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $@

# torch (engine extra) and ray (ray extra) are pinned and installed in one pip command: torch
# takes the local CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.full: $(VENV)/.core
	$(PIP) -e '.[engine,dev,ray]'
	touch $@

demo: $(VENV)/.core
	$(VENV)/bin/jigsawrl simulate configs/two-gsm8k.yaml --policy jigsaw
	$(VENV)/bin/jigsawrl compare configs/two-gsm8k.yaml --policies verl,verl-serial,muxserve,jigsaw --out runs/demo

test: $(VENV)/.full
	$(PY) -m pytest -q

lint: $(VENV)/.full
	$(VENV)/bin/ruff check src tests

bench: $(VENV)/.core
	$(VENV)/bin/jigsawrl bench sim-speed configs/scale-64.yaml

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
