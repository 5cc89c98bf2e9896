"""The marginal-utility report of a sweep: metric vs amount of HSK, and store size per example.

Reads the results table of `pipelines.sweep.results` (one row per run). Only pyarrow and matplotlib
(no pandas, no pyplot state: figures are built with matplotlib.figure.Figure so the report works
headless and inside notebooks alike).
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from matplotlib.figure import Figure

from hskstore.io.outputs import mark_output, staged_replace
from pipelines.core.output_kinds import REPORT
from pipelines.sweep.results import ResultsError, conform, read_results

REFERENCE_KINDS = ("pred_only", "full", "no_kd")
KIND_ORDER = {"no_kd": 0, "pred_only": 1, "hsk": 2, "full": 3}
KIND_LABELS = {"pred_only": "prediction KD only (no HSK)", "full": "full HSK", "no_kd": "no KD (labels only)"}
KIND_STYLES = {"pred_only": ("--", "tab:gray"), "full": (":", "black"), "no_kd": ("-.", "tab:red")}
DTYPE_STYLES = {"float16": ("-", "o"), "int8": ("--", "s"), "int4": (":", "D"), "mxfp4": ("-.", "v")}


def _rows(results: pa.Table | str | os.PathLike) -> list[dict]:
    table = conform(results) if isinstance(results, pa.Table) else read_results(results)
    return table.to_pylist()


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _stats(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,  # sample std over seeds
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def _pick_metric(rows: list[dict], metric: str | None) -> str:
    names = Counter(r["metric_name"] for r in rows if r["metric_name"] and _finite(r["metric"]))
    if not names:
        raise ResultsError("the results table has no run with a metric yet")
    if metric is None:  # the metric most runs report (ties: alphabetical, so the choice is stable)
        return sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    if metric not in names:
        raise ResultsError(f"no run reports metric {metric!r}; the table has {sorted(names)}")
    return metric


def _name(r: dict, key: str, missing: str = "?") -> str:
    return r[key] or missing


def marginal_utility_data(results: pa.Table | str | os.PathLike, *, metric: str | None = None) -> dict:
    """The numbers the plot draws: per (value dtype, student) line, per reference kind, store bytes."""
    rows = _rows(results)
    metric = _pick_metric(rows, metric)
    used = [r for r in rows if r["metric_name"] == metric and _finite(r["metric"])]
    hsk = [r for r in used if r["kind"] == "hsk" and _finite(r["amount_hsk"]) and r["amount_hsk"] > 0]
    several = len({_name(r, "student") for r in used}) > 1
    references = _references(used, several)
    return {"metric": metric, "lines": _hsk_lines(hsk, several), "references": references,
            "bytes": _bytes_lines(hsk), "n_runs": len(used),
            "skipped": len(rows) - len(hsk) - sum(r["n"] for r in references)}


def _hsk_lines(hsk: list[dict], several_students: bool) -> list[dict]:
    """One line per (value dtype, student): the metric over seeds at each amount of HSK."""
    groups: dict[tuple[str, str], dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in hsk:
        groups[(_name(r, "value_dtype"), _name(r, "student"))][r["amount_hsk"]].append(r)
    return [_hsk_line(dtype, student, by_amount, several_students)
            for (dtype, student), by_amount in sorted(groups.items())]


def _hsk_line(dtype: str, student: str, by_amount: dict[float, list[dict]], several_students: bool) -> dict:
    label = f"{student}, HSK from a {dtype} store" if several_students else f"HSK ({dtype} store)"
    line = {"value_dtype": dtype, "student": student, "label": label,
            "amount": [], "mean": [], "std": [], "min": [], "max": [], "n": [], "configs": []}
    for amount in sorted(by_amount):
        runs = by_amount[amount]
        s = _stats([r["metric"] for r in runs])
        line["amount"].append(amount)
        for key in ("mean", "std", "min", "max", "n"):
            line[key].append(s[key])
        # Configs of equal A (e.g. 1,9,0.1 and 3,3,0.1) share a point: the mean over all their runs.
        line["configs"].append(sorted({_name(r, "config") for r in runs}))
    return line


def _references(used: list[dict], several_students: bool) -> list[dict]:
    """One horizontal reference per (kind, student): pred-only, full, no-kd."""
    refs = defaultdict(list)
    for r in used:
        if r["kind"] in REFERENCE_KINDS:
            refs[(r["kind"], _name(r, "student"))].append(r)
    ordered = sorted(refs.items(), key=lambda kv: (KIND_ORDER[kv[0][0]], kv[0][1]))
    return [_reference(kind, student, runs, several_students) for (kind, student), runs in ordered]


def _reference(kind: str, student: str, runs: list[dict], several_students: bool) -> dict:
    label = KIND_LABELS[kind] + (f", {student}" if several_students else "")
    bpe = [r["bytes_per_example"] for r in runs if _finite(r["bytes_per_example"])]
    return {"kind": kind, "student": student, "label": label,
            "bytes_per_example": statistics.fmean(bpe) if bpe else None,
            **_stats([r["metric"] for r in runs])}


def _bytes_lines(hsk: list[dict]) -> list[dict]:
    """Store bytes per example against amount: one curve per value dtype (size depends on neither student nor seed)."""
    sizes: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in hsk:
        if _finite(r["bytes_per_example"]):
            sizes[_name(r, "value_dtype")][r["amount_hsk"]].append(r["bytes_per_example"])
    return [
        {"value_dtype": dtype, "amount": sorted(by_amount),
         "bytes_per_example": [statistics.fmean(by_amount[a]) for a in sorted(by_amount)]}
        for dtype, by_amount in sorted(sizes.items())
    ]


def plot_marginal_utility(results: pa.Table | str | os.PathLike, out_png: str | os.PathLike, *,
                          metric: str | None = None) -> dict:
    """Plot metric vs amount of HSK (log x; mean over seeds, min-max band) over store bytes per example.

    Returns the plotted data (see `marginal_utility_data`) with "png" set to the written file.
    """
    data = marginal_utility_data(results, metric=metric)
    fig = Figure(figsize=(8.5, 8), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.4])
    colors = {s: f"C{i}" for i, s in enumerate(sorted({ln["student"] for ln in data["lines"]}))}
    _draw_hsk_lines(top, data, colors)
    _draw_references(top, data, colors)
    _style_metric_axis(top, data)
    _draw_store_sizes(bottom, data)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    data["png"] = str(out_png)
    return data


def _draw_hsk_lines(ax, data: dict, colors: dict[str, str]) -> None:
    for line in data["lines"]:
        style, marker = DTYPE_STYLES.get(line["value_dtype"], ("-", "^"))
        color = colors[line["student"]]
        ax.plot(line["amount"], line["mean"], linestyle=style, marker=marker, color=color,
                label=line["label"] + " (mean over seeds)")
        if max(line["n"]) > 1:
            ax.fill_between(line["amount"], line["min"], line["max"], color=color, alpha=0.15, linewidth=0)
    if len(data["lines"]) == 1 and len(data["lines"][0]["amount"]) <= 12:  # room to name each config
        line = data["lines"][0]
        for x, y, cfgs in zip(line["amount"], line["mean"], line["configs"], strict=True):
            ax.annotate(" / ".join(cfgs), (x, y), textcoords="offset points", xytext=(4, -11), fontsize=7,
                        color="0.3")


def _draw_references(ax, data: dict, colors: dict[str, str]) -> None:
    several_students = len({ref["student"] for ref in data["references"]} | set(colors)) > 1
    for ref in data["references"]:
        style, color = KIND_STYLES[ref["kind"]]
        if several_students and ref["student"] in colors:
            color = colors[ref["student"]]
        ax.axhline(ref["mean"], linestyle=style, color=color, linewidth=1.3,
                   label=f"{ref['label']}: {ref['mean']:.4g} (n={ref['n']})")
        if ref["n"] > 1:
            ax.axhspan(ref["min"], ref["max"], color=color, alpha=0.07, linewidth=0)


def _style_metric_axis(ax, data: dict) -> None:
    ax.set_xscale("log")
    if not data["lines"]:
        ax.set_xlim(0.1, 1000)
    ax.set_ylabel(f"dev {data['metric']}\n(band: min-max over seeds)")
    ax.set_title(f"Marginal utility of hidden-state knowledge: dev {data['metric']} vs amount of HSK\n"
                 f"{data['n_runs']} runs", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def _draw_store_sizes(ax, data: dict) -> None:
    for size in data["bytes"]:
        style, marker = DTYPE_STYLES.get(size["value_dtype"], ("-", "^"))
        ax.plot(size["amount"], size["bytes_per_example"], linestyle=style, marker=marker, color="0.25",
                label=f"HSK store, {size['value_dtype']} values")
    sized = [ref for ref in data["references"] if ref["bytes_per_example"]]
    for ref in sized:
        style, color = KIND_STYLES[ref["kind"]]
        ax.axhline(ref["bytes_per_example"], linestyle=style, color=color, linewidth=1,
                   label=f"{KIND_LABELS[ref['kind']]} store")
    if data["bytes"] or sized:
        ax.set_yscale("log")
        ax.legend(fontsize=8, loc="best")
    ax.set_ylabel("store size\n(bytes / example, log)")
    ax.set_xlabel("amount of HSK  A = N^D x N^L x N^W / d_T  (units of one full token vector, log scale)")
    ax.grid(True, which="both", alpha=0.3)


def interpret(data: dict, *, tolerance: float | None = None) -> str:
    """A few sentences on what the curve says (markdown), from `plot_marginal_utility`'s data.

    tolerance: how far below the full-HSK (else best) score still counts as "as good"; default
    one point on a 0-100 scale, 0.01 on a 0-1 scale.
    """
    if not data["lines"]:
        return "No HSK runs in the table yet: only reference runs."
    points = [(a, m, ln["label"]) for ln in data["lines"]
              for a, m in zip(ln["amount"], ln["mean"], strict=True)]
    target_name, target = _target(data, points)
    if tolerance is None:
        tolerance = 1.0 if abs(target) > 1.5 else 0.01
    best = max(points, key=lambda p: p[1])
    enough = sorted(p for p in points if p[1] >= target - tolerance)
    text = [f"- Best HSK point: {data['metric']} {best[1]:.4g} at A = {best[0]:g}, {best[2]}."]
    if enough:
        a, m, label = enough[0]
        text.append(f"- Smallest amount within {tolerance:g} of {target_name} ({target:.4g}): "
                    f"A = {a:g}, {label}: {m:.4g}.")
    text += _gain_over_pred_only(data, best[1])
    text.append("- Marginal utility diminishes when the curve flattens while the store keeps growing "
                "(lower panel): past that point, more HSK costs bytes and buys little.")
    return "\n".join(text)


def _target(data: dict, points: list[tuple]) -> tuple[str, float]:
    """What counts as "as good": full HSK's score, else the best HSK point's."""
    full = [ref for ref in data["references"] if ref["kind"] == "full"]
    if full:
        return "full HSK", full[0]["mean"]
    return "the best HSK run", max(p[1] for p in points)


def _gain_over_pred_only(data: dict, best: float) -> list[str]:
    pred = [ref for ref in data["references"] if ref["kind"] == "pred_only"]
    if not pred:
        return []
    return [f"- HSK adds {best - pred[0]['mean']:+.4g} over prediction-only KD ({pred[0]['mean']:.4g})."]


def _fmt(x: float | None) -> str:
    if not _finite(x):
        return "-"
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.2f}"


_TABLE_HEAD = [
    "| kind | config | A (units) | values | student | metric | mean ± std | n (seeds) | bytes/example |",
    "|---|---|---:|---|---|---|---:|---:|---:|",
]


def results_markdown(results: pa.Table | str | os.PathLike) -> str:
    """A markdown table of the runs grouped by config: mean +- std over seeds, n, bytes per example."""
    rows = [r for r in _rows(results) if _finite(r["metric"])]
    if not rows:
        return "_No finished runs in the results table yet._"
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        key = (_name(r, "kind"), _name(r, "config", "-"), _name(r, "value_dtype", "-"), _name(r, "student", "-"),
               _name(r, "metric_name", "-"))
        groups[key].append(r)
    lines = [*_TABLE_HEAD, *(_table_row(key, runs) for key, runs in sorted(groups.items(), key=_table_order))]
    lines.append("")
    lines.append("std: sample standard deviation over runs (seeds); A = N^D x N^L x N^W / d_T.")
    return "\n".join(lines)


def _table_order(item: tuple[tuple, list[dict]]) -> tuple:
    (kind, config, dtype, student, metric), runs = item
    amount = runs[0]["amount_hsk"] if _finite(runs[0]["amount_hsk"]) else math.inf
    return (metric, student, KIND_ORDER.get(kind, 9), amount, config, dtype)


def _mean_text(values: list, fmt: str) -> str:
    finite = [v for v in values if _finite(v)]
    return format(statistics.fmean(finite), fmt) if finite else "-"


def _table_row(key: tuple, runs: list[dict]) -> str:
    kind, config, dtype, student, metric = key
    s = _stats([r["metric"] for r in runs])
    value = _fmt(s["mean"]) + (f" ± {_fmt(s['std'])}" if s["n"] > 1 else "")
    seeds = ", ".join(map(str, sorted({r["seed"] for r in runs if r["seed"] is not None}))) or "-"
    amount = _mean_text([r["amount_hsk"] for r in runs], "g")
    size = _mean_text([r["bytes_per_example"] for r in runs], ",.0f")
    return (f"| {kind} | {config} | {amount} | {dtype} | {student} | {metric} | {value} "
            f"| {s['n']} ({seeds}) | {size} |")


# --------------------------------------------------------------------------------------------------
# Several tasks in one figure: one panel per results table, metric against store bytes per example


def task_panel_data(results: pa.Table | str | os.PathLike, label: str, *, metric: str | None = None) -> dict:
    """One panel's points: per (kind, config, value dtype), mean bytes per example and the metric over seeds."""
    rows = _rows(results)
    metric = _pick_metric(rows, metric)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["metric_name"] == metric and _finite(r["metric"]) and _finite(r["bytes_per_example"]):
            groups[(r["kind"] or "?", r["config"] or "-", r["value_dtype"] or "-")].append(r)
    points = [{"kind": kind, "config": config, "value_dtype": dtype,
               "bytes_per_example": statistics.fmean(r["bytes_per_example"] for r in runs),
               **_stats([r["metric"] for r in runs])}
              for (kind, config, dtype), runs in groups.items()]
    points.sort(key=lambda p: p["bytes_per_example"])
    return {"label": label, "metric": metric, "points": points, "n_runs": sum(p["n"] for p in points)}


