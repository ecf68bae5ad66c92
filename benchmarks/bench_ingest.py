#!/usr/bin/env python3
"""Ingest benchmark: traceview against the tools people use today, side by side.

Every loader runs on the same trace files, each measurement in a fresh subprocess:

  hta        Holistic Trace Analysis, TraceAnalysis(trace_dir=DIR), default backend (json)
  hta_ijson  the same with HTA's ijson backend (ParserBackend.IJSON_BATCH_AND_COMPRESS)
  tb         torch-tb-profiler 0.4.3, RunProfileData.parse() for every file
  json       plain json.loads of the decompressed bytes (the floor for Python parsers)
  traceview  `traceview ingest FILE... -o TMPDIR` (skipped, with a note, if not installed)

Two data sets, made by make_big_trace.py when missing: one single-rank trace of >= 100 MB and
an 8-rank set (per-set totals). For each loader and set: wall seconds of the load (median of
--repeat runs), MB/s (uncompressed trace bytes / s), events/s (traceEvents / s), peak RSS,
peak RSS / uncompressed bytes, and the RSS after imports (baseline) so the memory the data
itself needs (peak - baseline) can be read off.

    python benchmarks/bench_ingest.py --json bench-results.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
WORKER = HERE / "_ingest_worker.py"
MEASURE = HERE / "_measure.py"
sys.path.insert(0, str(HERE))
import make_big_trace as mbt  # noqa: E402

MB = mbt.MB
DEFAULT_SINGLE = mbt.DEFAULT_OUT_ROOT / "kineto-100mb-1rank"
DEFAULT_MULTI = mbt.DEFAULT_OUT_ROOT / "kineto-25mb-8rank"
ALL_LOADERS = ["hta", "hta_ijson", "tb", "json", "traceview"]


# ----------------------------------------------------------------------------- data sets
@dataclass
class DataSet:
    name: str
    dir: Path
    files: list[Path]
    uncompressed_bytes: int
    file_bytes: int
    events: int


def _trace_files(d: Path) -> list[Path]:
    files = sorted(
        p
        for p in d.iterdir()
        if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
    )
    return files


def _count(path: Path) -> tuple[int, int]:
    """(uncompressed bytes, number of traceEvents) of one trace file."""
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    n = len(json.loads(data)["traceEvents"])
    return len(data), n


def load_dataset(name: str, d: Path) -> DataSet:
    files = _trace_files(d)
    if not files:
        raise SystemExit(f"no trace files (*.json, *.json.gz) in {d}")
    info_path = d / mbt.INFO_NAME
    known: dict[str, dict[str, Any]] = {}
    if info_path.exists():
        info = json.loads(info_path.read_text())
        known = {Path(f["file"]).name: f for f in info.get("files", [])}
    unc = ev = 0
    for f in files:
        k = known.get(f.name)
        if k and "uncompressed_bytes" in k and "events" in k:
            unc += k["uncompressed_bytes"]
            ev += k["events"]
        else:
            b, n = _count(f)
            unc += b
            ev += n
    return DataSet(name, d, files, unc, sum(f.stat().st_size for f in files), ev)


def ensure_dataset(d: Path, target_mb: float, ranks: int, use_gzip: bool, generate: bool) -> None:
    if d.exists() and _trace_files(d):
        return
    if not generate:
        raise SystemExit(f"{d} has no traces; run make_big_trace.py or drop --no-generate")
    argv = ["--target-mb", str(target_mb), "--ranks", str(ranks), "-o", str(d)]
    if use_gzip:
        argv.append("--gzip")
    print(f"# generating {d}: make_big_trace.py {' '.join(argv)}", file=sys.stderr)
    if mbt.main(argv) != 0:
        raise SystemExit("make_big_trace.py failed")


def make_tiny_trace(out: Path) -> Path:
    """A small valid Kineto trace (the source's header, one step's first events, trailer):
    the baseline run of CLI loaders, whose RSS after imports cannot be read from outside."""
    src = mbt.parse_source(mbt.DEFAULT_SOURCE)
    keep = [e for e in src.events[:300]] + [e for e in src.events if mbt._section(e.d) == "meta"]
    body = "".join(e.sep + e.raw for e in keep)
    path = out / "rank0.pt.trace.json"
    path.write_text(src.head + body + src.tail)
    return path


# ----------------------------------------------------------------------------- loaders
@dataclass
class Loader:
    name: str
    title: str
    kind: str  # "python": _ingest_worker.py under `python`; "cli": a command template
    python: str = sys.executable
    argv: list[str] = field(default_factory=list)  # cli: template with {files} {outdir} {dir}
    skip_reason: str | None = None


def traceview_command(explicit: str | None) -> tuple[list[str] | None, str | None]:
    """The traceview ingest command template, or (None, why it is skipped)."""
    if explicit:
        return shlex.split(explicit), None
    candidates = [REPO_ROOT / ".venv" / "bin" / "traceview"]
    found = next((str(c) for c in candidates if c.exists()), None) or shutil.which("traceview")
    if not found:
        return None, "traceview is not installed (no .venv/bin/traceview, none on PATH)"
    try:
        r = subprocess.run([found, "ingest", "--help"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"`{found} ingest --help` failed: {e}"
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
        return None, f"`{found} ingest --help` exited {r.returncode}: {last[0][:200]}"
    return [found, "ingest", "{files}", "-o", "{outdir}"], None


def build_loaders(a: argparse.Namespace) -> dict[str, Loader]:
    py = a.competitor_python or sys.executable
    loaders = {
        "hta": Loader("hta", "HTA TraceAnalysis, default backend (json)", "python", py),
        "hta_ijson": Loader(
            "hta_ijson", "HTA TraceAnalysis, ijson backend (IJSON_BATCH_AND_COMPRESS)", "python", py
        ),
        "tb": Loader("tb", "torch-tb-profiler 0.4.3 RunProfileData.parse", "python", py),
        "json": Loader("json", "json.loads (decompressed bytes)", "python", py),
    }
    cmd, why = traceview_command(a.traceview_cmd)
    loaders["traceview"] = Loader(
        "traceview", "traceview ingest", "cli", argv=cmd or [], skip_reason=why
    )
    return loaders


# ----------------------------------------------------------------------------- one run
def run_process(argv: list[str], log_path: Path, timeout: float, cwd: Path) -> dict[str, Any]:
    """Run argv under _measure.py (wall, wait4 ru_maxrss, sampled process-tree RSS/PSS)."""
    res_path = log_path.with_suffix(".measure.json")
    res_path.unlink(missing_ok=True)
    with open(log_path, "wb") as log:
        p = subprocess.Popen(
            [sys.executable, str(MEASURE), str(res_path), "--", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the launcher's session: it and the loader
            p.wait()
            return {
                "rc": -9,
                "proc_s": timeout,
                "maxrss_kb": 0,
                "tree_rss_peak_kb": 0,
                "tree_pss_peak_kb": 0,
                "timed_out": True,
            }
    if not res_path.exists():
        return {
            "rc": p.returncode or -1,
            "proc_s": 0.0,
            "maxrss_kb": 0,
            "tree_rss_peak_kb": 0,
            "tree_pss_peak_kb": 0,
        }
    return json.loads(res_path.read_text())


def _peak_kb(r: dict[str, Any]) -> int:
    """Peak memory of the loader: its own high-water mark, or its process tree's PSS sum
    when it forked workers (whichever is larger)."""
    return max(r.get("maxrss_kb", 0), r.get("tree_pss_peak_kb", 0))


def wait_for_quiet(max_wait: float, threshold: float) -> tuple[float, float]:
    """Wait (up to max_wait s) until other processes use less than `threshold` cores.
    Returns (seconds waited, cores in use by others at the last look)."""
    t0 = time.monotonic()
    while True:
        b0 = _busy_s()
        time.sleep(1.0)
        others = (_busy_s() - b0) / 1.0
        waited = time.monotonic() - t0
        if others <= threshold or waited >= max_wait:
            return waited, others
        time.sleep(2.0)


def _busy_s() -> float:
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (f[0] + f[1] + f[2] + sum(f[5:8])) / os.sysconf("SC_CLK_TCK")


def _log_tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def measure_python(ld: Loader, ds: DataSet, work: Path, timeout: float) -> dict[str, Any]:
    res_path = work / f"{ld.name}-{ds.name}-result.json"
    res_path.unlink(missing_ok=True)
    log = work / f"{ld.name}-{ds.name}.log"
    argv = [ld.python, str(WORKER), ld.name, str(res_path), str(ds.dir), *map(str, ds.files)]
    r = run_process(argv, log, timeout, cwd=work)
    if r["rc"] != 0 or not res_path.exists():
        return {"ok": False, "rc": r["rc"], "error": _log_tail(log), **r}
    w = json.loads(res_path.read_text())
    peak = max(w["peak_rss_self_kb"], r.get("tree_pss_peak_kb", 0))
    return {"ok": True, **r, **w, "peak_rss_kb": peak}


def measure_cli(
    ld: Loader, ds: DataSet | None, files: list[Path], work: Path, timeout: float, tag: str
) -> dict[str, Any]:
    outdir = Path(tempfile.mkdtemp(prefix=f"{ld.name}-{tag}-out-", dir=work))
    shutil.rmtree(outdir)  # let the tool create it
    argv: list[str] = []
    for tok in ld.argv:
        if tok == "{files}":
            argv += [str(f) for f in files]
        else:
            argv.append(tok.replace("{outdir}", str(outdir)).replace("{dir}", str(files[0].parent)))
    log = work / f"{ld.name}-{tag}.log"
    r = run_process(argv, log, timeout, cwd=work)
    out_bytes = (
        sum(p.stat().st_size for p in outdir.rglob("*") if p.is_file()) if outdir.exists() else 0
    )
    shutil.rmtree(outdir, ignore_errors=True)
    res = {
        "ok": r["rc"] == 0,
        **r,
        "command": shlex.join(argv),
        "output_bytes": out_bytes,
        "peak_rss_kb": _peak_kb(r),
    }
    if r["rc"] != 0:
        res["error"] = _log_tail(log)
    return res


# ----------------------------------------------------------------------------- report
def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(
    ld: Loader, ds: DataSet, runs: list[dict[str, Any]], baseline: dict[str, Any] | None
) -> dict[str, Any]:
    ok_all = [r for r in runs if r.get("ok")]
    # runs during which other processes used the CPU are only used when there is no other
    ok = [r for r in ok_all if not r.get("disturbed")] or ok_all
    row: dict[str, Any] = {
        "loader": ld.name,
        "title": ld.title,
        "set": ds.name,
        "files": len(ds.files),
        "uncompressed_mb": ds.uncompressed_bytes / MB,
        "events": ds.events,
        "runs": runs,
        "n_ok": len(ok),
    }
    if not ok:
        row["error"] = runs[-1].get("error") if runs else "not run"
        return row
    if ld.kind == "python":
        load_s = _med([r["load_s"] for r in ok])
        base_kb = _med([r["baseline_rss_kb"] for r in ok])
    else:  # CLI: load = process wall minus the wall of the same command on a tiny trace
        startup = baseline["proc_s"] if baseline and baseline.get("ok") else 0.0
        load_s = _med([max(r["proc_s"] - startup, 1e-9) for r in ok])
        base_kb = baseline["peak_rss_kb"] if baseline and baseline.get("ok") else None
    peak_kb = _med([r["peak_rss_kb"] for r in ok])
    assert load_s is not None and peak_kb is not None
    row.update(
        {
            "load_s": load_s,
            "load_s_min": min(r.get("load_s", r["proc_s"]) for r in ok),
            "proc_s": _med([r["proc_s"] for r in ok]),
            "cpu_s": _med([r.get("user_s", 0.0) + r.get("sys_s", 0.0) for r in ok]),
            # cores' worth of CPU other processes used during the run (worst run)
            "others_cores_max": max(r.get("others_cores", 0.0) for r in ok),
            "n_disturbed": sum(1 for r in ok_all if r.get("disturbed")),
            "mb_per_s": ds.uncompressed_bytes / MB / load_s,
            "events_per_s": ds.events / load_s,
            "peak_rss_mb": peak_kb * 1024 / MB,
            "peak_x_file": peak_kb * 1024 / ds.uncompressed_bytes,
            "baseline_rss_mb": base_kb * 1024 / MB if base_kb is not None else None,
            "data_rss_mb": (peak_kb - base_kb) * 1024 / MB if base_kb is not None else None,
            "data_x_file": (peak_kb - base_kb) * 1024 / ds.uncompressed_bytes
            if base_kb is not None
            else None,
        }
    )
    return row


def markdown(
    rows: list[dict[str, Any]],
    datasets: list[DataSet],
    notes: list[str],
    command: str,
    env: dict[str, Any],
    repeat: int,
) -> str:
    out = [
        f"Command: `{command}`",
        "",
        f"Machine: {env['cpus']} CPUs, {env['mem_gb']:.0f} GB RAM, Python {env['python']}; "
        f"median of {repeat} runs, each in a fresh subprocess; MB = 10^6 bytes of "
        "uncompressed JSON.",
        "",
    ]
    for ds in datasets:
        out.append(
            f"- **{ds.name}**: {len(ds.files)} file(s) in `{ds.dir}`, "
            f"{ds.uncompressed_bytes / MB:.1f} MB uncompressed "
            f"({ds.file_bytes / MB:.1f} MB on disk), {ds.events:,} traceEvents"
        )
    out += [
        "",
        "| set | loader | load s | process s | process CPU s | MB/s | events/s | peak RSS MB "
        "| peak / file | baseline RSS MB | data RSS MB (peak - baseline) | data / file "
        "| runs used / made | others' CPU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(v: Any, fmt: str) -> str:
        return "–" if v is None else format(v, fmt)

    for r in rows:
        if r.get("skipped"):
            out.append(
                f"| {r['set']} | {r['loader']} | skipped: {r['skipped']} | | | | | | | | | | | |"
            )
            continue
        if "load_s" not in r:
            err = (r.get("error") or "").strip().splitlines()[-1:] or ["failed"]
            out.append(
                f"| {r['set']} | {r['loader']} | FAILED: {err[0][:120]} "
                f"| | | | | | | | | | 0/{len(r['runs'])} | |"
            )
            continue
        out.append(
            f"| {r['set']} | {r['loader']} | {r['load_s']:.2f} | {r['proc_s']:.2f} "
            f"| {r['cpu_s']:.2f} "
            f"| {r['mb_per_s']:.1f} | {r['events_per_s']:,.0f} | {r['peak_rss_mb']:,.0f} "
            f"| {r['peak_x_file']:.1f}× | {f(r['baseline_rss_mb'], ',.0f')} "
            f"| {f(r['data_rss_mb'], ',.0f')} | "
            f"{'–' if r['data_x_file'] is None else format(r['data_x_file'], '.1f') + '×'} "
            f"| {r['n_ok']}/{len(r['runs'])} | {r['others_cores_max']:.2f} |"
        )
    out.append("")
    out += [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def portable(text: str, work: Path, root: Path = REPO_ROOT) -> str:
    """``text`` without this machine's paths, for results that are committed: the scratch
    directory becomes WORKDIR, paths inside the repository relative ones, the home ~."""
    for path, name in (
        (str(work), "WORKDIR"),
        (f"{root}/", ""),
        (str(root), "."),
        (str(Path.home()), "~"),
    ):
        text = text.replace(path, name)
    return text


def environment(a: argparse.Namespace) -> dict[str, Any]:
    py = a.competitor_python or sys.executable
    code = (
        "import json,importlib.metadata as m\nv={}\n"
        "for p in ['HolisticTraceAnalysis','torch-tb-profiler','pandas','numpy','ijson']:\n"
        "    try: v[p]=m.version(p)\n    except Exception: v[p]=None\n"
        "try:\n    import ijson; v['ijson.backend']=ijson.backend\n"
        "except Exception: pass\nprint(json.dumps(v))"
    )
    try:
        versions = json.loads(
            subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120).stdout
        )
    except Exception:
        versions = {}
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "python": platform.python_version(),
        "competitor_python": py,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "mem_gb": mem,
        "loadavg_before": os.getloadavg(),
        "versions": versions,
    }


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--single",
        type=Path,
        default=DEFAULT_SINGLE,
        help="directory with the single-rank trace (default %(default)s)",
    )
    p.add_argument(
        "--multi",
        type=Path,
        default=DEFAULT_MULTI,
        help="directory with the multi-rank set (default %(default)s)",
    )
    p.add_argument("--sets", default="single,multi", help="which sets (default %(default)s)")
    p.add_argument(
        "--single-mb",
        type=float,
        default=100.0,
        help="size of the generated single-rank trace (MB, at least this)",
    )
    p.add_argument(
        "--multi-mb",
        type=float,
        default=25.0,
        help="size of each generated rank file of the multi-rank set",
    )
    p.add_argument("--multi-ranks", type=int, default=8)
    p.add_argument("--gzip", action="store_true", help="generate .json.gz data sets")
    p.add_argument(
        "--no-generate", action="store_true", help="fail instead of generating missing data sets"
    )
    p.add_argument(
        "--loaders",
        default=",".join(ALL_LOADERS),
        help="comma-separated subset of " + ",".join(ALL_LOADERS),
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--competitor-python",
        default=None,
        help="interpreter with HTA / torch-tb-profiler installed "
        "(default: the one running this script)",
    )
    p.add_argument(
        "--traceview-cmd",
        default=None,
        help='traceview command template, default "<.venv>/bin/traceview ingest '
        '{files} -o {outdir}"; {files} expands to the trace files, {outdir} '
        "to a fresh temporary run directory, {dir} to the data set directory",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    p.add_argument(
        "--disturbed-cores",
        type=float,
        default=0.3,
        help="a run during which other processes used more CPU than this (in cores) is "
        "'disturbed': it is repeated and left out of the medians (default %(default)s)",
    )
    p.add_argument(
        "--retries", type=int, default=2, help="extra tries for a disturbed run (default 2)"
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        help="before each run, wait up to this many seconds for the machine to be quiet",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="scratch directory for logs and traceview outputs (default: temp)",
    )
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    p.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    a = p.parse_args(argv)
    command = (
        shlex.join([sys.executable, *sys.argv])
        if argv is None
        else shlex.join([sys.executable, str(Path(__file__)), *argv])
    )

    wanted = [x.strip() for x in a.loaders.split(",") if x.strip()]
    bad = sorted(set(wanted) - set(ALL_LOADERS))
    if bad:
        p.error(f"unknown loaders {bad}")
    sets = [s.strip() for s in a.sets.split(",") if s.strip()]
    env = environment(a)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    work.mkdir(parents=True, exist_ok=True)

    datasets: list[DataSet] = []
    if "single" in sets:
        ensure_dataset(a.single, a.single_mb, 1, a.gzip, not a.no_generate)
        datasets.append(load_dataset("single", a.single))
    if "multi" in sets:
        ensure_dataset(a.multi, a.multi_mb, a.multi_ranks, a.gzip, not a.no_generate)
        datasets.append(load_dataset("multi", a.multi))

    loaders = build_loaders(a)
    notes = [
        "load s: the loader call inside the subprocess (after imports), median; for CLI "
        "loaders (traceview) the process wall minus the wall of the same command on a tiny "
        "trace. process s: the whole subprocess (interpreter start, imports, load, exit).",
        "MB/s and events/s use load s. peak RSS: the subprocess's own high-water mark "
        "(VmHWM / wait4 ru_maxrss from a small launcher), or, if larger, the peak PSS sum of "
        "its process tree sampled every 50 ms (HTA parses several ranks in a fork pool; PSS "
        "counts pages shared with forked workers once)."
        " baseline RSS: the subprocess's RSS after imports, before loading (for CLI loaders: "
        "peak RSS of the tiny-trace run).",
        "process CPU s: user + sys of the subprocess and its children (median). others' CPU: "
        "the CPU other processes used during the worst run kept, in cores (from /proc/stat, "
        "less the loader's and the launcher's own CPU time). Runs during which others used "
        "more than --disturbed-cores are repeated (--retries) and left out of the medians "
        "when an undisturbed run exists; the JSON keeps every run.",
        "hta / hta_ijson keep every rank's DataFrame (TraceAnalysis); tb and json drop each "
        "file's result before the next file; traceview writes Parquet to a fresh directory.",
    ]
    # warm the page cache so that no loader pays the first read
    for ds in datasets:
        for fpath in ds.files:
            with open(fpath, "rb") as fh:
                while fh.read(1 << 24):
                    pass

    baseline: dict[str, Any] | None = None
    tv = loaders["traceview"]
    if "traceview" in wanted and tv.skip_reason is None:
        tiny_dir = work / "tiny"
        tiny_dir.mkdir(exist_ok=True)
        tiny = make_tiny_trace(tiny_dir)
        # median of --repeat runs: the startup time is subtracted from every traceview run
        tiny_runs = [
            measure_cli(tv, None, [tiny], work, a.timeout, f"tiny-{i}") for i in range(a.repeat)
        ]
        good = [r for r in tiny_runs if r["ok"]]
        baseline = dict(good[len(good) // 2] if good else tiny_runs[-1])
        if good:
            baseline["proc_s"] = statistics.median(r["proc_s"] for r in good)
            baseline["peak_rss_kb"] = statistics.median(r["peak_rss_kb"] for r in good)
            baseline["runs"] = tiny_runs
        if not baseline["ok"]:
            last = (baseline.get("error") or "").strip().splitlines()[-1:] or ["no output"]
            notes.append(
                "traceview failed on the tiny trace, so its startup time and baseline RSS "
                f"are unknown (load s = process s): {last[0][:200]}"
            )
    if "traceview" in wanted and tv.skip_reason:
        notes.append(f"traceview skipped: {tv.skip_reason}")

    rows: list[dict[str, Any]] = []
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for ds in datasets:
        for rep in range(a.repeat):
            for name in wanted:  # round robin over loaders, so drift hits all alike
                ld = loaders[name]
                if ld.skip_reason:
                    continue
                for attempt in range(1 + a.retries):
                    waited, others = wait_for_quiet(a.quiet_wait, a.disturbed_cores)
                    if ld.kind == "python":
                        r = measure_python(ld, ds, work, a.timeout)
                    else:
                        r = measure_cli(ld, ds, ds.files, work, a.timeout, f"{ds.name}-{rep}")
                    r["others_cores"] = r.get("foreign_cpu_s", 0.0) / max(r["proc_s"], 1e-9)
                    r["others_cores_before"] = others
                    r["waited_for_quiet_s"] = waited
                    r["attempt"] = attempt
                    r["disturbed"] = r["others_cores"] > a.disturbed_cores
                    shown = (
                        f"load {r['load_s']:.2f}s" if "load_s" in r else f"proc {r['proc_s']:.2f}s"
                    )
                    print(
                        f"# {ds.name} {name} run {rep + 1}/{a.repeat}: "
                        f"{'ok' if r['ok'] else 'FAILED rc=' + str(r['rc'])} {shown} "
                        f"peak {r.get('peak_rss_kb', 0) * 1024 / MB:.0f} MB, "
                        f"others used {r['others_cores']:.2f} cores"
                        + (" (disturbed)" if r["disturbed"] else ""),
                        file=sys.stderr,
                        flush=True,
                    )
                    results.setdefault((ds.name, name), []).append(r)
                    if not r["disturbed"] or not r["ok"]:
                        break
        for name in wanted:
            ld = loaders[name]
            if ld.skip_reason:
                rows.append(
                    {"loader": name, "title": ld.title, "set": ds.name, "skipped": ld.skip_reason}
                )
                continue
            rows.append(summarize(ld, ds, results.get((ds.name, name), []), baseline))

    md = markdown(rows, datasets, notes, command, env, a.repeat)
    print(md)
    doc = {
        "command": command,
        "environment": env,
        "repeat": a.repeat,
        "datasets": [
            {
                "name": d.name,
                "dir": str(d.dir),
                "files": [str(f) for f in d.files],
                "uncompressed_bytes": d.uncompressed_bytes,
                "file_bytes": d.file_bytes,
                "events": d.events,
            }
            for d in datasets
        ],
        "traceview_baseline": baseline,
        "results": rows,
        "notes": notes,
        "markdown": md,
        "workdir": str(work),
    }
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(portable(json.dumps(doc, indent=1) + "\n", work))
        print(f"# results written to {a.json}", file=sys.stderr)
    if a.markdown:
        a.markdown.write_text(portable(md, work))
    failed = [r for r in rows if not r.get("skipped") and "load_s" not in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
