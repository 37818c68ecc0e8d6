"""Check the built book as a reader meets it: `make check-book` (after `make book`).

1. Serves build/book/html on 127.0.0.1 (a free port) and follows every internal link of the three editions over
   HTTP, from the front page: every page, figure, script and style sheet must answer, and every link to an
   anchor must find it (LinkChecker, tried here, checked the same 434 URLs without anchors in 96 s; this takes seconds).
   External links are not followed: they need the network. A missing page fails, named with the page linking it.
2. Opens each edition's front page and every notebook page in headless Chromium, driven by Playwright
   (tools/browser/chromium.py): two browsers, one per core, each taking half the pages. First each checks a canary
   page with a table too wide, which the width check must catch. No table or code block may run past the main
   column at 1400 pixels: a wide table hides its last columns. A notebook page's DOM must hold that notebook's
   stored outputs: as many output blocks as the notebook has code cells with outputs, and as many figures
   (<img> inside outputs) as it stores PNG images; the first line of a stored printed output must be in the
   page's text. Every formula ($...$ in the notebooks) must be typeset by MathJax, which the book ships (a canary
   page with a formula and no MathJax must be caught first). A screenshot of each page is written under
   build/book/screenshots/EDITION/, and it must not be blank (Pillow counts the pixels that are not white).

Usage: python -m tools.browser.book_pages [--html build/book/html] [--editions en vi zh-CN] [--pages 01_devices ...]
Exit status 0 when every check passes, 1 with one line per failure otherwise.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import nbformat

from tools import REPO as ROOT
from tools.book.build import EDITIONS
from tools.browser.chromium import (
    INSTALL_HINT,
    MIN_INK,
    find_chromium,
    free_port,
    ink_share,
    open_browser,
    wider_than_column,
)

COLUMN = "article.bd-article"  # the book theme's main column
VIEWPORT = (1400, 1600)  # a laptop's width; tall enough that a screenshot holds a chapter's first outputs

def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``folder`` on 127.0.0.1 in a thread; return the server and its base address."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a browser that closes a connection early (a page's last requests): not the book's fault

    server = Server(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class Links(HTMLParser):
    """The URLs a page refers to: links, images, scripts and style sheets, with the ids it defines."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        for name in ("href", "src"):
            if values.get(name) and not (tag == "link" and values.get("rel") in ("preconnect", "dns-prefetch")):
                self.urls.append(str(values[name]))


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            body = answer.read()
            kind = answer.headers.get_content_type()
            return answer.status, body.decode("utf-8", "replace") if kind == "text/html" else ""
    except urllib.error.HTTPError as err:
        return err.code, ""


def crawl(base: str) -> tuple[int, list[str]]:
    """Follow every internal link from ``base``/index.html over HTTP, as a reader's browser would: every page,
    image, script and style sheet must answer 200, and a link to ``page#anchor`` must find that id on the page.
    External links (another host) are not followed: they need the network. Return the URLs checked and the
    broken ones, each with the page that links to it."""
    seen: dict[str, str] = {f"{base}/index.html": "(start)"}
    pages: dict[str, Links] = {}
    anchors: list[tuple[str, str, str]] = []  # (page, anchor, linked from)
    broken: list[str] = []
    todo = [f"{base}/index.html"]
    with ThreadPoolExecutor(max_workers=8) as pool:
        while todo:
            results = list(pool.map(fetch, todo))
            next_todo = []
            for url, (status, body) in zip(todo, results, strict=True):
                if status != 200:
                    broken.append(f"broken link: {url} ({status}), linked from {seen[url]}")
                    continue
                if not body:
                    continue
                parser = Links()
                parser.feed(body)
                pages[url] = parser
                for link in parser.urls:
                    target, _, anchor = urljoin(url, link).partition("#")
                    if not target.startswith(base + "/"):
                        continue
                    target = target.split("?", 1)[0]
                    if anchor and target.endswith(".html"):
                        anchors.append((target, anchor, url))
                    if target not in seen:
                        seen[target] = url
                        next_todo.append(target)
            todo = next_todo
    for target, anchor, source in anchors:
        if target in pages and anchor not in pages[target].ids:
            broken.append(f"broken anchor: {target}#{anchor}, linked from {source}")
    return len(seen), broken


def expected(notebook_path: Path) -> tuple[int, int, str | None]:
    """Return the output blocks, the PNG figures and one printed line the page must show for a notebook."""
    notebook = nbformat.read(notebook_path, as_version=4)
    blocks = figures = 0
    line = None
    for cell in notebook.cells:
        if cell.cell_type != "code" or cell.get("id") == "colab-setup" or not cell.get("outputs"):
            continue
        blocks += 1
        for output in cell.outputs:
            figures += "image/png" in output.get("data", {})
            if line is None and output.get("output_type") == "stream":
                first = next((x.strip() for x in output.get("text", "").splitlines() if len(x.strip()) > 8), None)
                line = first
    return blocks, figures, line


