"""The notebooks' stored outputs: run a notebook in a kernel, compare outputs within a tolerance, refresh them, write
the Colab cells.
"""
