"""The reports in a real browser: headless Chromium at a desktop's and a phone's width.

In the browser, not in the HTML text: every image loaded (naturalWidth > 0), nothing is wider than
the screen except inside a table's own scrolling box, a phone lays the page out at its own width
(the viewport meta), figures use the width they have, and the console stays free of errors. Full-page
screenshots are kept under $ATTNRES_ARTIFACTS (else a temporary folder) for a person to look at.

Chromium is Debian's `chromium` package, driven through Playwright with `executable_path` (its own
browser downloads are never used). Outside CI a machine without Chromium skips with the reason;
in CI (CI=true) a missing Chromium fails, so the check cannot silently stop running.
"""

import copy
import os
import shutil
from pathlib import Path

import pytest

from attnres.cli import main
from attnres.report.compare_report import write_report
from attnres.report.document import TABLE_CONTAINER
from attnres.report.scaling_report import write_scaling_report
from tests.report.test_compare_report import make_results
from tests.report.test_scaling_report import make_results as make_scaling_results

CHROMIUM_NAMES = ("chromium", "chromium-browser")
# Chromium as root needs --no-sandbox; the rest keep it from reaching out on a closed network.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
WIDTHS = {"desktop": {"viewport": {"width": 1280, "height": 900}},
          "phone": {"viewport": {"width": 420, "height": 860}, "is_mobile": True, "has_touch": True}}
LOAD_TIMEOUT_MS = 60_000

# Run in the page: what a person would see as broken. Elements inside a table's scrolling box may be
# wider than the screen (that box scrolls); anything else reaching past the right edge widens the page.
INSPECT = """(container) => {
  const width = window.innerWidth;
  const images = [...document.images].map(img => ({src: img.getAttribute("src"), loaded: img.complete,
      natural: img.naturalWidth, shown: img.getBoundingClientRect().width,
      room: img.parentElement.getBoundingClientRect().width}));
  const overflowing = [...document.body.querySelectorAll("*")]
      .filter(el => !el.closest("." + container) && el.getBoundingClientRect().right > width + 0.5)
      .map(el => el.tagName.toLowerCase() + (el.className ? "." + el.className : "") + ": "
                 + (el.textContent || el.getAttribute("src") || "").slice(0, 60));
  const boxes = [...document.querySelectorAll("." + container)].map(box => ({
      fits: box.getBoundingClientRect().right <= width + 0.5, scrolls: box.scrollWidth > box.clientWidth,
      table: !!box.querySelector("table")}));
  return {width, pageWidth: document.documentElement.scrollWidth, images, overflowing, boxes,
          tables: document.querySelectorAll("table").length};
}"""


def chromium_or_skip() -> str:
    """The Chromium executable; a skip outside CI when there is none, a failure in CI."""
    path = next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)
    try:
        import playwright.sync_api  # noqa: F401  (pinned in requirements/test.txt)
    except ImportError:
        missing = "the playwright package (requirements/test.txt)"
    else:
        missing = None if path else "Chromium (apt-get install -y chromium)"
    if missing is None:
        return path
    if os.environ.get("CI") == "true":
        pytest.fail(f"{missing} is required in CI for the browser test; .ci/run installs it")
    pytest.skip(f"{missing} is not installed; the browser test needs it")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """Where screenshots go: $ATTNRES_ARTIFACTS/browser, else a temporary folder (printed)."""
    root = os.environ.get("ATTNRES_ARTIFACTS")
    folder = Path(root) / "browser" if root else tmp_path_factory.mktemp("browser-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def compare_page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("compare-report")
    write_report(copy.deepcopy(make_results()), out)
    return out / "index.html"


@pytest.fixture(scope="module")
def scaling_page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scaling-report")
    write_scaling_report(make_scaling_results(replicates=20), out)
    return out / "index.html"


@pytest.fixture
def analyze_page(runs, cache, tmp_path) -> Path:
    _, dirs = runs
    out = tmp_path / "analyze-report"
    assert main(["analyze", str(dirs["block_attnres"]), str(dirs["standard"]), "--out", str(out),
                 "--max-batches", "1"]) == 0
    return out / "index.html"


def inspect_in_chromium(page_path: Path, name: str, artifacts: Path) -> dict:
    """Open `page_path` at every width of WIDTHS; returns {width name: INSPECT's findings + "errors"}."""
    from playwright.sync_api import sync_playwright

    executable = chromium_or_skip()
    found = {}
    with sync_playwright() as playwright:
        # launch() gives the browser a fresh temporary profile (--user-data-dir) of its own
        browser = playwright.chromium.launch(executable_path=executable, args=FLAGS, headless=True)
        try:
            for width, options in WIDTHS.items():
                context = browser.new_context(**options)
                page = context.new_page()
                errors = []
                page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.on("requestfailed", lambda request: errors.append(f"failed to load {request.url}"))
                page.goto(page_path.resolve().as_uri(), wait_until="load", timeout=LOAD_TIMEOUT_MS)
                found[width] = {**page.evaluate(INSPECT, TABLE_CONTAINER), "errors": errors}
                shot = artifacts / f"{name}-{options['viewport']['width']}.png"
                page.screenshot(path=str(shot), full_page=True)
                print(f"screenshot: {shot}")
                context.close()
        finally:
            browser.close()
    return found


def assert_looks_right(found: dict) -> None:
    for width, page in found.items():
        assert page["errors"] == [], (width, page["errors"])
        assert page["images"], width
        for image in page["images"]:
            assert image["loaded"] and image["natural"] > 0, (width, image)
            # a figure takes the room it has, up to 640 px: never shrunk below what it could show
            assert image["shown"] >= min(image["natural"], 640, image["room"]) - 2, (width, image)
        assert page["overflowing"] == [], (width, page["overflowing"][:5])
        assert page["pageWidth"] <= page["width"], width  # no page-wide horizontal scrollbar
        assert len(page["boxes"]) == page["tables"] and all(box["table"] and box["fits"] for box in page["boxes"])
    assert found["phone"]["width"] == 420  # laid out at the phone's width, not a shrunken desktop page
    assert found["desktop"]["width"] == 1280


def test_compare_report_in_a_browser(compare_page, artifacts):
    found = inspect_in_chromium(compare_page, "compare", artifacts)
    assert_looks_right(found)
    assert len(found["desktop"]["images"]) == 6
    # the results table is wider than a phone: it scrolls in its box instead of widening the page
    assert any(box["scrolls"] for box in found["phone"]["boxes"])


def test_analyze_report_in_a_browser(analyze_page, artifacts):
    found = inspect_in_chromium(analyze_page, "analyze", artifacts)
    assert_looks_right(found)
    assert len(found["desktop"]["images"]) == 6  # 4 depth profiles, 1 heatmap, 1 cosine figure


def test_scaling_report_in_a_browser(scaling_page, artifacts):
    found = inspect_in_chromium(scaling_page, "scaling", artifacts)
    assert_looks_right(found)
    assert len(found["desktop"]["images"]) == 3  # loss against compute, advantage, loss against parameters
    assert any(box["scrolls"] for box in found["phone"]["boxes"])  # the fit tables scroll on a phone


def test_a_missing_chromium_skips_here_and_fails_in_ci(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Chromium .* not installed"):
        chromium_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required in CI"):
        chromium_or_skip()
