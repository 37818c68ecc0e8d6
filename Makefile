# Two commands do all the set-up: `make lab` and `make test`. Both create the environment on first use.
SHELL  := /bin/bash
# The Python that creates .venv. `make test-colab PYTHON=...` names Colab's Python instead: .venv is then still
# created with DEFAULT_PYTHON
DEFAULT_PYTHON := python3
PYTHON ?= $(DEFAULT_PYTHON)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# the test, lint and type-check tools (requirements-dev.txt), on top: make test and the checks need them, learners not
DEV_STAMP := $(VENV)/.installed-dev
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
# A venv whose Python-independent packages (NVIDIA's libraries) a new one hard-links (tools/envs/venvs.py)
SEED_FROM ?=
# JupyterLab options; the test of `make lab` passes its own (address, port, token, no browser)
LAB_ARGS ?=
# The folder JupyterLab opens: the English notebooks, or an edition (make lab LAB_DIR=editions/vi or editions/zh-CN)
LAB_DIR ?= notebooks
# Jupyter refuses to run as root (containers, CI) unless told to
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
# nbval workers: notebooks run in parallel, each notebook whole in one worker (--dist loadfile)
NBVAL_WORKERS ?= 2
# How make test runs the notebooks (the numeric pins, one thread a kernel, nbval's options): one file, which the
# tools that run the notebooks another way read too
include tools/outputs/settings.mk

.PHONY: env dev lab test lint unit notebooks outputs measure-ridges test-matrix test-colab check-tags check-timing check-memory check-gpu doctor colab check-binder check-browser book check-book browser-deps clean help gpu-check book-check binder-check browser-check

help:
	@echo "Learning:"
	@echo "  make lab             create the environment (first run) and open the notebooks in JupyterLab"
	@echo "  make doctor          report what this machine can run, chapter by chapter"
	@echo "  make book            build the course as a web book (English, Vietnamese, Chinese) in build/book/html"
	@echo "  make check-gpu       on a machine with a GPU: run every notebook, report to build/gpu-check.md"
	@echo "Contributing (CONTRIBUTING.md):"
	@echo "  make test            create the environment (first run) and run lint, unit tests and nbval"
	@echo "  make env             only create or update the learners' environment (.venv: requirements.txt)"
	@echo "  make dev             the same with the test, lint and type-check tools (requirements-dev.txt)"
	@echo "  make lint            ruff and the type check over d2l_ext, tests, tools and the notebooks"
	@echo "  make unit            the unit tests alone"
	@echo "  make notebooks       the notebooks alone, stored outputs compared (nbval)"
	@echo "  make outputs         re-execute every notebook in place to refresh its stored outputs"
	@echo "  make colab           rewrite Colab badges and setup cells from the address in tools/outputs/colab_cells.py"
	@echo "  make measure-ridges  this CPU's ridge point under each setting CI tries (roofline.CPU_RIDGES, chapter 10)"
	@echo "  make test-colab PYTHON=python3.13   the notebooks on Colab's packages and Python (tests/envs/colab.txt)"
	@echo "  make check-binder    check Binder's generated build against this Makefile (repo2docker, no Docker)"
	@echo "  make check-browser   open a chapter in JupyterLab in headless Chromium and save a screenshot"
	@echo "  make clean           remove the environment"
	@echo "CI (.ci/run runs these after make test):"
	@echo "  make check-tags      find outputs that depend on the torch build or the device but are not tagged"
	@echo "  make browser-deps    install Debian's chromium and a CJK font with apt-get (root), if missing"
	@echo "  make check-book      serve the book on 127.0.0.1: check its links, open every page in headless Chromium"
	@echo "  make check-memory    run every notebook as on Binder: a fresh kernel, it and what it starts in 2 GiB"
	@echo "                       less 200 MB for the server (a cgroup, or systemd-run); each notebook's peaks"
	@echo "  make test-matrix     the notebooks under other CPU code paths, thread counts and Pythons (2 combined"
	@echo "                       runs; MATRIX_ARGS=--each: each change alone, 9 runs, to tell which one moved a cell)"
	@echo "  make check-timing    find compared outputs that change when clocks run 3x fast early in each cell,"
	@echo "                       then late (--twice, each notebook twice in one kernel: CI runs it in the matrix)"
	@echo "tools/README.md maps each target to its module. Old names still work: gpu-check, book-check, binder-check,"
	@echo "browser-check."

env: $(STAMP) $(LAB_SETTINGS)
dev: $(DEV_STAMP) $(LAB_SETTINGS)

