#!/usr/bin/env python3
"""A pipeline step's timeline from a `dtrain train --pipeline-stages P --trace FILE` trace.

  /usr/bin/python3 bench/pipeline_timeline.py TRACE.json OUT.png [--step K] [--stages P]
  /usr/bin/python3 bench/pipeline_timeline.py TRACE.json --idle [--stages P]

--idle prints each stage's idle share (1 - forwards and backwards / the step's span) of the
fastest step (the one whose slowest stage took least: the steps the cores were free for), then the
median over the steps; both after the first two steps (the first probes shapes). On a loaded
machine a rank that waits gives up its core and gets it back a time slice later, so most steps
stall in their transfers: the median says what the load did, the fastest step what the schedule
does. Otherwise draws step K (default: the fastest) with the stages as rows (replica 0: world ranks 0..P-1): forwards,
backwards (the recomputed forward is inside it) and, thinner, the waits in transfer batches.
Each rank's trace times start at its own first span (app/trace.cpp); the rows are lined up by each
rank's origin on the steady clock (`steady_t0_ns`: exact for ranks of one host).
"""
import json
import sys


def origins(path):
    """rank -> its trace's origin on the host's steady clock, in microseconds (0 when not given)."""
    events = json.load(open(path))["traceEvents"]
    return {e["pid"]: e.get("args", {}).get("steady_t0_ns", 0) / 1e3 for e in events if e.get("ph") == "M"}


def load(path, stages):
    events = json.load(open(path))["traceEvents"]
    ranks = sorted({e["pid"] for e in events if e.get("ph") == "X"})
    stages = stages or len(ranks)
    out = []
    for r in range(stages):
        steps, cur = [], []
        for e in (e for e in events if e.get("pid") == r and e.get("ph") == "X"):
            if e["name"] == "optimizer step":
                steps.append(cur)
                cur = []
            else:
                cur.append(e)
        out.append(steps)
    return out


def idle_share(step):
    start, end = step[0]["ts"], step[-1]["ts"] + step[-1]["dur"]
    busy = sum(e["dur"] for e in step if e["name"].startswith(("forward", "backward")))
    return 1 - busy / (end - start)


def fastest(per_stage):
    n = min(len(s) for s in per_stage)
    span = lambda st: st[-1]["ts"] + st[-1]["dur"] - st[0]["ts"]
    return min(range(2, n), key=lambda i: max(span(steps[i]) for steps in per_stage))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def main():
    args = sys.argv[1:]
    stages = int(args[args.index("--stages") + 1]) if "--stages" in args else 0
    per_stage = load(args[0], stages)
    if "--idle" in args:
        k = fastest(per_stage)
        print(" ".join(f"{100 * idle_share(steps[k]):.1f}" for steps in per_stage),
              " ".join(f"{100 * median([idle_share(s) for s in steps[2:] if s]):.1f}" for steps in per_stage))
        return
    out = args[1]
    k = int(args[args.index("--step") + 1]) if "--step" in args else fastest(per_stage)
    rows = [steps[k] for steps in per_stage]
    origin = origins(args[0])
    offsets = [origin.get(s, 0) - origin.get(0, 0) for s in range(len(rows))]
    t0 = min(r[0]["ts"] + o for r, o in zip(rows, offsets))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 0.9 * len(rows) + 1.2))
    colours = {"forward": "#4c72b0", "backward": "#dd8452", "send/recv": "#bbbbbb"}
    for s, (row, off) in enumerate(zip(rows, offsets)):
        y = len(rows) - 1 - s
        for e in row:
            kind = e["name"].split(" ")[0]
            x = (e["ts"] + off - t0) / 1e3
            w = e["dur"] / 1e3
            if kind == "send/recv":
                ax.broken_barh([(x, w)], (y - 0.12, 0.24), facecolors=colours[kind])
            else:
                ax.broken_barh([(x, w)], (y - 0.38, 0.76), facecolors=colours[kind], edgecolor="white", linewidth=0.5)
                ax.text(x + w / 2, y, ("F" if kind == "forward" else "B") + e["name"].split(" ")[1], ha="center",
                        va="center", fontsize=8, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"stage {len(rows) - 1 - y}" for y in range(len(rows))])
    ax.set_xlabel("ms into the step")
    handles = [matplotlib.patches.Patch(color=c, label=l) for l, c in
               [("forward", colours["forward"]), ("backward (recomputed forward inside)", colours["backward"]),
                ("wait in a transfer batch", colours["send/recv"])]]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, frameon=False)
    m = sum(1 for e in rows[0] if e["name"].startswith("forward"))
    ax.set_title(f"One 1F1B step: P = {len(rows)} stages, M = {m} micro-batches (step {k + 1} of the trace)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out} (step {k + 1})")


if __name__ == "__main__":
    main()
