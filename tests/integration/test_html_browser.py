"""The HTML report in a real browser (Debian's chromium, driven by Playwright; .ci/run installs
it, and no browser is downloaded): it loads with no console error and no request beyond the
file, the verdict and the step time are on screen without a click, every section is there, the
numbers on the page are `report --json`'s, the tables sort, shapes carry their number on hover,
it prints, and hostile names run nothing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES, shared_traces
from tests.conftest import run_cli as traceview
from tests.html_page import hostile_run

playwright = pytest.importorskip("playwright.sync_api", reason="needs playwright (the dev extra)")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: As root, in a closed network: no sandbox, and none of chromium's own background connections.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (.ci/run installs Debian's: apt-get install chromium)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


class Opened:
    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1280, "height": 800})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url, wait_until="load")

    def js(self, script: str, arg: Any = None) -> Any:
        return self.page.evaluate(script, arg)


def make(tmp_path: Path, *paths: Path) -> tuple[Path, dict[str, Any]]:
    out = tmp_path / "page.html"
    made = traceview("report", *map(str, paths), "--html", str(out), "--json")
    assert made.code == 0, made.err
    return out, json.loads(made.out)


def loads_cleanly(opened: Opened) -> None:
    assert opened.errors == [], opened.errors
    assert opened.requests == [opened.url], opened.requests  # nothing but the file itself
    assert opened.dialogs == []


#: A table's cells' exact values (data-v) by row's first cell and header.
TABLE = """(name) => {
  const t = document.querySelector(`table[data-table="${name}"]`);
  const heads = [...t.tHead.rows[0].cells].map(c => c.textContent.replace(/ [▲▼]$/, ''));
  return [...t.tBodies[0].rows].map(r => Object.fromEntries([...r.cells].map((c, i) =>
    [heads[i], c.hasAttribute('data-v') ? parseFloat(c.dataset.v) : c.textContent])));
}"""


def test_the_page_opens_offline_shows_the_verdict_and_holds_the_reports_numbers(
    browser: Any, tmp_path: Path
) -> None:
    out, report = make(tmp_path, SAMPLES / "pytorch" / "ddp")
    opened = Opened(browser, out)
    loads_cleanly(opened)
    page = opened.page
    # the verdict and the step time on screen on load, no click
    for selector in ("#headline", '[data-figure="step-ms"]'):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["y"] + box["height"] <= 800, (selector, box)
        assert page.locator(selector).is_visible()
    assert (
        page.locator('[data-figure="step-ms"]')
        .inner_text()
        .startswith(f"{report['summary']['step_ms']:.2f}")
    )
    assert "is the bottleneck" in page.locator("#headline").inner_text()
    sections = opened.js("() => [...document.querySelectorAll('section')].map(s => s.id)")
    assert sections == ["verdict", "step", "critical-path", "communication", "heatmap", "whatif",
                        "operators", "warnings"]  # fmt: skip
    for section in sections:
        assert page.locator(f"#{section} h2").is_visible()
        assert (
            section == "verdict"
            or page.locator(f"#{section} svg").count() > 0
            or (section == "warnings")
        )
    # the numbers in the browser are the report's
    breakdown = {r["phase"]: r["ms"] for r in opened.js(TABLE, "breakdown")}
    assert breakdown.pop("step") == pytest.approx(report["summary"]["step_ms"])
    assert breakdown == pytest.approx(report["summary"]["breakdown_ms"])
    ranks = {int(r["rank"]): r for r in opened.js(TABLE, "ranks")}
    for rank in report["ranks"]:
        assert ranks[rank["rank"]]["step"] == pytest.approx(rank["step_ms"])
        assert ranks[rank["rank"]]["backward"] == pytest.approx(rank["breakdown_ms"]["backward"])
    whatifs = {r["change"]: r["step ms"] for r in opened.js(TABLE, "whatif")}
    assert whatifs == pytest.approx({w["change"]: w["step_ms"] for w in report["whatif"]})
    # a shape's number on hover: the rank's backward bar says its ms
    title = opened.js(
        "() => [...document.querySelectorAll('#step svg rect title')].map(t => t.textContent)"
    )
    backward = report["ranks"][0]["breakdown_ms"]["backward"]
    assert f"rank 0 · backward {backward:.2f} ms" in " ".join(title), title[:5]
    # a click on a header sorts by the exact values, again reverses
    header = page.locator('table[data-table="operators"] th', has_text="self ms")
    header.click()
    down = [r["self ms"] for r in opened.js(TABLE, "operators")]
    assert down == sorted(down, reverse=True)
    header.click()
    up = [r["self ms"] for r in opened.js(TABLE, "operators")]
    assert up == sorted(up)
    # printed: no navigation, every section still there, and a PDF comes out
    page.emulate_media(media="print")
    assert not page.locator("nav").is_visible()
    assert all(page.locator(f"#{s}").is_visible() for s in sections)
    assert page.pdf()[:4] == b"%PDF"
    loads_cleanly(opened)


def test_hostile_names_are_shown_and_run_nothing(browser: Any, tmp_path: Path) -> None:
    out, _ = make(tmp_path, hostile_run(tmp_path))
    opened = Opened(browser, out)
    loads_cleanly(opened)
    assert opened.js("() => window.__pwned") is None
    assert opened.js("() => document.scripts.length") == 1
    assert opened.js("() => document.querySelectorAll('main img, main b b').length") == 0
    ops = [r["op"] for r in opened.js(TABLE, "operators")]
    shown = next(op for op in ops if op.startswith("mm"))
    assert shown.startswith("mm</script><script>window.__pwned=1</script><img src=x")
    assert "<b>bold</b>" in shown and "\x1b" not in shown
    groups = [r["group"] for r in opened.js(TABLE, "comm-by-group")]
    assert any(g.startswith("pg</script>") for g in groups)
    warnings = opened.page.locator("#warnings").inner_text()
    assert '<img src=x onerror="window.__pwned=3">' in warnings


@pytest.mark.parametrize(
    "trace", ["pytorch/hta_sampled_2rank", "pytorch/tracelens_mi300_ddp_resnet18"]
)
def test_shared_traces_open_cleanly_with_their_numbers(
    browser: Any, tmp_path: Path, trace: str
) -> None:
    out, report = make(tmp_path, shared_traces(trace))
    opened = Opened(browser, out)
    loads_cleanly(opened)
    breakdown = {r["phase"]: r["ms"] for r in opened.js(TABLE, "breakdown")}
    assert breakdown.pop("step") == pytest.approx(report["summary"]["step_ms"])
    assert breakdown == pytest.approx(report["summary"]["breakdown_ms"])
    assert opened.page.locator("#headline").is_visible()
