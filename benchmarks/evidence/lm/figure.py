"""The LM evidence figure and table (issue 47): student perplexity against store bytes per token.

    python benchmarks/evidence/lm/figure.py [--scale cpu | --results FILE] [--out DIR]

One panel per test file (KJV test books; QNLI Wikipedia): each store arm at its bytes per token (log x
axis, as `hsk info` reports them), the median perplexity over seeds (log y: linear in the loss) with the
min-max spread as an error bar, labelled (a no-tail arm is drawn 8% right of its tail twin, whose store it
shares); the arms without store bytes (CE only, online full-vocabulary KD) as horizontal lines, their seed
spread as a band; the teacher's own perplexity on the same text as a dotted line. Writes figure_SCALE.png and
results_SCALE.md (median [min-max] per arm) beside the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
PANELS = {"test": "KJV test books", "test_wiki": "QNLI Wikipedia (second domain)"}
LINE_STYLES = {"ce": ("tab:gray", "--"), "online": ("tab:red", "-")}
NOTAIL_NUDGE = 1.08  # x factor of a no-tail point (drawn, not reported: the table has the bytes)
FAMILY_COLOURS = (("notail", "tab:orange"), ("layer", "tab:cyan"), ("top", "tab:blue"), ("rs", "tab:green"),
                  ("sel", "tab:purple"), ("hidden", "tab:brown"))


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def by_arm(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows grouped by arm, in the order the arms first appear (run.py's order)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["arm"]].append(row)
    return dict(groups)


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the seeds' values."""
    return statistics.median(values), min(values), max(values)


def colour(arm: str) -> str:
    for key, name in FAMILY_COLOURS:
        if key in arm:
            return name
    return "black"


def draw_panel(ax, groups: dict[str, list[dict]], metric: str, title: str, teacher: float | None) -> None:
    stored = {a: rs for a, rs in groups.items() if rs[0]["has_bytes"] and metric in rs[0]}
    for arm, rs in stored.items():
        mid, low, high = spread([r[metric] for r in rs])
        # tail and no-tail arms share a store: nudge the no-tail point right so both stay visible
        x = rs[0]["bytes_per_token"] * (NOTAIL_NUDGE if "notail" in arm else 1.0)
        ax.errorbar([x], [mid], yerr=[[mid - low], [high - mid]], fmt="o", color=colour(arm), capsize=3)
        ax.annotate(arm, (x, mid), textcoords="offset points", xytext=(5, 4), fontsize=7, color=colour(arm))
    for arm, rs in groups.items():
        if rs[0]["has_bytes"] or metric not in rs[0]:
            continue
        mid, low, high = spread([r[metric] for r in rs])
        shade, style = LINE_STYLES.get(arm, ("black", ":"))
        ax.axhline(mid, color=shade, linestyle=style, linewidth=1, label=f"{arm} ({len(rs)} seeds)")
        ax.axhspan(low, high, color=shade, alpha=0.12)
    if teacher is not None:
        ax.axhline(teacher, color="black", linestyle=":", linewidth=1, label="teacher (30 layers)")
    ax.set_xscale("log")
    ax.set_yscale("log")  # perplexity is exp(NLL): a log axis is linear in the loss, and holds teacher and students
    ax.set_xlabel("store bytes per token (hsk info)")
    ax.set_ylabel("token perplexity (held out)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if teacher is not None or any(not rs[0]["has_bytes"] for rs in groups.values()):
        ax.legend(fontsize=7, loc="best")


def draw(doc: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the machines this runs on
    import matplotlib.pyplot as plt

    groups = by_arm(doc["rows"])
    names = [name for name in PANELS if any(f"ppl_{name}" in r for r in doc["rows"])]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        teacher = doc.get("teacher_eval", {}).get(name, {}).get("perplexity")
        draw_panel(ax, groups, f"ppl_{name}", PANELS[name], teacher)
    seeds = max(len(rs) for rs in groups.values())
    fig.suptitle(f"SmolLM2-135M -> first 2 layers, scale {doc['scale']} ({doc['scale_config']['steps']} steps, "
                 f"batch {doc['scale_config']['batch']}, {seeds} seeds: median, min-max)", fontsize=10)
    fig.tight_layout()
    path = out / f"figure_{doc['scale']}.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def cell(rs: list[dict], key: str, digits: int) -> str:
    values = [r[key] for r in rs if r.get(key) is not None]
    if not values:
        return "-"
    mid, low, high = spread(values)
    return f"{mid:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"


def table(doc: dict) -> str:
    names = [n for n in PANELS if any(f"ppl_{n}" in r for r in doc["rows"])]
    head = ["arm", "support", "B/token", *[f"ppl {n}" for n in names], *[f"ECE {n}" for n in names],
            "train s", "steps", "seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, rs in by_arm(doc["rows"]).items():
        size = f"{rs[0]['bytes_per_token']:.1f}" if rs[0]["has_bytes"] else "-"
        cells = [arm, rs[0]["support"], size, *[cell(rs, f"ppl_{n}", 2) for n in names],
                 *[cell(rs, f"ece_{n}", 3) for n in names], cell(rs, "train_wall_s", 0),
                 str(rs[0].get("steps")), str(len(rs))]
        lines.append("| " + " | ".join(cells) + " |")
    teacher = doc.get("teacher_eval") or {}
    if teacher:
        cells = ["teacher", "(30 layers, no training)", "-", *[f"{teacher[n]['perplexity']:.2f}" if n in teacher
                                                              else "-" for n in names],
                 *[f"{teacher[n]['ece']:.3f}" if n in teacher else "-" for n in names], "-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    config = doc["scale_config"]
    note = (f"Scale {doc['scale']}: {config['steps']} steps at batch {config['batch']} x {doc['block_size']} tokens, "
            f"lr {config.get('lr')}; eval tokens per file {config['eval_tokens'] or 'all'}. "
            "Cells: median [min-max] over seeds.")
    return "\n".join(["# LM evidence (issue 47)", "", note, "", *lines, ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu", help="reads benchmarks/evidence/lm/results_SCALE.json [cpu]")
    parser.add_argument("--results", type=Path, default=None, help="another results file (run.py --results)")
    parser.add_argument("--out", type=Path, default=None, help="folder of the figure and table [the results']")
    args = parser.parse_args(argv)
    results = args.results or HERE / f"results_{args.scale}.json"
    doc = load(results)
    out = args.out or results.parent
    out.mkdir(parents=True, exist_ok=True)
    figure = draw(doc, out)
    markdown = out / f"results_{doc['scale']}.md"
    markdown.write_text(table(doc))
    print(f"figure.py: {figure} and {markdown} ({len(doc['rows'])} rows)")


if __name__ == "__main__":
    main()
