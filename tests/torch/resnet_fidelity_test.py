"""dtrain's resnet18 against the PyTorch ResNet peer, step for step (CTest label torch).

    /usr/bin/python3 resnet_fidelity_test.py PATH/TO/dtrain PEERS_DIR [DATA_DIR]

PEERS_DIR holds torch_resnet_peer.py (the team's shared peer; its ResNet18 class is the model
compared with, so the two cannot drift apart). PyTorch writes the peer model's initial state_dict
(parameters and BatchNorm buffers) to a safetensors file; PyTorch and dtrain (--init-weights,
--shuffle off: the batches in dataset order) then train it in training mode for 2 steps of 64
Fashion-MNIST samples with SGD (lr 0.05, momentum 0.9, weight decay 5e-4, the peer's settings),
PyTorch in float32 and in float64, and for every state_dict tensor (running means and variances
included) dtrain's distance from PyTorch float64 must be at most twice PyTorch float32's own
(+ 1e-6), distances as max|w - w64| / max|w64|; num_batches_tracked exactly equal.

Note [ResNet fidelity in float32 rounding]: the issue asked for 50 steps within 1e-4 of the peer.
This training is chaotic in float32: PyTorch's own float32 run is 1e-2 (relative) from its
float64 run after ONE step in the BatchNorm biases (their gradients are channel sums that cancel
to ~1e-3 of their terms) and 1.6 after 50 steps (measured: layer1.1.bn1.bias 1.58, dtrain 1.46
from float64 there), so no float32 implementation can stay within 1e-4 of another for 50 steps.
What holds instead, and what this test checks: dtrain is as close to the exact (float64)
trajectory as PyTorch float32 is (after 1 step every tensor's two distances agree within 3%).
dtrain's final
model.safetensors then loads into the peer's model with strict=True (and PyTorch's file loaded
into dtrain strictly is the --init-weights above). Exit 77 (CTest: skipped) with the reason when
torch cannot be imported or the peer or the data is missing.
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


def train_torch(init, x, y, dtype):
    model = ResNet18(WIDTH).to(dtype)
    model.load_state_dict(init, strict=True)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        xs = x[step * BATCH:(step + 1) * BATCH].to(dtype)
        F.cross_entropy(model(xs), y[step * BATCH:(step + 1) * BATCH]).backward()
        opt.step()
    return model.state_dict()


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ResNet18(WIDTH)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = load("train").tensors
    x, y = x[:STEPS * BATCH], y[:STEPS * BATCH]
    with tempfile.TemporaryDirectory(prefix="dtrain_resnet_") as work:
        init_path = os.path.join(work, "init.safetensors")
        safetensors_io.save(init_path, init, {"format": "pt"})
        ck = os.path.join(work, "ck")
        dtrain("train", "--model", "resnet18", "--width", str(WIDTH), "--data", DATA, "--train-limit",
               str(STEPS * BATCH), "--test-limit", "100", "--epochs", "1", "--batch-size", str(BATCH), "--shuffle",
               "off", "--init-weights", init_path, "--threads", "1", "--optimizer", "sgd", "--lr", str(LR),
               "--momentum", str(MOMENTUM), "--weight-decay", str(WEIGHT_DECAY), "--checkpoint-dir", ck, "--quiet")
        with open(os.path.join(ck, "latest")) as f:
            weights, _ = safetensors_io.load(os.path.join(ck, f.read().strip(), "model.safetensors"))

    reference = train_torch(init, x, y, torch.float32)
    exact = train_torch(init, x, y, torch.float64)
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
