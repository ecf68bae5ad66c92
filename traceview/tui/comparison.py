"""Compare: two runs side by side, phases and top operators, with ratios against the first."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from traceview.model.results import Comparison
from traceview.tui.render import ms, phase_text, ratio_text, untrusted

HINT = (
    "Compare needs two runs: traceview tui RUN_A RUN_B (run directories or folders of traces),"
    " or traceview tui FILES... --compare FILES..."
)


def _letter(i: int) -> str:
    return chr(ord("A") + i)


class ComparePane(VerticalScroll):
    can_focus = True

    DEFAULT_CSS = """
    ComparePane DataTable { height: auto; margin: 0 0 1 0; }
    """

    def compose(self) -> ComposeResult:
        yield Static(HINT, id="compare-summary", markup=False)
        yield DataTable(id="compare-runs", show_cursor=False)
        yield DataTable(id="compare-phases", show_cursor=False)
        yield DataTable(id="compare-ops", show_cursor=False)

    def on_mount(self) -> None:
        for table in self.query(DataTable):
            table.display = False

    def show(self, comparison: Comparison | None) -> None:
        if comparison is None:
            return
        runs = comparison.runs
        letters = [_letter(i) for i in range(len(runs))]
        summary = Text()
        for letter, run in zip(letters, runs, strict=True):
            summary.append(f"{letter} ", style="bold")
            summary.append_text(untrusted(run.label, 60))
            summary.append(" (baseline)\n" if letter == "A" else "\n")
        for line in comparison.highlights:
            summary.append("▸ ", style="bold")
            summary.append_text(untrusted(line, 200))
            summary.append("\n")
        if not comparison.highlights:
            summary.append(
                "nothing notable: no phase or operator 1.5× apart that takes a notable share"
                " of the step\n",
                style="bright_black",
            )
        summary.append("ms per step (mean of ranks); ratios against A", style="bright_black")
        self.query_one("#compare-summary", Static).update(summary)

        table = self.query_one("#compare-runs", DataTable)
        table.add_columns("run", "ranks", "steps", "step ms", "ratio", "bottleneck", "hidden")
        for letter, run in zip(letters, runs, strict=True):
            table.add_row(
                Text(letter, style="bold"),
                Text(str(run.ranks), justify="right"),
                Text(str(run.steps), justify="right"),
                Text(ms(run.step_ms), justify="right"),
                ratio_text(run.step_ratio),
                phase_text(run.bottleneck) if run.bottleneck else Text("-"),
                Text(run.hidden),
            )
        self._values(
            "#compare-phases", "phase", letters,
            [(phase_text(p.phase), p.ms, p.ratio) for p in comparison.phases],
        )  # fmt: skip
        self._values(
            "#compare-ops", "operator", letters,
            [(untrusted(o.op, 28), o.ms, o.ratio) for o in comparison.ops],
        )  # fmt: skip
        for table in self.query(DataTable):
            table.display = True

    def _values(
        self,
        selector: str,
        first: str,
        letters: list[str],
        rows: list[tuple[Text, list[float], list[float | None]]],
    ) -> None:
        table = self.query_one(selector, DataTable)
        table.add_column(first)
        for letter in letters:
            table.add_column(f"{letter} ms")
        for letter in letters[1:]:
            table.add_column(f"{letter}/A")
        for name, values, ratios in rows:
            table.add_row(
                name,
                *(Text(ms(v), justify="right") for v in values),
                *(ratio_text(r) for r in ratios[1:]),
            )
