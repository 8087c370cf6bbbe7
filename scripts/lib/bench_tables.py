"""Figures of the side-by-side benchmark suite (scripts/lib/bench-suite): aggregation of the
per-run JSON objects over repeats, the markdown tables, and the check of the targets the suite
exists to track. Pure data in, text out: no process is started here."""
import statistics

METRICS = ("median_ns", "p99_ns", "mean_ns", "pairs_per_second", "peak_reserved_bytes",
           "reserved_at_end_bytes", "driver_allocs", "driver_frees", "event_records")
MiB = 1 << 20
PAGE = 2 * MiB  # the page of the default layout's smallest pool (the 64 KiB loop's page)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(runs, traces, allocators):
    """{trace: {allocator: figures}}: medians over the successful repeats, and the failures."""
    out = {}
    for trace in traces:
        row = out.setdefault(trace["name"], {})
        for name in allocators:
            mine = [r for r in runs if r["trace"] == trace["name"] and r["allocator"] == name]
            mine = [r for r in mine if r.get("status") != "skipped"]
            if not mine:
                continue
            ok = [r for r in mine if r.get("status") == "ok"]
            cell = {"runs": len(mine), "ok": len(ok),
                    "failures": sorted({r.get("error", "?") for r in mine if r not in ok})}
            for key in METRICS:
                cell[key] = _median([r.get(key) for r in ok])
            medians = [r["median_ns"] for r in ok if r.get("median_ns") is not None]
            cell["median_ns_range"] = (min(medians), max(medians)) if medians else None
            cell["reserved_ratio"] = _median([
                r["peak_reserved_bytes"] / r["peak_live_bytes"] for r in ok
                if r.get("peak_reserved_bytes") is not None and r.get("peak_live_bytes")])
            if ok:
                cell["label"] = ok[0].get("label")
                cell["peak_live_bytes"] = ok[0].get("peak_live_bytes")
                cell["pairs"] = ok[0].get("trace_pairs")
                phases = {}
                for r in ok:
                    for p in r.get("phases", []):
                        phases.setdefault(p["name"], []).append(p["median_ns"])
                cell["phase_median_ns"] = {k: statistics.median(v) for k, v in phases.items()}
            row[name] = cell
    return out


def _as_fast(default, none):
    """The verdict of "as fast as free_fence:none". Where stream order makes reuse safe the
    default runs the same code as free_fence:none, so their medians differ by the noise of the
    machine alone: the default is slower only when even its fastest repeat was slower than the
    median of free_fence:none's repeats."""
    ratio = default["median_ns"] / none["median_ns"]
    if ratio <= 1:
        return "met"
    low, high = default["median_ns_range"]
    if low <= none["median_ns"]:
        return (f"met: within the repeats' spread (the default's repeats {low:,.0f} to "
                f"{high:,.0f} ns)")
    return f"missed: {ratio:.2f}× slower"


def _ns(v):
    return "–" if v is None else f"{v:,.0f}"


def _cell(cell, render):
    if cell is None:
        return ""
    if cell["ok"] == 0:
        return "✗"
    text = render(cell)
    return text + ("†" if cell["ok"] < cell["runs"] else "")


