"""The results table (append, dedupe, atomic rewrite) and the marginal-utility report."""

from __future__ import annotations

import statistics

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.sweep import results as results_mod
from pipelines.sweep.report import interpret, plot_marginal_utility, report, results_markdown
from pipelines.sweep.results import RESULTS_SCHEMA, ResultsError, append_results, read_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic_rows() -> list[dict]:
    rows = []
    amounts = {"1,9,0.1": 0.9, "5,2,0.3": 3.0, "3,8,0.2": 4.8, "4,16,0.5": 32.0}
    for seed in (0, 1, 2):
        for i, (config, amount) in enumerate(amounts.items()):
            for dtype, shift in (("float16", 0.0), ("int8", -0.004)):
                rows.append({
                    "run_id": f"{config}-{dtype}-s{seed}", "source_store": "sst2.zarr", "config": config,
                    "kind": "hsk", "amount_hsk": amount, "value_dtype": dtype,
                    "store_bytes": int(1000 * amount),
                    "bytes_per_example": 10.0 * amount * (0.6 if dtype == "int8" else 1.0),
                    "student": "tinybert4", "seed": seed, "stages": "hsk+pred", "epochs_hsk": 10.0,
                    "epochs_pred": 5.0, "train_limit": None, "metric_name": "accuracy",
                    "metric": 0.80 + 0.02 * i + 0.01 * seed + shift, "metrics_json": "{}",
                    "train_seconds": 12.0, "examples_per_s": 900.0,
                })
        rows.append({"run_id": f"pred-s{seed}", "config": "pred-only", "kind": "pred_only",
                     "student": "tinybert4", "seed": seed, "metric_name": "accuracy",
                     "metric": 0.78 + 0.01 * seed, "bytes_per_example": 40.0})
        rows.append({"run_id": f"full-s{seed}", "config": "full", "kind": "full", "student": "tinybert4",
                     "seed": seed, "metric_name": "accuracy", "metric": 0.87 + 0.01 * seed})
    return rows


def test_plot_line_data_and_png(tmp_path):
    path = tmp_path / "results.parquet"
    append_results(path, synthetic_rows())
    data = plot_marginal_utility(path, tmp_path / "out" / "mu.png")
    png = tmp_path / "out" / "mu.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    assert data["metric"] == "accuracy" and data["png"] == str(png)
    by_dtype = {ln["value_dtype"]: ln for ln in data["lines"]}
    assert set(by_dtype) == {"float16", "int8"}
    fp16 = by_dtype["float16"]
    assert fp16["amount"] == [0.9, 3.0, 4.8, 32.0]
    for i in range(len(fp16["amount"])):
        expected = [0.80 + 0.02 * i + 0.01 * s for s in (0, 1, 2)]
        assert fp16["mean"][i] == pytest.approx(statistics.fmean(expected))
        assert fp16["min"][i] == pytest.approx(min(expected))
        assert fp16["max"][i] == pytest.approx(max(expected))
        assert fp16["n"][i] == 3
        assert by_dtype["int8"]["mean"][i] == pytest.approx(statistics.fmean(expected) - 0.004)
    refs = {r["kind"]: r for r in data["references"]}
    assert refs["pred_only"]["mean"] == pytest.approx(0.79) and refs["full"]["mean"] == pytest.approx(0.88)
    assert refs["pred_only"]["bytes_per_example"] == 40.0
    sizes = {b["value_dtype"]: b for b in data["bytes"]}
    assert sizes["int8"]["bytes_per_example"] == pytest.approx([6 * a for a in (0.9, 3.0, 4.8, 32.0)])
    assert "A = 32" in interpret(data)


def test_plot_picks_metric_and_skips_other_rows(tmp_path):
    rows = synthetic_rows() + [
        {"run_id": "mcc", "kind": "hsk", "amount_hsk": 0.9, "metric_name": "mcc", "metric": 0.3},
        {"run_id": "failed", "kind": "hsk", "amount_hsk": 0.9, "metric_name": "accuracy", "metric": None},
    ]
    table = pa.Table.from_pylist([{"created": "x", **r} for r in rows], schema=RESULTS_SCHEMA)
    data = plot_marginal_utility(table, tmp_path / "a.png")
    assert data["metric"] == "accuracy" and data["skipped"] == 2
    only = plot_marginal_utility(table, tmp_path / "b.png", metric="mcc")
    assert only["lines"][0]["mean"] == [0.3] and not only["references"]
    with pytest.raises(ValueError, match="no run reports metric 'f1'"):
        plot_marginal_utility(table, tmp_path / "c.png", metric="f1")


def test_markdown_grouped_by_config(tmp_path):
    md = results_markdown(pa.Table.from_pylist([{"created": "x", **r} for r in synthetic_rows()],
                                               schema=RESULTS_SCHEMA))
    lines = md.splitlines()
    assert lines[0].startswith("| kind | config |")
    body = [ln for ln in lines[2:] if ln.startswith("|")]
    assert len(body) == 4 * 2 + 2  # 4 configs x 2 dtypes + pred-only + full
    assert body[0].startswith("| pred_only | pred-only |") and body[-1].startswith("| full | full |")
    row = next(ln for ln in body if ln.startswith("| hsk | 1,9,0.1 | 0.9 | float16"))
    assert "0.8100 ± 0.0100" in row and "| 3 (0, 1, 2) |" in row and row.endswith("| 9 |")


