#!/usr/bin/env python3
"""PNG figures from the benchmarks' JSON (bench-results/), for the README and docs.

    pip install matplotlib && python benches/figures.py [--results bench-results] [--out docs/figures]

Each figure is drawn only when its JSON exists; the figure says what ran where (the JSON's
machine line). Nothing is measured here.
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
    fig.savefig(path, dpi=110)
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
    for path in made:
        print("wrote", path)
    if not made:
        print(f"no benchmark results in {args.results}: run the benches first")


if __name__ == "__main__":
    main()
