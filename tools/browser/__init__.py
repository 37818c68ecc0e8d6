"""Pages in headless Chromium: the book's pages, and JupyterLab showing a chapter."""
