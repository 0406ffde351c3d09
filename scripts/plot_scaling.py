#!/usr/bin/python3
"""Plots bench/scaling.sh's CSV: samples/s and scaling efficiency against ranks, one line per
model (and per node count), with the PyTorch peer dashed where the CSV has it."""
import argparse
import csv
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("csv", help="scaling.csv written by bench/scaling.sh")
    parser.add_argument("-o", "--output", required=True, help="PNG file to write")
    parser.add_argument("--title", default="dtrain scaling")
    a = parser.parse_args()
    series = defaultdict(list)
    peer = defaultdict(list)
    for r in csv.DictReader(open(a.csv)):
        key = r["model"] if r["nodes"] == "1" else f'{r["model"]}, {r["nodes"]} nodes'
        series[key].append((int(r["ranks"]), float(r["samples_per_s"]), float(r["efficiency"] or "nan")))
        if r["peer_samples_per_s"]:
            peer[r["model"]].append((int(r["ranks"]), float(r["peer_samples_per_s"])))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, pts in sorted(series.items()):
        pts.sort()
        line, = ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"dtrain {key}")
        ax2.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", color=line.get_color(), label=f"dtrain {key}")
    for key, pts in sorted(peer.items()):
        pts.sort()
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker="x", linestyle="--", label=f"PyTorch DDP {key}")
    ranks = sorted({p[0] for pts in series.values() for p in pts})
    ax1.set(xlabel="ranks", ylabel="samples/s (training loop)", xticks=ranks, yscale="log")
    top = max([1.1] + [p[2] + 0.1 for pts in series.values() for p in pts if p[2] == p[2]])
    ax2.set(xlabel="ranks", ylabel="scaling efficiency", xticks=ranks, ylim=(0, top))
    ax2.axhline(1.0, color="grey", linewidth=0.5)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.suptitle(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)


if __name__ == "__main__":
    main()
