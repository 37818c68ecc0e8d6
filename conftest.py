# Loads the notebook harness for every pytest run in this repository (nbval runs on notebooks/ included).
pytest_plugins = ["tests.nbval_harness"]
