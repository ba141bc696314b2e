"""Time to interactive of the dashboard's table page, with the 3-D scatter lazy or drawn at once.

    .venv/bin/python bench/table_page_tti.py --url http://127.0.0.1:8000 --tables 2 4 [--runs 7]

Needs a running registry with the tables (``bash scripts/run.sh`` imports the shipped bundles)
and Debian's chromium (``CHROMIUM`` names another build, as for tests/frontend). Each table page
is loaded ``--runs`` times in a fresh 1280x900 headless context, twice per run:

* ``lazy``: the page as shipped: the scatter waits until scrolled near (figures.js ``data-lazy``);
* ``eager``: the same page with ``IntersectionObserver`` removed before it loads, where
  figures.js draws the scatter at once with the other figures, as it did before.

Per load, from the browser's own clocks (ms from navigation start): ``figures``, when every
figure the page draws at load has rendered; ``tti``, the end of the last long task (> 50 ms
main-thread work, ``PerformanceObserver('longtask')``) after the page settled 3 s (a
Lighthouse-style time to interactive: the first moment from which input is answered at
once), or DOMContentLoaded when there was none; ``tbt``, the total blocking time (the sum of
each long task's time beyond 50 ms). Printed: the median of each, per table and mode.
Headless chromium draws WebGL in software (SwiftShader), so a GPU desktop is faster in
absolute terms; the difference between the modes is the scatter's share.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-background-networking", "--no-first-run"]

OBSERVE = """
window.__long = [];
new PerformanceObserver(list => {
  for (const e of list.getEntries()) window.__long.push([e.startTime, e.duration]);
}).observe({type: 'longtask', buffered: true});
"""
EAGER = "delete window.IntersectionObserver;"
MEASURE = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const dcl = nav.domContentLoadedEventEnd;
  const ends = window.__long.map(([s, d]) => s + d);
  const tbt = window.__long.reduce((t, [s, d]) => t + Math.max(0, d - 50), 0);
  return {dcl, tti: Math.max(dcl, ...ends), tbt, longtasks: window.__long.length};
}"""
DRAWN = """(lazy) => [...document.querySelectorAll('[data-figure]')]
  .filter(d => document.getElementById(d.dataset.figure))
  .filter(d => !(lazy && d.hasAttribute('data-lazy')))
  .every(d => d.dataset.rendered)"""


def load(browser: Any, url: str, eager: bool) -> dict[str, float]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.add_init_script(OBSERVE + (EAGER if eager else ""))
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_function(DRAWN, arg=not eager, timeout=120_000)
    figures = page.evaluate("performance.now()")
    page.wait_for_timeout(3000)  # quiet window: any long task still to come is seen
    found = page.evaluate(MEASURE)
    if eager:
        assert page.get_attribute("#fig-points", "data-rendered") == "1"
    else:
        assert page.get_attribute("#fig-points", "data-rendered") is None
    context.close()
    return {"figures": figures, **found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--tables", type=int, nargs="+", required=True)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        print(
            "table  mode   figures_ms  tti_ms  tbt_ms  long_tasks  (medians of", args.runs, "runs)"
        )
        for pk in args.tables:
            url = f"{args.url}/tables/{pk}/"
            load(browser, url, eager=False)  # warm the server's table cache and the disk
            for mode in ("eager", "lazy"):
                runs = [load(browser, url, mode == "eager") for _ in range(args.runs)]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                print(
                    f"{pk:5d}  {mode:5s}  {med['figures']:10.0f}  {med['tti']:6.0f}  "
                    f"{med['tbt']:6.0f}  {med['longtasks']:10.1f}"
                )
        browser.close()


if __name__ == "__main__":
    main()
