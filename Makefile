# The two commands of the README: `make demo` (platform + main job) and `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install bytecode demo smoke test lint lock bench down clean

JEMALLOC := .tools/lib/libjemalloc.so.2
SAVE_PACING := .tools/lib/libnoida_save_pacing.so

install: $(STAMP) $(JEMALLOC) $(SAVE_PACING)

# uv installs the lock file in seconds; it is bootstrapped with pip from PyPI. Bytecode is
# compiled here, as pip does and uv does not by default: where PYTHONDONTWRITEBYTECODE is set
# nothing else writes it, and every process would compile its imports again at start (about
# 1.1 s of CPU for each gpulens command, restarts included).
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "uv==0.13.9" 2>/dev/null || $(BIN)/python -m pip install -q uv
	VIRTUAL_ENV=$(VENV) $(BIN)/uv pip sync -q --compile-bytecode requirements.lock
	VIRTUAL_ENV=$(VENV) $(BIN)/uv pip install -q --no-deps -e .
	touch $(STAMP)

# jemalloc, which `gpulens up` runs the worker, the sink and the exporter on, unpacked from
# Debian's package (gpulens/infra/python_allocator.py). Its own target, not the lock's: a
# checkout installed before it gets it too. Where it cannot be had, install goes on (the
# processes run on CPython's allocator) and tries again next time.
$(JEMALLOC):
	./deploy/jemalloc/install_jemalloc.sh >/dev/null || echo "jemalloc could not be unpacked into .tools/lib (apt-get download libjemalloc2 failed): the pipeline runs on CPython's allocator"

# The library that paces the embedded broker's saves (gpulens/infra/broker.py), compiled from
# its C source. Where no C compiler is found install goes on (the broker saves at its own pace,
# a third of a core at 100,000 GPUs) and tries again next time.
$(SAVE_PACING): deploy/noida/save_pacing.c
	./deploy/noida/build_save_pacing.sh >/dev/null || echo "the broker's save pacing could not be built into .tools/lib (no C compiler?): noida-db saves at its own pace"

# Our own package's bytecode, brought up to date before each run (only changed files compile).
bytecode: install
	$(BIN)/python -m compileall -q gpulens bench

demo: bytecode
	$(BIN)/gpulens up

# `gpulens up` on a private platform (free ports, temporary state), then down: beside a running one.
smoke: bytecode
	d=$$(mktemp -d) && $(BIN)/gpulens up --private $$d; rc=$$?; \
	$(BIN)/gpulens --config $$d/gpulens.toml down; rm -rf $$d; exit $$rc

test: bytecode
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/pytest -n 2 --dist loadfile

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# Regenerate the lock file from pyproject.toml (needs PyPI).
lock:
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 -o requirements.lock

bench: bytecode
	$(BIN)/python -m bench.broker_throughput

down:
	$(BIN)/gpulens down

clean:
	rm -rf $(VENV) .gpulens
