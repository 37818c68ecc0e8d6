"""Other environments and machines: extra venvs, the matrix, Colab's packages, Binder's build, a GPU's report, this
CPU's ridge points.
"""
