#!/usr/bin/python3
"""Plot a `dtrain train --metrics FILE.jsonl` run: loss, test accuracy and throughput against
training steps, one PNG with three panels.

    /usr/bin/python3 scripts/plot_metrics.py run.jsonl -o run.png

Uses Debian's python3-matplotlib (scripts/setup.sh installs it)."""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402


def read_records(path):
    steps, epochs = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: {path}:{number}: not JSON: {e}")
            (steps if record.get("type") == "step" else epochs).append(record)
    if not steps and not epochs:
        sys.exit(f"plot_metrics: {path}: no records")
    return steps, epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="JSON-lines file written by dtrain train --metrics")
    parser.add_argument("-o", "--output", required=True, help="PNG file to write")
    args = parser.parse_args()
    steps, epochs = read_records(args.metrics)

    fig, (loss_ax, acc_ax, rate_ax) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    loss_ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], label="training loss (batch)")
    loss_ax.plot([r["step"] for r in epochs], [r["test_loss"] for r in epochs], "o-", label="test loss")
    loss_ax.set_ylabel("cross-entropy")
    loss_ax.legend()
    acc_ax.plot([r["step"] for r in epochs], [100 * r["test_accuracy"] for r in epochs], "o-", color="tab:green")
    acc_ax.set_ylabel("test accuracy (%)")
    rate_ax.plot([r["step"] for r in steps[1:]], [r["samples_per_s"] for r in steps[1:]], color="tab:purple")
    rate_ax.set_ylabel("samples/s (all ranks)")
    rate_ax.set_xlabel("optimizer step")
    for ax in (loss_ax, acc_ax, rate_ax):
        ax.grid(alpha=0.3)
    fig.suptitle(args.metrics)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)


if __name__ == "__main__":
    main()
