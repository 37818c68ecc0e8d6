# Two commands do all the set-up: `make lab` and `make test`. Both create the environment on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# JupyterLab options; the test of `make lab` passes its own (address, port, token, no browser)
LAB_ARGS ?=
# Jupyter refuses to run as root (containers, CI) unless told to
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
# nbval workers: notebooks run in parallel, each notebook whole in one worker (--dist loadfile)
NBVAL_WORKERS ?= 2
NBVAL_OPTS := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg --nbval-cell-timeout 300

.PHONY: env lab test lint unit notebooks outputs doctor colab clean help

help:
	@echo "make lab      create the environment (first run) and open the notebooks in JupyterLab"
	@echo "make test     create the environment (first run) and run lint, unit tests and nbval"
	@echo "make outputs  re-execute every notebook in place to refresh its stored outputs"
	@echo "make doctor   report what this machine can run, chapter by chapter"
	@echo "make clean    remove the environment"

env: $(STAMP)

$(STAMP): requirements.txt requirements-d2l.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if (3, 10) <= v[:2] <= (3, 12) else \
	  "Python 3.10 to 3.12 is needed; $(PYTHON) is %d.%d. Run: make PYTHON=python3.11 ..." % v[:2])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -r requirements.txt
	$(BIN)/python -m pip install --no-deps -r requirements-d2l.txt
	$(BIN)/python -m pip install --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (d2l_ext)"
	touch $@

lab: env
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

lint: env
	$(BIN)/ruff check d2l_ext tests tools notebooks conftest.py

unit: env
	$(BIN)/python -m pytest tests -q

notebooks: env
	PYTHONHASHSEED=0 $(BIN)/python -m pytest $(NBVAL_OPTS) -n $(NBVAL_WORKERS) --dist loadfile notebooks -q

test: lint unit notebooks

# Refresh stored outputs: run every notebook top to bottom in place, seeded, without timing metadata.
outputs: env
	$(BIN)/python tools/refresh_outputs.py notebooks

# Colab badges and setup cells, README badges: from the repository address in tools/colab.py
colab: env
	$(BIN)/python tools/colab.py

doctor: env
	$(BIN)/python -m d2l_ext.doctor

clean:
	rm -rf $(VENV)
