"""The web book and its Vietnamese and Chinese editions."""