def _matrix(title, results, columns, render, rows=None, note=""):
    rows = rows or list(results)
    lines = [f"### {title}", ""]
    if note:
        lines += [note, ""]
    lines.append("| trace | " + " | ".join(columns) + " |")
    lines.append("|---" * (len(columns) + 1) + "|")
    for trace in rows:
        cells = [_cell(results[trace].get(c), render) for c in columns]
        lines.append(f"| {trace} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _ratio(cell):
    return cell.get("reserved_ratio")


def _per_pair(cell):
    pairs = cell.get("pairs") or 0
    if not pairs or cell.get("driver_allocs") is None:
        return "–"
    return " / ".join(f"{cell[k] / pairs:.3g}" for k in ("driver_allocs", "driver_frees",
                                                        "event_records"))


def _threads_table(results, columns):
    pairs = [(t, t + "-2t") for t in results if not t.endswith("-2t") and t + "-2t" in results]
    if not pairs:
        return ""
    lines = ["### Pairs per second, 1 thread → 2 threads", "",
             "The 2-thread trace splits the same work into two independent streams. `harness`, "
             "the replay loop alone, shows how far the machine lets each trace rise.", "",
             "| trace | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for one, two in pairs:
        cells = []
        for c in columns:
            a, b = results[one].get(c), results[two].get(c)
            if not a or not b or not a["ok"] or not b["ok"]:
                cells.append("✗" if (a and not a["ok"]) or (b and not b["ok"]) else "")
                continue
            one_s, two_s = a["pairs_per_second"] / 1e6, b["pairs_per_second"] / 1e6
            cells.append(f"{one_s:.2f}M → {two_s:.2f}M")
        lines.append(f"| {one} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _levels_table(results, columns):
    lines = []
    for trace, row in results.items():
        phases = None
        for c in columns:
            if row.get(c) and row[c].get("phase_median_ns"):
                phases = [p for p in row[c]["phase_median_ns"] if p.startswith("live-")]
                break
        if not phases:
            continue
        lines += [f"### {trace}: median ns per free+allocate step at each live level", "",
                  "| allocator | " + " | ".join(phases) + f" | {phases[-1]} ÷ {phases[0]} |",
                  "|---" * (len(phases) + 2) + "|"]
        for c in columns:
            cell = row.get(c)
            if not cell or not cell["ok"]:
                if cell:
                    lines.append(f"| {c} | " + " | ".join(["✗"] * (len(phases) + 1)) + " |")
                continue
            values = [cell["phase_median_ns"].get(p) for p in phases]
            ratio = values[-1] / values[0] if values[0] and values[-1] else None
            lines.append(f"| {c} | " + " | ".join(_ns(v) for v in values) +
                         f" | {'–' if ratio is None else f'{ratio:.2f}'} |")
        lines.append("")
    return "\n".join(lines)


def targets(results, meta):
    """(trace or scope, what, measured, verdict) rows for the issue's targets."""
    rows = []

    def cell(trace, name):
        c = results.get(trace, {}).get(name)
        return c if c and c["ok"] else None

    def family(trace):
        return trace.split("-")[0]

    for trace in results:
        default, bg2, none = (cell(trace, n) for n in ("poolcuda", "cub-bg2", "poolcuda-none"))
        one_thread = not trace.endswith("-2t")
        if one_thread and default and bg2:
            speedup = bg2["median_ns"] / default["median_ns"]
            rows.append((trace, "≥ 3× faster than CUB bin growth 2 (median)",
                         f"{speedup:.2f}×", "met" if speedup >= 3 else
                         f"missed: needs {3 / speedup:.1f}× faster"))
        if one_thread and default and none:
            rows.append((trace, "as fast as free_fence:none today (medians of repeats)",
                         f"{default['median_ns']:,.0f} vs {none['median_ns']:,.0f} ns",
                         _as_fast(default, none)))
        if not one_thread and default and cell(trace[:-3], "poolcuda"):
            a = cell(trace[:-3], "poolcuda")["pairs_per_second"]
            b = default["pairs_per_second"]
            rows.append((trace, "throughput rises from 1 to 2 threads",
                         f"{a / 1e6:.2f}M → {b / 1e6:.2f}M pairs/s",
                         "met" if b > a else f"missed: {b / a:.2f}× of 1 thread"))
        limit = {"rmm": 1.5, "ring16": 1.5, "llm": 1.5, "training": 1.5,
                 "slices": 1.05}.get(family(trace))
        if default and limit and _ratio(default) is not None:
            r = _ratio(default)
            rows.append((trace, f"peak reserved ÷ peak live ≤ {limit}", f"{r:.2f}",
                         "met" if r <= limit else f"missed by {r - limit:.2f}"))
        gpu_sized = cell(trace, "poolcuda-80g")
        if gpu_sized and limit and _ratio(gpu_sized) is not None:
            r = _ratio(gpu_sized)
            rows.append((trace, f"the same on an 80 GiB device (poolcuda-80g) ≤ {limit}",
                         f"{r:.2f}", "met" if r <= limit else f"missed by {r - limit:.2f}"))
        if default and family(trace) == "loop" and default["peak_reserved_bytes"] is not None:
            peak = default["peak_reserved_bytes"]
            rows.append((trace, "reserves at most one 2 MiB page", f"{peak / MiB:.1f} MiB",
                         "met" if peak <= PAGE else f"missed: {peak / PAGE:.0f} pages"))
        if default and default.get("phase_median_ns"):
            levels = [p for p in default["phase_median_ns"] if p.startswith("live-")]
            if len(levels) >= 2:
                lo, hi = (default["phase_median_ns"][p] for p in (levels[0], levels[-1]))
                rows.append((trace, f"cost per pair {levels[-1]} ÷ {levels[0]} ≤ 1.5",
                             f"{hi / lo:.2f}", "met" if hi / lo <= 1.5 else
                             f"missed by {hi / lo - 1.5:.2f}"))
    if not meta.get("quick"):
        s = meta.get("seconds", 0)
        rows.append(("suite", "runs in under 5 minutes", f"{s:.0f} s",
                     "met" if s < 300 else f"missed by {s - 300:.0f} s"))
    return rows


def render(results_doc):
    meta, results = results_doc["meta"], results_doc["results"]
    columns = []
    for row in results.values():
        for name in row:
            if name not in columns:
                columns.append(name)
    timed = list(columns)
    out = [f"## Side-by-side benchmark ({meta['mode']}{', quick' if meta['quick'] else ''})", "",
           f"{meta['date']}; {meta['cpu']}, {meta['cores']} cores; {meta['repeats']} interleaved "
           f"repeat(s), medians over repeats; {meta['seconds']:.0f} s in all. "
           "✗: every run failed, †: some runs failed (see Failures); "
           "an empty cell was not run.",
           ""]
    if meta.get("context_only"):
        out += [f"{', '.join(meta['context_only'])}: no target reads their times; they ran in the "
                "first repeat only.", ""]
    for trace, names in (meta.get("first_repeat_only") or {}).items():
        out += [f"{trace}: {', '.join(names)} ran in the first repeat only too (their runs are "
                "the longest; each live level is 20,000 steps).", ""]
    if meta.get("best_layouts"):
        out += ["poolcuda-best layouts (POOLCUDA_CONF): " +
                "; ".join(f"{k}: `{v}`" for k, v in meta["best_layouts"].items()), ""]
    out.append(_matrix("Median ns per allocate+free pair", results, timed,
                       lambda c: _ns(c["median_ns"]),
                       note="`harness` is the replay loop alone (an allocator that does "
                            "nothing); every other figure includes it." if "harness" in timed
                       else ""))
    out.append(_matrix("p99 ns per allocate+free pair", results, timed,
                       lambda c: _ns(c["p99_ns"])))
    out.append(_threads_table(results, timed))
    mem = [c for c in columns if c != "harness"]
    out.append(_matrix("Peak reserved ÷ peak live", results, mem,
                       lambda c: "–" if _ratio(c) is None else f"{_ratio(c):.2f}",
                       note="Reserved: device bytes obtained from the driver and not yet "
                            "returned, at the peak; live: the trace's own peak (with 2 threads "
                            "the sum of each thread's peak, the most the trace can have live at "
                            "once: a run may stay below it, so a figure under 1 is possible)."))
    out.append(_matrix("MiB reserved at the end (every buffer freed)", results, mem,
                       lambda c: "–" if c["reserved_at_end_bytes"] is None
                       else f"{c['reserved_at_end_bytes'] / MiB:,.1f}"))
    out.append(_matrix("Driver allocations / frees / event records per pair", results, mem,
                       _per_pair))
    out.append(_levels_table(results, timed))
    rows = targets(results, meta)
    if rows:
        out += ["### Targets", ""]
        if meta.get("quick"):
            out += ["Quick run: traces at 1% of their size; these verdicts are no measurement "
                    "of the targets.", ""]
        out += ["| trace | target | measured | verdict |", "|---|---|---|---|"]
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
        out.append("")
    skipped = meta.get("skipped_runs", 0)
    if skipped:
        out += [f"{skipped} run(s) were not started: the time budget was spent; their cells use "
                "the repeats that ran.", ""]
    failures = [(t, a, c) for t, row in results.items() for a, c in row.items() if c["failures"]]
    if failures:
        out += ["### Failures", ""]
        for t, a, c in failures:
            out.append(f"- {t}, {a} ({c['runs'] - c['ok']} of {c['runs']} runs): " +
                       "; ".join(c["failures"]))
        out.append("")
    return "\n".join(out)


def exploration_table(rows):
    lines = ["| trace | layout | median ns | p99 ns | reserved ÷ live | MiB at end |",
             "|---|---|---|---|---|---|"]
    for trace, name, _conf, runs in rows:
        ok = [r for r in runs if r.get("status") == "ok"]
        if not ok:
            error = runs[0].get("error", "")[:80]
            lines.append(f"| {trace['name']} | {name} | ✗ {error} | | | |")
            continue
        med = _median([r["median_ns"] for r in ok])
        p99 = _median([r["p99_ns"] for r in ok])
        peak = _median([r.get("peak_reserved_bytes") for r in ok])
        end = _median([r.get("reserved_at_end_bytes") for r in ok])
        ratio = "–" if peak is None else f"{peak / ok[0]['peak_live_bytes']:.2f}"
        lines.append(f"| {trace['name']} | {name} | {_ns(med)} | {_ns(p99)} | {ratio} | "
                     f"{'–' if end is None else f'{end / MiB:,.1f}'} |")
    return "\n".join(lines)
