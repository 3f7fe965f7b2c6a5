"""What analyze writes: the CSV of every measurement, the terminal table, the HTML report with plots."""
from __future__ import annotations

import base64
import csv
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from .measure import Measurement
from .search import ModelSearch, Result

CSV_COLUMNS = ["model", "candidate", "max_batch_size", "instance_count", "dynamic_batching", "max_queue_delay_us",
               "preferred_batch_sizes", "status", "error", "batch_size", "concurrency", "throughput_infer_per_s",
               "p50_ms", "p90_ms", "p95_ms", "p99_ms", "meets_constraints", "chosen"]


@dataclass
class ModelOutcome:
    """One model's finished search and what came of it."""

    search: ModelSearch
    mode: str
    chosen: tuple[Result, Measurement] | None
    closest: tuple[Result, Measurement] | None
    config_path: Path | None
    seconds: float


def write_csv(path: Path, outcomes: Sequence[ModelOutcome]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for outcome in outcomes:
            search = outcome.search
            for key in search.order:
                result = search.results[key]
                c = result.candidate
                head = [search.model, key, c.max_batch_size, c.instance_count, c.dynamic_batching,
                        c.max_queue_delay_us if c.dynamic_batching else "",
                        " ".join(map(str, c.preferred_batch_sizes)), result.status, result.error]
                if not result.measurements:
                    writer.writerow(head + [""] * 8)
                for m in result.measurements:
                    chosen = outcome.chosen is not None and outcome.chosen[1] is m
                    writer.writerow(head + [m.batch_size, m.concurrency, f"{m.throughput:.1f}", f"{m.p50_us / 1000:.3f}",
                                            f"{m.p90_us / 1000:.3f}", f"{m.p95_us / 1000:.3f}", f"{m.p99_ms:.3f}",
                                            search.goal.meets(m), chosen])


def point_text(m: Measurement) -> str:
    return f"{m.throughput:,.0f} infer/s, p99 {m.p99_ms:.2f} ms (concurrency {m.concurrency}, batch {m.batch_size})"


def table_rows(outcome: ModelOutcome) -> list[list[str]]:
    """Per candidate, in the order measured: its best point under the goal, or its status."""
    rows = []
    search = outcome.search
    for key in search.order:
        result = search.results[key]
        best = search.best_of(result)
        mark = "*" if outcome.chosen is not None and outcome.chosen[0] is result else ""
        if best is None:
            rows.append([mark, key, result.status, "", "", "", "", result.error[:60]])
        else:
            rows.append([mark, key, result.status, f"{best.throughput:,.0f}", f"{best.p99_ms:.2f}",
                         str(best.concurrency), "yes" if search.goal.meets(best) else "no", result.error[:60]])
    return rows


TABLE_HEAD = ["", "candidate", "status", "infer/s", "p99 ms", "concurrency", "meets", "note"]


def terminal_table(outcome: ModelOutcome) -> str:
    rows = [TABLE_HEAD, *table_rows(outcome)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_HEAD))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def summary(outcome: ModelOutcome) -> list[str]:
    """The lines that say what was chosen (or that nothing met the constraints, and what came closest)."""
    search = outcome.search
    lines = [f"model '{search.model}': {outcome.mode} search for {search.goal.describe()}; "
             f"{len(search.results)} candidates ({search.runs} measured now) in {outcome.seconds:.0f} s"
             + (" (stopped by the time budget)" if search.stopped_by_budget else "")]
    if outcome.chosen is not None:
        result, m = outcome.chosen
        lines.append(f"best: {result.candidate.key}: {point_text(m)}")
        if outcome.config_path is not None:
            lines.append(f"config written to {outcome.config_path}")
    elif outcome.closest is not None:
        result, m = outcome.closest
        lines.append(f"no configuration meets {search.goal.describe()}; closest: {result.candidate.key}: "
                     f"{point_text(m)}")
    else:
        lines.append("no candidate could be measured")
    return lines


# ---- HTML --------------------------------------------------------------------------------------