# JupyterLab's settings for the course (Binder's postBuild copies the same file): no news toast, and closing a
# notebook's tab shuts its kernel down, which frees its GPU memory
$(LAB_SETTINGS): binder/overrides.json | $(STAMP)
	mkdir -p $(dir $@)
	cp $< $@

$(STAMP): requirements.txt requirements-d2l.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if (3, 10) <= v[:2] <= (3, 13) else \
	  "Python 3.10 to 3.13 is needed; $(PYTHON) is %d.%d. Run: make PYTHON=python3.11 ..." % v[:2])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(if $(SEED_FROM),$(BIN)/python -m tools.envs.venvs seed $(SEED_FROM))
	bash tools/envs/install.sh $(BIN)/python
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (d2l_ext)"
	$(if $(SEED_FROM),$(BIN)/python -m tools.envs.venvs dedupe $(SEED_FROM))
	touch $@

lab: env
	$(BIN)/jupyter lab --ServerApp.root_dir=$(LAB_DIR) $(ROOT_FLAG) $(LAB_ARGS)

# The steps of every installation are tools/envs/install.sh's (Binder's postBuild and Colab's stack run it too)
$(DEV_STAMP): requirements-dev.txt $(STAMP)
	bash tools/envs/install.sh $(BIN)/python --dev
	touch $@

lint: dev
	$(BIN)/ruff check d2l_ext tests tools notebooks conftest.py
	$(BIN)/python -m tools.checks.typecheck $(if $(FRESH),,--cache $(VENV)/.typecheck-passed)

unit: dev
	$(BIN)/python -m pytest tests -q

notebooks: dev
	env $(NUMERIC_ENV) $(TEST_THREADS) $(BIN)/python -m pytest $(NBVAL_OPTS) -n $(NBVAL_WORKERS) --dist loadfile notebooks -q

# lint, then the unit tests and the notebooks in one pytest run: TEST_WORKERS workers take a test file or a
# notebook at a time (unit tests mostly wait on subprocesses, so a third worker fills the two cores).
# A test file that passed before with the same inputs (its bytes, the code it may read, the packages, the
# variables; tools/result_cache.py) is not run again: FRESH=1 runs everything. A fresh clone (CI) runs everything.
# The tests must leave the tree as they found it: no file written, no notebook changed.
TEST_WORKERS ?= 3
FRESH ?=
TEST_CACHE := -p tools.result_cache --test-cache $(VENV)/.test-results.json $(if $(FRESH),--rerun-all)
test:
	@before="$$(git status --porcelain --untracked-files=all 2>/dev/null)"; \
	$(MAKE) --no-print-directory lint || exit $$?; \
	env $(NUMERIC_ENV) $(TEST_THREADS) $(BIN)/python -m pytest tests notebooks $(NBVAL_OPTS) -n $(TEST_WORKERS) \
	  --dist loadfile $(TEST_CACHE) \
	  -q --durations=10 || exit $$?; \
	after="$$(git status --porcelain --untracked-files=all 2>/dev/null)"; \
	if [ "$$before" != "$$after" ]; then \
	  echo "make test changed these files (tests must write only to temporary folders):"; \
	  diff <(echo "$$before") <(echo "$$after"); exit 1; fi

# The notebook suite under the variations this machine can produce (tools/envs/matrix.py says which)
MATRIX_ARGS ?=
test-matrix: dev
	$(BIN)/python -m tools.envs.matrix $(MATRIX_ARGS)

# The notebooks on Colab's packages (tests/envs/colab.txt) and Colab's Python, given as PYTHON= (a 3.13):
# without it, one line says what to install; no other Python is taken in its place
# COLAB_ARGS: pytest arguments instead of every notebook and the sliders' tests
COLAB_ARGS ?=
# The tool runs in .venv (it reads make test's settings with nbformat), created first with DEFAULT_PYTHON
test-colab:
	@$(MAKE) --no-print-directory dev PYTHON=$(DEFAULT_PYTHON)
	$(BIN)/python -m tools.envs.colab --python $(PYTHON) $(COLAB_ARGS)

# Untagged outputs that change when torch reports a CPU-only build or a GPU (tools/checks/tags.py)
CHECK_TAGS_ARGS ?=
check-tags: dev
	$(BIN)/python -m tools.checks.tags $(CHECK_TAGS_ARGS)

# On a machine with a GPU: run every notebook, write build/gpu-check.md (without a GPU: says so, exits 0)
check-gpu: dev
	$(BIN)/python -m tools.envs.gpu

