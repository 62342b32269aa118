#!/usr/bin/env python3
"""PNG figures from the benchmarks' JSON (bench-results/), for the README and docs.

    pip install matplotlib && python benches/figures.py [--results bench-results] [--out docs/figures]

Each figure is drawn only when its JSON exists; the figure says what ran where (the JSON's
machine line, with the load average at the start of each run). Nothing is measured here.

    append-patterns.png, edit-patterns.png  bench_append.py / bench_edits.py --patterns
    pool-patterns.png                       bench_pool.py --patterns
    pool-spacing.png                        bench_pool.py (pool.json)
    sessions-context.png                    bench_append.py [--encoder reference] (append-auto.json,
                                            append-reference.json), bench_edits.py (edits.json)
    stateless-peers.png                     bench_fast.py --speed-only (fast.json)
    ttft.png                                bench_ttft.py (every ttft-*.json)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(results: Path, name: str) -> dict | None:
    path = results / name
    return json.loads(path.read_text()) if path.exists() else None


def _machine(data: dict) -> str:
    m = data.get("machine", {})
    load = m.get("loadavg_at_start")
    load = f", load {load[0]:.1f}" if load else ""
    return f"{m.get('cpu', '?')}, {m.get('cpus_usable', '?')} CPUs{load}, {m.get('date', '')}"


def patterns_figure(plt, data: dict, out: Path, name: str) -> Path:
    """Median turn latency per cache state and calling pattern, dtok next to the alternative."""
    rows = data["rows"]
    whos = [k for k in rows[0] if isinstance(rows[0][k], dict) and "median_ms" in rows[0][k]]
    panels = list(dict.fromkeys((r["kind"], r["size"]) for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.4), squeeze=False)
    for ax, (kind, size) in zip(axes[0], panels):
        cells = [r for r in rows if r["size"] == size and r["kind"] == kind]
        conditions = list(dict.fromkeys(r["condition"] for r in cells))
        patterns = list(dict.fromkeys(r["pattern"] for r in cells))
        width = 0.8 / (len(patterns) * len(whos))
        for j, who in enumerate(whos):
            for i, pattern in enumerate(patterns):
                xs, ys, lo, hi = [], [], [], []
                for c, condition in enumerate(conditions):
                    r = next((r for r in cells if r["condition"] == condition
                              and r["pattern"] == pattern), None)
                    if r is None:
                        continue
                    med = r[who]["median_ms"]
                    a, b = r[who]["median_spread"]
                    xs.append(c + (j * len(patterns) + i) * width)
                    ys.append(med)
                    lo.append(med - a)
                    hi.append(b - med)
                ax.bar(xs, ys, width, yerr=[lo, hi], label=f"{who}, {pattern}",
                       alpha=1.0 if j == 0 else 0.45)
        ax.set_xticks([c + 0.4 - width / 2 for c in range(len(conditions))],
                      [c.replace("_", "\n") for c in conditions], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("median ms per turn (log)")
        ax.set_title(f"{kind} turns, {size:,}-character sessions")
        ax.legend(fontsize=7)
    return _save(plt, fig, data, out / f"{name}.png")


def _save(plt, fig, data: dict, path: Path) -> Path:
    fig.suptitle(_machine(data), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def spacing_figure(plt, data: dict, out: Path) -> Path:
    """Pool and in-process append latency against the mean request spacing."""
    rows = data["sweep"]
    xs = [max(r["spacing_ms"], 0.3) for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for who, style in (("pool", "o-"), ("in_process", "s--")):
        for stat, alpha in (("median_ms", 1.0), ("p99_ms", 0.45)):
            ys = [r[f"{who}_{stat}"] for r in rows]
            ax.plot(xs, ys, style, alpha=alpha, label=f"{who.replace('_', ' ')} {stat[:-3]}")
    ax.set_xscale("log")
    ax.set_xlabel("mean spacing of requests, ms (Poisson; 0 plotted at 0.3)")
    ax.set_ylabel("ms per 400-character append")
    ax.set_title(f"keyed appends to a {data['args']['size']:,}-character session")
    ax.legend(fontsize=8)
    return _save(plt, fig, data, out / "pool-spacing.png")


def _loads(*datas: dict) -> str:
    """The load averages at the start of each run a figure draws from."""
    loads = [d["machine"]["loadavg_at_start"][0] for d in datas if d.get("machine")]
    return ", ".join(f"{x:.1f}" for x in loads)


def context_figure(plt, appends: list[dict], edits: dict | None, out: Path) -> Path:
    """A turn's latency against the context: appends (bench_append.py, one run per encoder)
    and, when edits.json exists, the edited and extending turns of a reasoning chat
    (bench_edits.py), each next to the reference's full encode of the same text."""
    panels = 1 + (edits is not None)
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.4), squeeze=False)
    ax = axes[0][0]
    runs = []
    for i, run in enumerate(appends):
        rows = [r for r in run["rows"] if "session_chars" in r]
        enc = rows[0]["encoder"]
        runs.append(f"appends on {enc} {run['machine']['loadavg_at_start'][0]:.1f}")
        xs = [r["session_chars"] for r in rows]
        series = [("dtok", f"dtok session ({enc})", "o-"),
                  ("reference_full_encode", f"reference full encode ({enc} run)", "s--")]
        if i == 0:  # the peers, each encoding the whole text every turn (one run shows them)
            series += [(key, f"{key[:-len('_full_encode')]} (whole text)", "x:")
                       for key in rows[0] if key.endswith("alone_full_encode")]
        for j, (who, label, style) in enumerate(series):
            color = f"C{2 * i + j}" if j < 2 else f"C{4 + j}"
            ax.plot(xs, [r[who]["median_ms"] for r in rows], style, color=color,
                    label=f"{label}: median, pale P99")
            ax.plot(xs, [r[who]["p99_ms"] for r in rows], style, color=color, alpha=0.3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("session length, characters")
    ax.set_ylabel("ms per turn (log)")
    ax.set_title("400-character appends to a keyed session (Qwen3)")
    ax.legend(fontsize=7)
    if edits is not None:
        ax = axes[0][1]
        rows = [r for r in edits["replay"] if "edited_session" in r]
        xs = [r["context"] for r in rows]
        for key, label, style in (("edited_session", "dtok session, edited turns", "o-"),
                                  ("extending_session", "dtok session, extending turns", "^-"),
                                  ("edited_stateless", "dtok stateless (whole prompt, no reuse)",
                                   "d:")):
            med = [r[key]["median_ms"] for r in rows]
            lo = [m - r[key]["median_spread"][0] for m, r in zip(med, rows)]
            hi = [r[key]["median_spread"][1] - m for m, r in zip(med, rows)]
            ax.errorbar(xs, med, yerr=[lo, hi], fmt=style, capsize=3,
                        label=f"{label} ({rows[0]['encoder']})")
        ax.plot(xs, [r["reference_median_ms"] for r in rows], "s--", label="reference full encode")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("context, characters")
        ax.set_ylabel("median ms per turn (log; bars: min-max over repeats)")
        ax.set_title("reasoning chat, Qwen3's template drops earlier think blocks")
        ax.legend(fontsize=7)
    if edits:
        runs.append(f"edits {edits['machine']['loadavg_at_start'][0]:.1f}")
    m = appends[0]["machine"]
    fig.suptitle(f"{m['cpu']}, {m['cpus_usable']} CPUs, {m['date']}; load average at the start "
                 f"of each run: {', '.join(runs)}", fontsize=8)
    fig.tight_layout()
    path = out / "sessions-context.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


PEER_NAMES = {"hf batch_fast": "reference (encode_batch_fast)"}
MODE_NAMES = {"single": "dtok on 1 thread",
              "single+others": "dtok on 1 thread, every encoder in one process",
              "2 threads": "dtok on 2 threads",
              "2 threads+others": "dtok on 2 threads, every encoder in one process"}


def stateless_figure(plt, data: dict, out: Path) -> Path:
    """Stateless encodes per kind of text: dtok and its peers, each its own instance in one
    process (bench_fast.py), median wall ms over the documents, the slowest as a whisker; a peer
    that returned wrong IDs for any document says so in the legend."""
    rows = [r for r in data["rows"] if r.get("kind") and r.get("wall")]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, axes = plt.subplots(1, len(modes), figsize=(9 * len(modes), 4.6), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        cells = [r for r in rows if r["mode"] == mode]
        kinds = list(dict.fromkeys(r["kind"] for r in cells))
        whos = list(dict.fromkeys(w for r in cells for w in r["wall"]))
        width = 0.8 / len(whos)
        for j, who in enumerate(whos):
            xs, ys, err = [], [], []
            for k, kind in enumerate(kinds):
                s = next(r for r in cells if r["kind"] == kind)["wall"].get(who)
                if s:
                    xs.append(k + j * width)
                    ys.append(s["median_ms"])
                    err.append(max(0.0, s["p99_ms"] - s["median_ms"]))
            wrong = sorted(r["kind"] for r in cells if r.get("wrong", {}).get(who))
            label = PEER_NAMES.get(who, who) + (f" (wrong IDs: {', '.join(wrong)})" if wrong else "")
            ax.bar(xs, ys, width, yerr=[[0] * len(err), err], capsize=2, label=label)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(kinds))], kinds)
        ax.set_yscale("log")
        ax.set_ylabel("median ms per document (log; whisker: slowest)")
        c = cells[0]
        ax.set_title(f"{c['tokenizer']}, {c['chars']:,}-character documents ({c['docs']} per "
                     f"kind), {MODE_NAMES.get(mode, mode)}", fontsize=10)
        ax.legend(fontsize=7)
    return _save(plt, fig, data, out / "stateless-peers.png")


