"""Headless Chromium for the checks that open pages: Debian's browser, found once, a free port, a blank-page test.

The book's check drives it with Playwright (``open_browser``): one browser for every page, a wait for what the page
must show instead of a fixed time budget, and the page's layout measured in it (which ``--dump-dom`` cannot do).
Playwright cannot download its own browser on machines without the internet, so it drives Debian's
(``executable_path``). Playwright supports the Chromium revision it ships with; a trial here on 2026-11-27 drove
Debian's Chromium 156 with Playwright 1.65.2 (built for 159) through every page of the book. Both are pinned (the
book's requirements, Debian's package): bump them together and run ``make check-book``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# as root (containers, CI) Chromium's sandbox cannot start; no GPU process in a headless check
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
MIN_INK = 0.02  # share of non-white pixels below which a screenshot counts as blank
INSTALL_HINT = "make browser-deps (apt-get install -y chromium fonts-noto-cjk)"


def find_chromium() -> str | None:
    """Return the path of the system's Chromium, or None."""
    return next((path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))),
                None)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ink_share(png: Path, white: int = 245) -> float:
    """Return the share of a screenshot's pixels that are not (near) white."""
    from PIL import Image

    with Image.open(png) as image:
        histogram = image.convert("L").histogram()
    return 1 - sum(histogram[white:]) / max(1, sum(histogram))


@contextlib.contextmanager
def open_browser(executable: str) -> Iterator[Any]:
    """Yield a Playwright browser running ``executable`` headless; it is closed on the way out."""
    # in the book's environment (requirements-book.txt), not in .venv, which the type check runs in
    from playwright.sync_api import sync_playwright  # pyright: ignore[reportMissingImports]

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


# Elements of a page's main column whose box runs past the column's right edge: a table or a code block wider
# than the column hides its last columns from a reader. Code that scrolls inside its own box (a long output
# line) stays inside the column and is not listed.
WIDER_THAN_COLUMN_JS = """(column) => {
  const main = document.querySelector(column);
  if (!main) return null;
  const edge = main.getBoundingClientRect().right - parseFloat(getComputedStyle(main).paddingRight);
  return [...main.querySelectorAll('table, pre, div.highlight')]
    .map(e => ({what: e.tagName.toLowerCase(), text: e.innerText.trim().slice(0, 50),
                right: Math.round(e.getBoundingClientRect().right), edge: Math.round(edge)}))
    .filter(x => x.right > x.edge + 1);
}"""


def wider_than_column(page: Any, column: str = "article.bd-article") -> list[dict] | None:
    """Return the tables and code blocks of ``page`` that run past its main column (None: no such column)."""
    return page.evaluate(WIDER_THAN_COLUMN_JS, column)
