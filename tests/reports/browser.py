"""The HTML report as a person sees it: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium) at 1280x800, one screenshot of the first screen, and the
checks of what that screen shows.

``Browser().look(html, report, shot)`` loads a report, saves the screenshot and returns the
problems a person would have with it (an empty list: none):

* each ``FIRST_SCREEN`` entry that applies to the report is on the first screen, whole and visible
  (the verdict, and for a failing report what failed, before any passing row); an entry with an
  anchor (``at``) is on the first screen of its section, after a jump to that anchor (the atlas's
  first row below its title);
* the page does not scroll sideways;
* every table shown (not folded away) is readable at that width: inside the viewport, text of at
  least ``MIN_FONT_PX``, no cell whose text is cut off;
* the browser's console has no error.

Adding what a new section must show on the first screen is one line in ``FIRST_SCREEN``, e.g.
``Seen("the disagreement atlas", "#disagreement-atlas")``.

Cost: starting the browser about 1.5 s, a page 0.2-1.5 s (smoke to nightly-sized).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from moe_fq_parity.reports.schema import overall_verdict

VIEWPORT = (1280, 800)
"""A laptop's browser window: what a person sees without scrolling."""
MIN_FONT_PX = 11.0
"""The smallest text a table may use (the report's monospace cells are 12 px)."""
ROWS_CHECKED = 40
"""The rows of each table whose cells are checked for small or cut-off text (a column keeps its
style; checking every cell of the nightly's 1,041 MoE rows costs seconds)."""
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver", "chromium-driver")


def failing(report: dict[str, Any]) -> bool:
    return overall_verdict(report) == "fail"


def always(report: dict[str, Any]) -> bool:
    return True


@dataclass(frozen=True)
class Seen:
    """Something a person must see on the first screen: the element of ``selector`` (the first one)
    lies whole inside the viewport, displayed; ``text(report)``, when given, is a regular expression
    its text must match; ``when(report)`` says whether the report has it."""

    what: str
    selector: str
    when: Callable[[dict[str, Any]], bool] = always
    text: Optional[Callable[[dict[str, Any]], str]] = None
    at: str = ""
    """An anchor to jump to first (``#section-atlas``): the element is on that section's first screen."""