def ttft_figure(plt, runs: list[tuple[str, dict]], out: Path) -> Path:
    """Warm-turn time to first token in a real vllm serve (bench_ttft.py), per configuration
    and phase (one row each): vLLM's own tokenizer, dtok and the zero-cost oracle, median and
    P99; horizontal, so that many configurations stay readable."""
    modes = ("vllm", "dtok", "oracle")
    labels = {"vllm": "vLLM's own", "dtok": "dtok", "oracle": "oracle"}
    groups = [(name, phase, res) for name, d in runs for phase, res in d["phases"].items()]
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.5 * len(groups)))
    height = 0.26
    for j, mode in enumerate(modes):
        # a run with --modes dtok oracle has no vLLM's-own bars
        rows = [(g + (j - 1) * height, res["ttft"][mode]) for g, (_, _, res) in enumerate(groups)
                if mode in res["ttft"]]
        ys = [y for y, _ in rows]
        p99 = [t["p99_ms"] for _, t in rows]
        med = [t["median_ms"] for _, t in rows]
        ax.barh(ys, p99, height, alpha=0.3, color=f"C{j}")
        ax.barh(ys, med, height, color=f"C{j}", label=f"{labels[mode]} (solid: median, pale: P99)")
        for y, m in zip(ys, med):
            ax.text(m, y, f" {m:.0f}", ha="left", va="center", fontsize=6)
    ax.set_yticks(range(len(groups)), [f"{name.replace(chr(10), ' ')}, {phase} "
                                       f"(n={res['ttft']['dtok']['n']})"
                                       for name, phase, res in groups], fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")  # 16 concurrent sessions: seconds; one session: ~200 ms
    ax.set_xlabel("warm-turn TTFT, ms (log)")
    ax.set_title("warm turns of agent sessions in a real vllm serve (n: turns per mode)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{_machine(runs[0][1])}; load at the start of each run: "
                 f"{_loads(*(d for _, d in runs))}", fontsize=7)
    fig.tight_layout()
    path = out / "ttft.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _ttft_name(d: dict) -> str:
    """A run's configuration, as bench_ttft.py --table names it (one line per server flag)."""
    a = d["args"]
    load = [f"{a['sessions']} sessions"] if a.get("sessions", 1) > 1 else []
    if a.get("arrivals", "closed") == "poisson":
        load.append(f"Poisson {a['rate']:g}/s")
    return "\n".join([" ".join([a["model"], a["api"], "unkeyed" if a["unkeyed"] else "keyed",
                                f"{a['tokens'] // 1000}K"]), *load, *a["server_env"],
                      *a["server_arg"]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "bench-results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    made = []
    for name in ("append-patterns", "edit-patterns", "pool-patterns"):
        data = _load(args.results, f"{name}.json")
        if data and data.get("rows"):
            made.append(patterns_figure(plt, data, args.out, name))
    data = _load(args.results, "pool.json")
    if data and data.get("sweep"):
        made.append(spacing_figure(plt, data, args.out))
    appends = [d for d in (_load(args.results, f"append-{e}.json") for e in ("auto", "reference"))
               if d and d.get("rows")]
    edits = _load(args.results, "edits.json")
    if appends:
        made.append(context_figure(plt, appends, edits if edits and edits.get("replay") else None,
                                   args.out))
    data = _load(args.results, "fast.json")
    if data and data.get("rows"):
        made.append(stateless_figure(plt, data, args.out))
    runs = [(_ttft_name(d), d) for d in (json.loads(p.read_text())
                                         for p in sorted(args.results.glob("ttft-*.json")))]
    if runs:
        made.append(ttft_figure(plt, runs, args.out))
    for path in made:
        print("wrote", path)
    if not made:
        print(f"no benchmark results in {args.results}: run the benches first")


if __name__ == "__main__":
    main()