def _panel_series(panel: dict) -> tuple[list[dict], list[dict]]:
    """(float16 HSK between the references pred-only and full, every other value dtype's points)."""
    def on_line(p: dict) -> bool:
        return p["kind"] in ("pred_only", "full") or (p["kind"] == "hsk" and p["value_dtype"] == "float16")

    chain = [p for p in panel["points"] if on_line(p)]
    return chain, [p for p in panel["points"] if not on_line(p) and p["kind"] != "no_kd"]


def _draw_points(ax, pts: list[dict], *, line: bool) -> None:
    xs, ys = [p["bytes_per_example"] for p in pts], [p["mean"] for p in pts]
    err = [[p["mean"] - p["min"] for p in pts], [p["max"] - p["mean"] for p in pts]]
    label = "float16 (pred-only ... full)" if line else " / ".join(sorted({p["value_dtype"] for p in pts}))
    ax.errorbar(xs, ys, yerr=err, linestyle="-" if line else "none", marker="o" if line else "D", capsize=3,
                label=label)
    for p in pts:
        ax.annotate(_point_name(p, line), (p["bytes_per_example"], p["mean"]), textcoords="offset points",
                    xytext=(4, -11) if line else (4, 6), fontsize=7, color="0.3")


def _point_name(p: dict, line: bool) -> str:
    name = p["config"] if p["kind"] == "hsk" else p["kind"].replace("_", "-")
    return name if line else f"{name} {p['value_dtype']}"