def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def latency_plot(outcome: ModelOutcome) -> str:
    """Throughput against p99 latency, one line per candidate (its concurrency sweep), the choice starred."""
    search = outcome.search
    figure = Figure(figsize=(9, 5.2))
    axes = figure.add_subplot()
    measured = [search.results[k] for k in search.order if search.results[k].measurements]
    ranked = sorted(measured, key=search.value, reverse=True)
    colored = {id(r) for r in ranked[:8]}
    for result in measured:
        points = sorted(result.measurements, key=lambda m: (m.batch_size, m.concurrency))
        xs, ys = [m.p99_ms for m in points], [m.throughput for m in points]
        if id(result) in colored:
            axes.plot(xs, ys, marker="o", markersize=4, linewidth=1.4, label=result.candidate.key)
        else:
            axes.plot(xs, ys, marker=".", color="#c8c8c8", linewidth=0.8, zorder=1)
    marked = outcome.chosen or outcome.closest
    if marked is not None:
        m = marked[1]
        label = "chosen" if outcome.chosen else "closest (misses the constraints)"
        axes.plot([m.p99_ms], [m.throughput], marker="*", markersize=22, color="#d62728",
                  markeredgecolor="black", linestyle="none", zorder=5, label=f"{label}: {marked[0].candidate.key}")
    if search.goal.max_p99_ms is not None:
        axes.axvline(search.goal.max_p99_ms, color="#444", linestyle="--", linewidth=1, label="p99 limit")
    if search.goal.min_throughput is not None:
        axes.axhline(search.goal.min_throughput, color="#444", linestyle=":", linewidth=1, label="throughput floor")
    axes.set_xlabel("p99 latency (ms)")
    axes.set_ylabel("throughput (infer/s)")
    axes.set_title(f"{search.model}: throughput vs p99 latency (each line: concurrency 1, 2, 4, ...)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best", markerscale=0.5)
    return _png(figure)


def shape_plot(outcome: ModelOutcome) -> str:
    """Best throughput by max_batch_size per instance count, and by batching variant."""
    search = outcome.search
    figure = Figure(figsize=(11, 4.2))
    by_size, by_batching = figure.subplots(1, 2)
    # Only points that meet the constraints count, as for the choice; a candidate with none shows as 0.
    results = [r for r in search.results.values() if r.measurements]
    best_meeting = {r.candidate: max((m.throughput for m in r.measurements if search.goal.meets(m)), default=0.0)
                    for r in results}
    counts = sorted({r.candidate.instance_count for r in results})
    for count in counts:
        points: dict[int, float] = {}
        for r in results:
            if r.candidate.instance_count == count:
                best = best_meeting[r.candidate]
                points[r.candidate.max_batch_size] = max(points.get(r.candidate.max_batch_size, 0.0), best)
        sizes = sorted(points)
        by_size.plot([str(s) for s in sizes], [points[s] for s in sizes], marker="o",
                     label=f"{count} instance{'s' if count > 1 else ''}")
    by_size.set_xlabel("max_batch_size")
    by_size.set_ylabel("best throughput meeting the constraints (infer/s)")
    by_size.set_title("by max_batch_size and instance count")
    by_size.grid(alpha=0.3)
    if counts:
        by_size.legend(fontsize=8)
    variants: dict[str, float] = {}
    for r in results:
        c = r.candidate
        name = (f"dyn {c.max_queue_delay_us} us" + (" +pref" if c.preferred_batch_sizes else "")
                if c.dynamic_batching else "no dynamic batching")
        variants[name] = max(variants.get(name, 0.0), best_meeting[c])
    names = sorted(variants)
    by_batching.bar(names, [variants[n] for n in names], color="#4c78a8")
    by_batching.set_title("by dynamic batching (points meeting the constraints)")
    by_batching.tick_params(axis="x", labelsize=8, labelrotation=20)
    by_batching.grid(alpha=0.3, axis="y")
    return _png(figure)


STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child,td:last-child{text-align:left}tr.chosen{background:#fde6e6;font-weight:bold}
img{max-width:100%}.note{color:#555}code{background:#f4f4f4;padding:1px 4px}"""


def write_html(path: Path, outcomes: Sequence[ModelOutcome], command: str) -> None:
    """One self-contained page: plots embedded as PNG data, no external files or scripts."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>triton-serve analyze</title>"
             f"<style>{STYLE}</style></head><body><h1>triton-serve analyze</h1>"
             f"<p class='note'><code>{html.escape(command)}</code></p>"]
    for outcome in outcomes:
        search = outcome.search
        parts.append(f"<h2>{html.escape(search.model)}</h2>")
        parts += [f"<p>{html.escape(line)}</p>" for line in summary(outcome)]
        if any(r.measurements for r in search.results.values()):
            parts.append(f"<img alt='throughput vs p99 latency' src='{latency_plot(outcome)}'>")
            parts.append(f"<img alt='throughput by batch size and instance count' src='{shape_plot(outcome)}'>")
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in TABLE_HEAD[1:]) + "</tr>")
        for row in table_rows(outcome):
            chosen = " class='chosen'" if row[0] else ""
            parts.append(f"<tr{chosen}>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row[1:]) + "</tr>")
        parts.append("</table>")
    parts.append("<p class='note'>Every measurement is in measurements.csv beside this file.</p></body></html>")
    path.write_text("\n".join(parts))
