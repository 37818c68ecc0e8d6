# How make test runs the notebooks, in one place. The Makefile includes this file; tools/outputs/run.py reads it
# for the tools that run the notebooks another way (check-tags, check-timing, the matrix, Colab's run,
# measure-ridges). Lines are NAME ?= VALUE: a make command line may override each (make test TEST_THREADS=).
#
# Pins that make stored numbers hold across x86 CPUs: MKL and oneDNN take the AVX2 code path that the stored
# outputs were made with, also on CPUs with AVX-512 or AMX (elsewhere, e.g. on ARM, they change nothing). The
# harness compares numbers within a tolerance, so a machine without these pins passes too: the matrix checks it.
NUMERIC_ENV ?= PYTHONHASHSEED=0 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
# The tests run several notebooks at once: one thread per kernel, or their threads fight over the cores. make
# outputs runs one notebook at a time with every thread, as a learner does; the matrix tries other thread counts.
TEST_THREADS ?= OMP_NUM_THREADS=1
# nbval in strict mode (every stored output compared), in this environment's kernel, after tests/sanitize.cfg
NBVAL_OPTS ?= --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg --nbval-cell-timeout 300
