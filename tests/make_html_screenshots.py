"""The HTML report's screenshots in docs/img/html/ (docs/share.md shows them), one per section,
from real runs: the bundled DDP sample (2 ranks, gloo), the bundled memory sample, and a 2-stage
GPipe pipeline job run here under `traceview collect` with torchrun (its stage 1's forward
slowed); taken in Debian's chromium through Playwright, as the browser tests open the page.

    .venv/bin/python -m tests.make_html_screenshots
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import REPO, SAMPLES

OUT = REPO / "docs" / "img" / "html"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
PIPELINE = REPO / "tests" / "workloads" / "parallel" / "pipeline.py"


def traceview(*args: str | Path) -> None:
    subprocess.run([sys.executable, "-m", "traceview", *map(str, args)], check=True)


def pipeline_run(folder: Path) -> Path:
    run = folder / "pipeline"
    traceview(
        "collect", "-o", run, "--steps", "5", "--warmup", "2", "--no-report", "--",
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", PIPELINE,
        "--steps", "10", "--truth", folder / "truth", "--schedule", "gpipe", "--microbatches",
        "4", "--slow-stage", "1", "--slow-phase", "forward",
    )  # fmt: skip
    return run


def main() -> None:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        pages = {
            "ddp": [SAMPLES / "pytorch" / "ddp"],
            "memory": [SAMPLES / "pytorch" / "memory"],
            "pipeline": [pipeline_run(folder)],
        }
        wanted = {  # page -> its sections shown in the docs
            "ddp": ["verdict", "step", "critical-path", "communication", "heatmap", "whatif",
                    "operators", "warnings"],
            "memory": ["memory"],
            "pipeline": ["pipeline"],
        }  # fmt: skip
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
            for name, paths in pages.items():
                html = folder / f"{name}.html"
                traceview("report", *paths, "--html", html)
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                page.goto(html.as_uri(), wait_until="load")
                for section in wanted[name]:
                    page.locator(f"#{section}").screenshot(path=OUT / f"{section}.png")
                    print(OUT / f"{section}.png")
                page.close()
            browser.close()


if __name__ == "__main__":
    main()