def _draw_panel(ax, panel: dict) -> None:
    """float16 HSK between the references (pred-only, full) as one line; other value dtypes as markers."""
    chain, rest = _panel_series(panel)
    for pts, line in ((chain, True), (rest, False)):
        if pts:
            _draw_points(ax, pts, line=line)
    for p in panel["points"]:
        if p["kind"] == "no_kd":
            ax.axhline(p["mean"], linestyle="-.", color="tab:red", linewidth=1, label=KIND_LABELS["no_kd"])
    ax.set_xscale("log")
    ax.set_title(f"{panel['label']}: dev {panel['metric']} ({panel['n_runs']} runs)", fontsize=10)
    ax.set_xlabel("store bytes per example (log)")
    ax.set_ylabel(f"dev {panel['metric']} (bars: min-max over seeds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def plot_tasks(tables: Sequence[tuple[str, pa.Table | str | os.PathLike]], out_png: str | os.PathLike, *,
               metric: str | None = None) -> list[dict]:
    """One panel per (label, results table): dev metric (mean over seeds, min-max bars) against store bytes
    per example, log x. Returns the panels' data (`task_panel_data`)."""
    panels = [task_panel_data(table, label, metric=metric) for label, table in tables]
    cols = min(2, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(6.5 * cols, 4.8 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels, strict=False):
        _draw_panel(ax, panel)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("Marginal utility of hidden-state knowledge: dev metric vs store size", fontsize=12)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    return panels


def table_labels(paths: Sequence[str | os.PathLike]) -> list[str]:
    """A panel title per results table: its folder's name (e.g. runs/mrpc/results.parquet -> mrpc), else its path."""
    names = [Path(p).resolve().parent.name for p in paths]
    return names if len(set(names)) == len(names) and all(names) else [str(p) for p in paths]


def _several_tables_md(paths: Sequence[str | os.PathLike], labels: list[str], tables: list[pa.Table],
                       metric: str | None) -> str:
    parts = [f"# Marginal utility of hidden-state knowledge on {len(paths)} tables\n",
             "![metric vs store bytes per example](marginal_utility.png)\n"]
    for path, label, table in zip(paths, labels, tables, strict=True):
        data = marginal_utility_data(table, metric=metric)
        parts += [f"## {label}\n", f"Results: `{path}` ({table.num_rows} runs; metric: {data['metric']}).\n",
                  interpret(data) + "\n", results_markdown(table) + "\n"]
    return "\n".join(parts)


OUTPUT_KIND = REPORT.name  # what `hsk report --out` holds (pipelines.core.output_kinds)


def report(results_path: str | os.PathLike | Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
           metric: str | None = None, overwrite: bool = False) -> tuple[Path, Path]:
    """Write marginal_utility.png and marginal_utility.md (table + reading) to out_dir.

    Several results tables (e.g. one per task): one panel per table, metric against store bytes per
    example (`plot_tasks`), and one section of the markdown per table.
    out_dir follows the output rule (hskstore.io.outputs): a new (or empty) folder, or a report folder
    with `overwrite`, replaced only once the new report is complete; anything else is refused.
    """
    paths = [results_path] if isinstance(results_path, (str, os.PathLike)) else list(results_path)
    out_dir = Path(out_dir)
    REPORT.claim(str(out_dir), overwrite=overwrite)
    tables = [read_results(p) for p in paths]
    with staged_replace(str(out_dir)) as staged:
        mark_output(staged, OUTPUT_KIND, results=", ".join(str(p) for p in paths))
        png, md = Path(staged) / "marginal_utility.png", Path(staged) / "marginal_utility.md"
        if len(paths) > 1:
            labels = table_labels(paths)
            plot_tasks(list(zip(labels, tables, strict=True)), png, metric=metric)
            md.write_text(_several_tables_md(paths, labels, tables, metric))
        else:
            data = plot_marginal_utility(tables[0], png, metric=metric)
            md.write_text(
                "# Marginal utility of hidden-state knowledge\n\n"
                f"Results: `{paths[0]}` ({tables[0].num_rows} runs; plotted metric: {data['metric']}).\n\n"
                "![metric vs amount of HSK](marginal_utility.png)\n\n"
                f"{interpret(data)}\n\n"
                f"{results_markdown(tables[0])}\n"
            )
    return out_dir / "marginal_utility.png", out_dir / "marginal_utility.md"