def has_section(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda report: any(s["name"] == name and s["rows"] and s["verdict"] != "skip" for s in report["sections"])


FIRST_SCREEN: tuple[Seen, ...] = (
    Seen("the verdict", "h1 .badge", text=lambda report: overall_verdict(report).upper()),
    Seen("what failed", "#failures h2", when=failing),
    Seen("the first failing case with its first check", "#failures tr.fail td.msg div", when=failing),
    Seen("the disagreement atlas's first pair", "#section-atlas ~ table tr.pass", when=has_section("atlas"), at="#section-atlas",
         text=lambda report: next(r["fields"]["a"] for s in report["sections"] if s["name"] == "atlas" for r in s["rows"] if r["verdict"] == "pass")),
)
"""What the first screen shows a person, in one line each (see the module docstring)."""

_MEASURE = """
const [selectors, minFont, rowsChecked] = arguments;
// shown: rendered (not in a closed <details>, not display:none or visibility:hidden) with a size
const box = el => { const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
    shown: r.width > 0 && r.height > 0 && el.checkVisibility({contentVisibilityAuto: true, visibilityProperty: true})}; };
const doc = document.documentElement, vh = window.innerHeight;
const first = {};
for (const s of selectors) { const el = document.querySelector(s); first[s] = el ? {...box(el), text: el.innerText} : null; }
const order = {};
for (const s of ['#failures', 'details.passing']) { const el = document.querySelector(s); order[s] = el ? box(el).top : null; }
const tables = [];
for (const t of document.querySelectorAll('table')) {
  const b = box(t);
  if (!b.shown) continue;
  let small = null, cut = null;
  for (const row of Array.from(t.rows).slice(0, rowsChecked)) for (const c of row.cells) {  // a table's columns repeat their style
    if (!box(c).shown) continue;
    const px = parseFloat(getComputedStyle(c).fontSize);
    if (px < minFont && small === null) small = [c.innerText.slice(0, 40), px];
    if (c.scrollWidth > c.clientWidth + 1 && cut === null) cut = c.innerText.slice(0, 40);
  }
  tables.push({top: b.top, right: b.right, head: t.rows.length ? t.rows[0].innerText.slice(0, 40) : '', small: small, cut: cut});
}
return {width: doc.clientWidth, scrollWidth: doc.scrollWidth, height: vh, first: first, order: order, tables: tables};
"""


def find_chromium() -> Optional[tuple[str, str]]:
    """``(browser, driver)`` paths of a Chromium and its WebDriver, or ``None``."""
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = next((p for p in map(shutil.which, DRIVERS) if p), None)
    return (browser, driver) if browser and driver else None


class Browser:
    """One headless Chromium for many pages (a context manager; ``close`` ends it)."""

    def __init__(self) -> None:
        from selenium import webdriver  # deferred: the test extra's Selenium, only where a browser runs
        from selenium.webdriver.chrome.service import Service

        found = find_chromium()
        if found is None:
            raise RuntimeError("no Chromium with its driver: apt-get install -y chromium chromium-driver")
        options = webdriver.ChromeOptions()
        options.binary_location = found[0]
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=found[1]))  # a path: no driver download
        self.driver.set_page_load_timeout(120)
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                    {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False})

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.driver.quit()

    def open(self, html: Path) -> None:
        """Show ``html`` (loaded only when another page is showing: a page is read once for many looks)."""
        uri = html.resolve().as_uri()
        if self.driver.current_url != uri:
            self.driver.get_log("browser")  # drop what an earlier page logged
            self.driver.get(uri)

    def look(self, html: Path, report: dict[str, Any], shot: Optional[Path] = None, plant: Optional["Plant"] = None) -> list[str]:
        """Show ``html`` (the page of ``report``) at its top, with ``plant`` put in for this look
        only; save the first screen to ``shot`` (PNG; none: no screenshot) and return what a person
        would see wrong there (module docstring), one line each."""
        self.open(html)
        self.driver.execute_script("window.scrollTo(0, 0);")
        if plant is not None:
            plant.put(self.driver)
        try:
            return self._problems(report, shot)
        finally:
            self.driver.execute_script("for (const el of document.querySelectorAll('[data-planted]')) el.remove(); window.scrollTo(0, 0);")

    def _problems(self, report: dict[str, Any], shot: Optional[Path]) -> list[str]:
        problems = []
        for s in [s for s in FIRST_SCREEN if s.when(report) and s.at]:  # on the first screen of its section
            self.driver.execute_script("const el = document.querySelector(arguments[0]); if (el) el.scrollIntoView(true);", s.at)
            problems += _seen_problems([s], self.driver.execute_script(_MEASURE, [s.selector], MIN_FONT_PX, 0), report)
            self.driver.execute_script("window.scrollTo(0, 0);")
        seen = [s for s in FIRST_SCREEN if s.when(report) and not s.at]
        m = self.driver.execute_script(_MEASURE, [s.selector for s in seen], MIN_FONT_PX, ROWS_CHECKED)
        if shot is not None:
            self.driver.save_screenshot(str(shot))
        problems += _seen_problems(seen, m, report)
        if failing(report):
            fail_top, pass_top = m["order"]["#failures"], m["order"]["details.passing"]
            if fail_top is None or (pass_top is not None and pass_top < fail_top):
                problems.append(f"the passing rows (top {pass_top} px) come before what failed (top {fail_top} px)")
        if m["scrollWidth"] > m["width"]:
            problems.append(f"the page scrolls sideways: {m['scrollWidth']} px wide in a {m['width']} px window")
        for t in m["tables"]:
            if t["right"] > m["width"]:
                problems.append(f"a table ({t['head']!r}, top {t['top']:.0f} px) is wider than the window: right edge {t['right']:.0f} px")
            if t["small"] is not None:
                problems.append(f"a table ({t['head']!r}, top {t['top']:.0f} px) has {t['small'][1]:.1f} px text ({t['small'][0]!r}): "
                                f"under {MIN_FONT_PX:g} px")
            if t["cut"] is not None:
                problems.append(f"a table ({t['head']!r}, top {t['top']:.0f} px) cuts off the text of a cell ({t['cut']!r})")
        for entry in self.driver.get_log("browser"):
            if entry.get("level") == "SEVERE":
                problems.append(f"console error: {entry.get('message', '')[:200]}")
        return problems


def _seen_problems(seen: list[Seen], m: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """The ``Seen`` entries of ``seen`` that ``m`` (a ``_MEASURE``) does not show whole on the screen."""
    problems = []
    for s in seen:
        box = m["first"][s.selector]
        where = f"the first screen of {s.at}" if s.at else "the first screen"
        if box is None or not box["shown"]:
            problems.append(f"{s.what} ({s.selector}) is not on the page")
        elif box["top"] < 0 or box["bottom"] > m["height"] or box["left"] < 0 or box["right"] > m["width"]:
            problems.append(f"{s.what} ({s.selector}) is not on {where}: top {box['top']:.0f} px, bottom "
                            f"{box['bottom']:.0f} px of {m['height']}")
        elif s.text is not None and not re.search(re.escape(s.text(report)), box["text"]):
            problems.append(f"{s.what} ({s.selector}) says {box['text'][:60]!r}, not {s.text(report)!r}")
    return problems


@dataclass(frozen=True)
class Plant:
    """A layout bug put into the page shown, for one look (``Browser.look``): a CSS rule (``css``),
    HTML at the end of the body (``html``) or a script run in the page (``script``)."""

    css: str = ""
    html: str = ""
    script: str = ""

    def put(self, driver: Any) -> None:
        driver.execute_script("""
            const [css, html, script] = arguments;
            if (css) { const st = document.createElement('style'); st.dataset.planted = '1'; st.textContent = css; document.head.append(st); }
            if (html) { const d = document.createElement('div'); d.dataset.planted = '1'; d.innerHTML = html; document.body.append(d); }
            if (script) { new Function(script)(); }""", self.css, self.html, self.script)
