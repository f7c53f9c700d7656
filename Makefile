# The two commands: `make demo` and `make test`. Both set everything up first, and the
# set-up is idempotent and quick when already done.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# setuptools says "Editable installation ... be careful with folders named like your
# package" on every editable install; that is kvstored/ itself here, so it is noise.
QUIET_SETUPTOOLS := PYTHONWARNINGS="ignore:Editable installation"
# What pip must redo when these change.
INSTALL_INPUTS := pyproject.toml setup.py $(wildcard native/*.c native/*.h native/build_*.py sdk/*.c sdk/*.h) \
                  $(wildcard tools/csrc/*.c tools/csrc/*.h tools/build_*.py)

.PHONY: setup sysdeps engines demo test lint clean

setup: sysdeps $(STAMP)

sysdeps:
	@.ci/sysdeps

$(STAMP): $(INSTALL_INPUTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(QUIET_SETUPTOOLS) $(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# SGLang, vLLM and LMCache (CPU builds) for tests/integrations; not needed by the demo.
engines: setup
	@.ci/engines

demo: setup
	$(BIN)/python -m kvstored.demo

# Three workers on CI's two vCPUs: most of the suite waits on fsync, child processes and
# daemons, so a third worker fills the idle CPU. Tests of one module or class share a
# worker (--dist loadscope), so module fixtures are built once; tests/conftest.py hands out
# the scopes with slow tests first, so xdist must not re-sort them (--no-loadscope-reorder).
# PYTEST_ARGS= runs serially.
PYTEST_ARGS ?= -n 3 --dist loadscope --no-loadscope-reorder
# pytest exits 5 when it collects nothing: that is a failure here, not a pass.
test: setup engines
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# ruff, and the type checker against its baseline (.basedpyright/baseline.json): a new
# error fails; fixed ones leave the baseline with `basedpyright --writebaseline`. With the
# engines installed, so the adapters are checked against the engines' own types.
lint: setup engines
	$(BIN)/ruff check .
	$(BIN)/basedpyright

clean:
	rm -rf $(VENV) build *.egg-info native/*.so