# Compared outputs that change when clocks run 3x fast before each cell's turn (its first timed work), then after
# CHECK_TIMING_ARGS=--twice (CI): each notebook twice in one kernel, both runs compared (a learner re-running it)
CHECK_TIMING_ARGS ?=
check-timing: dev
	$(BIN)/python -m tools.checks.timing $(CHECK_TIMING_ARGS)

# This CPU's ridge point under make test's pins, each setting of the matrix and with one core busy: the figures
# roofline.CPU_RIDGES records and chapter 10 labels its operations against (tools/envs/ridges.py, about a minute)
# MEASURE_RIDGES_ARGS=--record writes them to d2l_ext/cpu_ridges.json
MEASURE_RIDGES_ARGS ?=
measure-ridges: dev
	$(BIN)/python -m tools.envs.ridges $(MEASURE_RIDGES_ARGS)

# Every notebook run as Binder runs it (tools/checks/memory.py): a fresh kernel, no test runner in its memory, the
# kernel and every process it starts in Binder's 2 GiB less 200 MB for the Jupyter server, under the system's own
# limit (a cgroup, or systemd-run) where it allows one. Reports each notebook's peaks and the cells that hold them.
# CHECK_MEMORY_ARGS=--record also writes them to d2l_ext/memory_peaks.json (make doctor) and docs/chapters.md
CHECK_MEMORY_ARGS ?=
check-memory: dev
	$(BIN)/python -m tools.checks.memory $(CHECK_MEMORY_ARGS)

# Refresh stored outputs: run every notebook top to bottom in place, seeded, without timing metadata.
outputs: dev
	env $(NUMERIC_ENV) $(BIN)/python -m tools.outputs.refresh notebooks

# The book: the notebooks' stored outputs as a static site, English, Vietnamese and Chinese (tools/book/build.py), in its
# own environment (Sphinx 9 and the themes need Python 3.11 or newer; requirements.txt also serves 3.10)
BOOK_PYTHON ?= python3
BOOK_VENV   ?= .venv-book
# CI passes --skip-if-no-browser: without Chromium the links are still checked, and a banner says what was not
CHECK_BOOK_ARGS ?=
$(BOOK_VENV)/.installed: requirements-book.txt
	@$(BOOK_PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v[:2] >= (3, 11) else \
	  "make book needs Python 3.11 or newer; $(BOOK_PYTHON) is %d.%d. Run: make book BOOK_PYTHON=python3.11" % v[:2])'
	$(BOOK_PYTHON) -m venv $(BOOK_VENV)
	$(BOOK_VENV)/bin/python -m pip install -q -r requirements-book.txt
	touch $@

book: $(BOOK_VENV)/.installed
	$(BOOK_VENV)/bin/python -m tools.book.build

# The built book served on 127.0.0.1: every internal link and anchor followed, every page in headless Chromium
check-book: $(BOOK_VENV)/.installed browser-deps
	$(BOOK_VENV)/bin/python -m tools.browser.book_pages $(CHECK_BOOK_ARGS)

# Colab badges and setup cells, README badges: from the repository address in tools/outputs/colab_cells.py
colab: env
	$(BIN)/python -m tools.outputs.colab_cells

doctor: env
	$(BIN)/python -m d2l_ext.doctor

# Binder's build, generated by repo2docker without Docker, compared with this Makefile's (needs PyPI once)
check-binder: dev
	$(BIN)/python -m tools.envs.binder

# JupyterLab served by `make lab`, a chapter opened in headless Chromium (Debian's package), a screenshot
check-browser: env $(BOOK_VENV)/.installed browser-deps
	$(BOOK_VENV)/bin/python -m tools.browser.lab --output build/browser-check.png

# Debian's Chromium, and a CJK font for the Chinese pages, for the checks that open pages. Installing them takes
# apt-get and root: the line before says so, and without root it says what to install instead.
browser-deps:
	@(command -v chromium && fc-list :lang=zh | grep -q .) >/dev/null || { \
	  echo "Chromium or a CJK font is missing: installing Debian's chromium and fonts-noto-cjk with apt-get"; \
	  (apt-get update -qq && apt-get install -y -qq chromium fonts-noto-cjk) || \
	  echo "could not install them (apt-get needs root): install chromium and fonts-noto-cjk, then run it again"; }

# The checks' names before 2026-11-27, kept for a while (scripts and notes that name them)
gpu-check: check-gpu
book-check: check-book
binder-check: check-binder
browser-check: check-browser

clean:
	rm -rf $(VENV) .venv-binder $(BOOK_VENV)
