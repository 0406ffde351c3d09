"""dtrain's resnet18 against the PyTorch ResNet peer, step for step (CTest label torch).

    /usr/bin/python3 resnet_fidelity_test.py PATH/TO/dtrain PEERS_DIR [DATA_DIR]

PEERS_DIR holds torch_resnet_peer.py (the team's shared peer; its ResNet18 class is the model
compared with, so the two cannot drift apart). PyTorch writes the peer model's initial state_dict
(parameters and BatchNorm buffers) to a safetensors file; PyTorch and dtrain (--init-weights,
--shuffle off: the batches in dataset order) then train it in training mode with SGD (momentum
0.9, weight decay 5e-4, the peer's), PyTorch in float32 and in float64. Distances are the issue's
metric, per state_dict tensor (running means and variances included): max|a - b| / max|b|;
num_batches_tracked exactly equal. Two checks (Note [ResNet fidelity in float32 rounding]):
  A. the peer's settings (width 16, 64 Fashion-MNIST samples a step, lr 0.05), 2 steps: dtrain's
     distance from PyTorch float64 at most twice PyTorch float32's own (+ 1e-6);
  B. the issue's bound: width 4, batch 8, lr 0.01, every step 1..5 (fewer where the peer's own
     float32 run leaves its float64 run earlier, at least 3): dtrain within 1e-4 of the peer.
dtrain's final model.safetensors then loads into the peer's model with strict=True (and
PyTorch's file loaded into dtrain strictly is the --init-weights above). Exit 77 (CTest:
skipped) with the reason when torch cannot be imported or the peer or the data is missing.

Note [ResNet fidelity in float32 rounding]: the issue asked for 50 steps within 1e-4 of the
peer. No float32 implementation can be held to that: the peer's own float32 run is not within
1e-4 of its float64 run. Measured (Haswell OpenBLAS kernels, the peer's settings, torch seed 0),
the worst tensor of the peer's float32 run against its float64 run: step 1 3.7e-2
(layer4.1.bn1.bias), 2 1.8e-1, 5 1.1, 50 1.6 (layer1.1.bn1.bias); at step 50 the running
statistics 1.2 (layer2.0.bn2.running_mean) and the convolution weights 0.8: two trajectories.
dtrain at step 50: 3.7 from the peer's float32, 2.7 from its float64.
Why (not summation order): a ReLU whose input is within float32's error of zero (|x| <= 1.7e-6 in
float64) is on the other side in float32 (4 of the ~7M ReLU inputs at step 1), and its gradient
jumps by that position's whole dy. A BatchNorm bias's gradient is a channel's sum(dy) that nearly
cancels (a per-channel constant is removed by the next BatchNorm; only the ReLU masks and the
padded borders leave anything), so one position's dy is up to a few 1e-2 of it: the one flip in
layer4.1 moves layer4.1.bn1.bias's gradient by 3.7e-2 of its largest value and the gradient of the
convolution before it by 7e-2 (the other biases' gradients by 2e-3..1.4e-2, through backward from
it and the three flips in layers 2 and 3), while the biases start at 0 and stay small under weight
decay (max |b| 1.7e-4 after that step). Later flips, each kicked on by momentum, take it to O(1);
no BatchNorm is ill-conditioned (smallest batch variance at step 1 6e-3, |mean|/std <= 2.4). Other
settings flip too, only later: width 4, batch 8, lr 0.01: 5.4e-6 through step 5, 3.2e-3 at step 6
(its first flip: none in steps 1-5, 1 at step 6, 97 at step 7), 0.32 at 10, 1.8 at 50; lr 0.001:
1.3 at 50; width 2, batch 4: 5.6; momentum 0: 3.0; BatchNorm affine parameters drawn at random
(bias +-0.1, weight 1 +- 0.1, as a fine-tuned model's), width 16, lr 0.001: 0.14 at 50 (a running
variance). So check A holds dtrain to PyTorch float32's own distance from the exact run (after 2
steps dtrain is the closer one in every tensor printed), and check B holds the issue's 1e-4 at
every step for as long as float32 can: with 8 samples a step the peer's float32 run first flips at
step 6 (at step 5 with OPENBLAS_CORETYPE=SkylakeX: torch's sgemm is OpenBLAS too), so B's horizon
is the peer's own.
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from torch.nn import functional as F
except Exception as e:  # noqa: BLE001 - any import failure means: skip, saying why
    print(f"skipped: /usr/bin/python3 cannot import torch: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

DTRAIN = os.path.abspath(sys.argv[1])
PEERS = sys.argv[2] if len(sys.argv) > 2 else ""
DATA = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
STEPS, BATCH, WIDTH = int(os.environ.get("RESNET_TEST_STEPS", "2")), 64, 16
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 5e-4
FACTOR, FLOOR = 2.0, 1e-6  # Note [ResNet fidelity in float32 rounding]
# Check B: the bound, for as many of STRICT_STEPS as the peer's float32 keeps it itself.
STRICT_STEPS, STRICT_BATCH, STRICT_WIDTH, STRICT_LR, BOUND, MIN_HORIZON = 5, 8, 4, 0.01, 1e-4, 3
failures = []

if not os.path.exists(os.path.join(PEERS, "torch_resnet_peer.py")):
    print(f"skipped: torch_resnet_peer.py not found in '{PEERS}' (configure with -DDTRAIN_PEERS_DIR=...)")
    sys.exit(77)
if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    print(f"skipped: Fashion-MNIST not found in {DATA} (apt-get install dataset-fashion-mnist)")
    sys.exit(77)
os.environ["FMNIST_DIR"] = DATA
sys.path.insert(0, PEERS)
from torch_resnet_peer import ResNet18, load  # noqa: E402


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def dtrain(*args):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OPENBLAS_NUM_THREADS="1")
    r = subprocess.run([DTRAIN, *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit(f"FAIL dtrain {' '.join(args)}: exit {r.returncode}")
    return r.stdout


def train_torch(init, x, y, dtype, width=WIDTH, batch=BATCH, lr=LR, steps=STEPS):
    """The state_dict after each step: [step 1, ..., step `steps`]."""
    model = ResNet18(width).to(dtype)
    model.load_state_dict(init, strict=True)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    states = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        xs = x[step * batch:(step + 1) * batch].to(dtype)
        F.cross_entropy(model(xs), y[step * batch:(step + 1) * batch]).backward()
        opt.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states


def train_dtrain(work, init, width, batch, lr, steps):
    """dtrain from `init`; its model.safetensors after each step: [step 1, ..., step `steps`]."""
    init_path = os.path.join(work, f"init-{width}.safetensors")
    safetensors_io.save(init_path, init, {"format": "pt"})
    ck = os.path.join(work, f"ck-{width}")
    dtrain("train", "--model", "resnet18", "--width", str(width), "--data", DATA, "--train-limit", str(steps * batch),
           "--test-limit", "100", "--epochs", "1", "--batch-size", str(batch), "--shuffle", "off", "--init-weights",
           init_path, "--threads", "1", "--optimizer", "sgd", "--lr", str(lr), "--momentum", str(MOMENTUM),
           "--weight-decay", str(WEIGHT_DECAY), "--checkpoint-dir", ck, "--checkpoint-every", "1", "--keep",
           str(steps), "--checkpoint-sync", "--quiet")
    return [safetensors_io.load(os.path.join(ck, f"step-{k}", "model.safetensors"))[0] for k in range(1, steps + 1)]


def distance(a, b):
    """The issue's metric: max|a - b| / max|b|, in double."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def worst(a, b):
    """(distance, name) of the farthest float tensor of b, a's against b's."""
    return max((distance(a[k], v), k) for k, v in b.items() if v.is_floating_point() and k in a)


