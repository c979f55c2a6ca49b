# infergraph: `make lab` opens the collection, `make test` runs everything CI runs.
# Both bootstrap .venv from requirements.txt once; the stamp file makes re-runs free
# until requirements.txt or pyproject.toml change.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip --quiet --disable-pip-version-check
# Every folder of notebooks that exists; nbval re-runs each notebook and compares outputs.
# A cell still running after 480 s is interrupted by nbval (its traceback shows where it hung; the notebook's
# later cells are marked xfail), before pytest-timeout's 600 s per item (pyproject.toml) fails it by name.
NOTEBOOK_DIRS := $(wildcard notebooks exercises solutions)
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg --nbval-cell-timeout=480

.PHONY: lab test stress bench lint notebooks exercises clean

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), f"infergraph needs Python 3.10 or newer, found {sys.version.split()[0]}"'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps -e .
	@touch $@

# JupyterLab refuses to start as root unless told; containers often run as root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks $(ALLOW_ROOT)

test: $(STAMP)
	$(BIN)/python -m pytest $(NBVAL) tests infergraph_lite $(NOTEBOOK_DIRS)

# Every notebook with live measurements three times beside a CPU-bound process pinned to one core, then three times
# beside one the OS moves between cores (a busy laptop); a table of passes and seconds per notebook and mode.
# STRESS_ARGS=--fresh-clone also runs a fresh clone's `make test` beside the pinned process;
# STRESS_ARGS='--burner-mode pinned' (or unpinned) runs one mode only.
stress: $(STAMP)
	$(BIN)/python tools/stress_check.py --runs 3 --burners 1 $(STRESS_ARGS)

bench: $(STAMP)
	@for script in benchmarks/bench_*.py; do $(BIN)/python $$script || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m mypy

# For maintainers: re-execute every notebook top to bottom in a fresh kernel and save the outputs.
notebooks: $(STAMP)
	$(BIN)/python tools/execute_notebooks.py $(NOTEBOOK_DIRS)

# For maintainers: after editing solutions/, regenerate (and run) exercises/ from them.
exercises: $(STAMP)
	$(BIN)/python tools/make_exercises.py

clean:
	rm -rf $(VENV)