def test_report_writes_png_and_markdown(tmp_path):
    append_results(tmp_path / "r.parquet", synthetic_rows())
    png, md = report(tmp_path / "r.parquet", tmp_path / "rep")
    assert png.read_bytes()[:8] == PNG_MAGIC
    text = md.read_text()
    assert "![metric vs amount of HSK](marginal_utility.png)" in text and "| hsk | 3,8,0.2 |" in text


def test_append_dedupes_by_run_id(tmp_path):
    path = tmp_path / "sub" / "results.parquet"
    append_results(path, [{"run_id": "a", "kind": "hsk", "metric": 1.0}, {"run_id": "b", "metric": 2.0}])
    append_results(path, [{"run_id": "a", "kind": "hsk", "metric": 3.0}, {"run_id": "c", "metric": 4.0},
                          {"run_id": "c", "metric": 5.0}])
    table = read_results(path)
    assert table.schema == RESULTS_SCHEMA
    got = {r["run_id"]: r["metric"] for r in table.to_pylist()}
    assert got == {"a": 3.0, "b": 2.0, "c": 5.0} and table.num_rows == 3
    assert all(r["created"] for r in table.to_pylist())
    with pytest.raises(ResultsError, match="unknown keys"):
        append_results(path, [{"run_id": "d", "metrc": 1.0}])
    with pytest.raises(ResultsError, match="no run_id"):
        append_results(path, [{"metric": 1.0}])
    with pytest.raises(ResultsError, match="kind"):
        append_results(path, [{"run_id": "e", "kind": "teacher"}])
    assert read_results(path).num_rows == 3


def test_append_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "results.parquet"
    append_results(path, [{"run_id": "a", "metric": 1.0}])
    before = path.read_bytes()

    def crash(table, where, *args, **kwargs):
        with open(where, "wb") as handle:
            handle.write(b"PAR1 half a file")  # a crash in the middle of writing
        raise OSError("disk full")

    monkeypatch.setattr(results_mod.pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        append_results(path, [{"run_id": "b", "metric": 2.0}])
    assert path.read_bytes() == before  # the table is untouched
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["results.parquet"]
    monkeypatch.undo()
    assert [r["run_id"] for r in read_results(path).to_pylist()] == ["a"]


def test_older_file_without_a_column_still_reads(tmp_path):
    path = tmp_path / "old.parquet"
    pq.write_table(pa.table({"run_id": ["x"], "metric": [0.5]}), path)
    table = read_results(path)
    assert table.schema == RESULTS_SCHEMA and table.column("student").to_pylist() == [None]
    with pytest.raises(FileNotFoundError, match="run a sweep"):
        read_results(tmp_path / "missing.parquet")


def test_report_of_several_tables_one_panel_each(tmp_path, capsys):
    """`hsk report A B --out DIR`: one panel per table (metric vs bytes per example), a section per table."""
    from pipelines.cli import main
    from pipelines.sweep.report import plot_tasks

    a, b = tmp_path / "mrpc" / "results.parquet", tmp_path / "cola" / "results.parquet"
    append_results(a, synthetic_rows())
    append_results(b, [{**r, "run_id": "c-" + r["run_id"], "metric_name": "matthews",
                        "bytes_per_example": r.get("bytes_per_example") or 5000.0} for r in synthetic_rows()])
    missing = tmp_path / "none" / "results.parquet"
    assert main(["report", str(a), str(missing), "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "marginal_utility.png").read_bytes()[:8] == PNG_MAGIC
    md = (tmp_path / "rep" / "marginal_utility.md").read_text()
    assert "## mrpc" in md and "## cola" in md and "metric: matthews" in md
    panels = plot_tasks([("mrpc", a), ("cola", b)], tmp_path / "p.png")
    assert [p["metric"] for p in panels] == ["accuracy", "matthews"]
    points = panels[0]["points"]  # mrpc's 'full' rows have no bytes: left out of a bytes axis
    assert [p["kind"] for p in points].count("full") == 0
    assert [p["bytes_per_example"] for p in points] == sorted(p["bytes_per_example"] for p in points)
    pred = next(p for p in points if p["kind"] == "pred_only")
    assert pred["bytes_per_example"] == 40.0 and pred["mean"] == pytest.approx(0.79)
    fp16 = [p for p in points if p["value_dtype"] == "float16"]
    assert [p["bytes_per_example"] for p in fp16] == pytest.approx([9.0, 30.0, 48.0, 320.0])
    assert fp16[0]["mean"] == pytest.approx(0.81) and fp16[0]["n"] == 3
    cola_full = next(p for p in panels[1]["points"] if p["kind"] == "full")
    assert cola_full["bytes_per_example"] == 5000.0 and cola_full["mean"] == pytest.approx(0.88)