def page_text(dom: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", dom))


# In a page: -1 if it has math but MathJax did not load, else how many formulas MathJax left as TeX (after it is done)
UNTYPESET_MATH = """async () => {
  const math = [...document.querySelectorAll('span.math, div.math')];
  if (math.length === 0) return 0;
  if (!window.MathJax || !window.MathJax.startup) return -1;
  await window.MathJax.startup.promise;
  return math.filter(e => !e.querySelector('mjx-container')).length;
}"""


MATH_CANARY = '<p><span class="math notranslate nohighlight">\\(2048 \\times 2048\\)</span></p>'


def check_page(browser: Any, base: str, edition: str, page: str, shots: Path) -> list[str]:
    """Open one page in ``browser``: its DOM against its notebook (the front page has none), every formula typeset
    by MathJax, no table or code block wider than the column, and a screenshot that is not blank."""
    url = f"{base}/{edition}/{page}.html"
    name = f"{edition}/{page}"
    shot = shots / edition / f"{page}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    tab = browser.new_page(viewport={"width": VIEWPORT[0], "height": VIEWPORT[1]})
    try:
        tab.goto(url, wait_until="load", timeout=60_000)
        tab.wait_for_selector(COLUMN, timeout=60_000)
        untypeset = tab.evaluate(UNTYPESET_MATH)
        dom = tab.content()
        wide = wider_than_column(tab, COLUMN) or []
        tab.screenshot(path=str(shot))
    finally:
        tab.close()
    failures = [f"{name}: a {w['what']} runs past the column's right edge ({w['right']} > {w['edge']} px at "
                f"{VIEWPORT[0]} px): {w['text']!r}" for w in wide]
    if untypeset == -1:
        failures.append(f"{name}: MathJax did not load: its formulas show as TeX")
    elif untypeset:
        failures.append(f"{name}: {untypeset} formulas left as TeX by MathJax")
    if page != "index":
        blocks, figures, line = expected(ROOT / EDITIONS[edition][1] / f"{page}.ipynb")
        found_blocks = len(re.findall(r'class="cell_output', dom))
        found_figures = len(re.findall(r'<img[^>]+src="[^"]*_images/', dom))
        if found_blocks != blocks:
            failures.append(f"{name}: {found_blocks} output blocks on the page, the notebook stores {blocks}")
        if found_figures != figures:
            failures.append(f"{name}: {found_figures} figures on the page, the notebook stores {figures}")
        if line is not None and line not in page_text(dom):
            failures.append(f"{name}: the stored output {line!r} is not on the page")
    if not shot.exists():
        failures.append(f"{name}: no screenshot")
    elif (ink := ink_share(shot)) < MIN_INK:
        failures.append(f"{name}: the screenshot is blank ({ink:.1%} of its pixels not white)")
    return failures


# A page made to fail the width check: a table twice as wide as its column. If the check stops finding it (a
# theme's new markup, another browser), every page would pass unchecked.
CANARY = ('<article class="bd-article" style="width: 600px"><table style="width: 1200px"><tr><td>wide</td></tr>'
          '</table><pre>fits</pre></article>')


def check_pages(job: tuple[str, str, list[tuple[str, str]], Path]) -> list[str]:
    """In a worker process: open ``pages`` in one browser, after checking that the width and math checks find their
    canaries."""
    chromium, base, pages, shots = job
    failures = []
    with open_browser(chromium) as browser:
        tab = browser.new_page()
        tab.set_content(CANARY)
        caught = [w["what"] for w in wider_than_column(tab, COLUMN) or []]
        tab.set_content(MATH_CANARY)  # a formula and no MathJax: the math check must see it
        untypeset = tab.evaluate(UNTYPESET_MATH)
        tab.close()
        if caught != ["table"]:
            failures.append(f"the width check found {caught} on a page with one table too wide: it is broken")
        if untypeset != -1:
            failures.append(f"the math check found {untypeset} on a page with a formula and no MathJax: it is broken")
        for edition, page in pages:
            found = check_page(browser, base, edition, page, shots)
            print(f"{edition}/{page}: {'ok' if not found else 'FAILED'}", flush=True)
            failures.extend(found)
    return failures


def notebook_pages(edition: str) -> list[str]:
    folder = ROOT / EDITIONS[edition][1]
    return ["index"] + sorted(p.stem for p in folder.glob("[0-9][0-9]*.ipynb")) + sorted(
        f"solutions/{p.stem}" for p in (folder / "solutions").glob("[0-9][0-9]*.ipynb"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--html", type=Path, default=ROOT / "build" / "book" / "html")
    parser.add_argument("--editions", nargs="+", default=list(EDITIONS), choices=list(EDITIONS))
    parser.add_argument("--pages", nargs="+", help="notebook pages to open (default: all)")
    parser.add_argument("--screenshots", type=Path, default=ROOT / "build" / "book" / "screenshots")
    parser.add_argument("--skip-if-no-browser", action="store_true",
                        help="without Chromium, check the links only and say in a banner that pages were not opened")
    args = parser.parse_args(argv)
    if not (args.html / "index.html").exists():
        print(f"no book in {args.html}: run  make book", file=sys.stderr)
        return 1
    chromium = find_chromium()
    if chromium is None and not args.skip_if_no_browser:
        print(f"headless Chromium is needed: {INSTALL_HINT}", file=sys.stderr)
        return 1
    server, base = serve(args.html)
    failures: list[str] = []
    try:
        started = time.monotonic()
        checked, broken = crawl(base)
        print(f"links: {checked} internal URLs checked from {base}/index.html in {time.monotonic() - started:.1f} s, "
              f"{len(broken)} broken", flush=True)
        failures.extend(broken)
        if chromium is None:
            print("=" * 78 + "\nNOT RUN: the pages were not opened in a browser (no Chromium on this machine, and "
                  "it could not be installed).\nOnly the links were checked.\n" + "=" * 78, flush=True)
            return 1 if failures else 0
        jobs = [(edition, page) for edition in args.editions for page in (args.pages or notebook_pages(edition))]
        started = time.monotonic()
        halves = [(chromium, base, jobs[i::2], args.screenshots) for i in range(2)]  # two browsers: two cores
        with ProcessPoolExecutor(2) as pool:
            for found in pool.map(check_pages, halves):
                failures.extend(found)
        print(f"{len(jobs)} pages opened in {time.monotonic() - started:.0f} s", flush=True)
    finally:
        server.shutdown()
    for failure in failures:
        print(failure)
    print(f"{len(failures)} failure(s); screenshots in {args.screenshots}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