def check_within_bound(x, y, work):
    """Check B (Note [ResNet fidelity in float32 rounding])."""
    torch.manual_seed(0)
    init = {k: v.detach().clone() for k, v in ResNet18(STRICT_WIDTH).state_dict().items()}
    args = (STRICT_WIDTH, STRICT_BATCH, STRICT_LR, STRICT_STEPS)
    ours = train_dtrain(work, init, *args)
    peer = train_torch(init, x, y, torch.float32, *args)
    exact = train_torch(init, x, y, torch.float64, *args)
    horizon = 0
    while horizon < STRICT_STEPS and worst(peer[horizon], exact[horizon])[0] <= BOUND:
        horizon += 1
    if horizon < MIN_HORIZON:
        # Says nothing about dtrain: this torch/BLAS build's own rounding flips a ReLU that early.
        print(f"# SKIPPED (the 1e-4 check): the peer's own float32 run leaves its float64 run by more than "
              f"{BOUND:g} at step {horizon + 1} (a ReLU flip in PyTorch's float32): fewer than {MIN_HORIZON} steps")
        return
    bad = []
    for k in range(horizon):
        d, name = worst(ours[k], peer[k])
        own = worst(peer[k], exact[k])[0]
        counted = all(int(ours[k][n]) == k + 1 for n in ours[k] if n.endswith("num_batches_tracked"))
        print(f"     step {k + 1}: dtrain from the peer {d:.2e} ({name}); the peer's float32 from its float64 {own:.2e}")
        if d > BOUND or not counted:
            bad.append(f"step {k + 1}: {name} {d:.2e}" + ("" if counted else ", num_batches_tracked"))
    check(not bad, f"width {STRICT_WIDTH}, batch {STRICT_BATCH}, lr {STRICT_LR:g}: every parameter and running "
          f"statistic within {BOUND:g} of the peer (max|difference| / max|value|) at every step 1..{horizon} (of "
          f"{STRICT_STEPS}: the steps the peer's own float32 keeps it); outside: {bad[:4]}")


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ResNet18(WIDTH)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = load("train").tensors
    with tempfile.TemporaryDirectory(prefix="dtrain_resnet_") as work:
        weights = train_dtrain(work, init, WIDTH, BATCH, LR, STEPS)[-1]
        check_within_bound(x, y, work)

    reference = train_torch(init, x, y, torch.float32)[-1]
    exact = train_torch(init, x, y, torch.float64)[-1]
    check(set(weights) == set(reference), f"dtrain's model.safetensors holds the peer's {len(reference)} state_dict "
          f"names (missing {sorted(set(reference) - set(weights))[:3]}, extra {sorted(set(weights) - set(reference))[:3]})")
    bad, worst_torch = [], 0.0
    for name, w in reference.items():
        if name not in weights:
            continue
        d = weights[name]
        if name.endswith("num_batches_tracked"):
            if not (d.dtype == torch.int64 and int(d) == int(w) == STEPS):
                bad.append(f"{name} {int(d)} (torch {int(w)})")
            continue
        e = exact[name]
        scale = e.abs().max().clamp_min(1e-30)
        ours = ((d.double() - e).abs().max() / scale).item()
        theirs = ((w.double() - e).abs().max() / scale).item()
        worst_torch = max(worst_torch, ((d - w).abs().max() / w.abs().max().clamp_min(1e-30)).item())
        if ours > FACTOR * theirs + FLOOR:
            bad.append(f"{name} {ours:.2e} (torch float32 {theirs:.2e})")
        if name.startswith(("conv1", "bn1", "layer4.1", "fc")):
            print(f"     {name:32s} from float64: dtrain {ours:.2e}, torch float32 {theirs:.2e}")
    check(not bad, f"{STEPS} SGD steps x {BATCH}: every parameter and running statistic as close to PyTorch float64 as "
          f"PyTorch float32 is (within {FACTOR:g}x + {FLOOR:g}); num_batches_tracked {STEPS}; outside: {bad[:4]}")
    print(f"     (dtrain against PyTorch float32 directly: worst tensor {worst_torch:.2e})")
    loaded = ResNet18(WIDTH)
    loaded.load_state_dict(weights, strict=True)  # raises on a missing, extra or misshapen tensor
    check(True, "dtrain's model.safetensors loads into the peer's ResNet18 with strict=True")
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
