"""Join's buffer source against PyTorch DDP's, with uneven inputs at 3 ranks (CTest label torch).

    /usr/bin/python3 join_buffers_test.py PATH/TO/dtrain PEERS_DIR [DATA_DIR]

PyTorch's DDP (broadcast_buffers=True) broadcasts the BatchNorm buffers before each forward from
rank 0, but under Join from the highest rank that still has data (DDP's _find_common_rank): the
joined ranks' statistics are stale. dtrain does the same (Note [Buffer broadcast] in
ddp/distributed_data_parallel.cpp; the trainer sets the source from Join's vote each step). Here
98 Fashion-MNIST samples go to 3 ranks in dataset order (rank r takes samples r, r+3, ...: 33, 33
and 32), batch 16: ranks 0 and 1 run 3 steps, rank 2 joins after 2. At the third step the source
is rank 1, so rank 0's final running statistics are its update of RANK 1's statistics; with rank
0 as the source they would be its update of its own, which differ by a tenth of two batches'
means. PyTorch DDP + Join (gloo, 3 processes, the peer's ResNet18 at width 4) and dtrain
(--sampler uneven --shuffle off, same initial weights) must end with the same rank-0 state:
every running mean and variance within 1e-3 of its tensor's largest value, num_batches_tracked
equal, the parameters within 5e-4 (absolute). Measured: 6.2e-5 and 9.8e-5 (the last step's
one-sample batches amplify float32 rounding: 99 samples without Join give the same), against
9.0e-2 in the running means with rank 0 as the source (the mutant in tests/README.md).
JOIN_TEST_SAMPLES / JOIN_TEST_RANKS change the split (for such checks). Exit 77 (skipped) with
the reason when torch, the peer or the data is missing.
"""
import os
import socket
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.algorithms.join import Join
    from torch.nn import functional as F
except Exception as e:  # noqa: BLE001 - any import failure means: skip, saying why
    print(f"skipped: /usr/bin/python3 cannot import torch: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

DTRAIN = os.path.abspath(sys.argv[1])
PEERS = sys.argv[2] if len(sys.argv) > 2 else ""
DATA = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
RANKS, SAMPLES, BATCH, WIDTH = int(os.environ.get("JOIN_TEST_RANKS", "3")), int(os.environ.get("JOIN_TEST_SAMPLES", "98")), 16, 4
LR = 1e-3  # small: the weights' float32 rounding stays far below the buffer source's effect
BOUND = 1e-3
PARAM_BOUND = 5e-4
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_rank(rank, port, init_path, out_path):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    model = ResNet18(WIDTH)
    init, _ = safetensors_io.load(init_path)
    model.load_state_dict(init, strict=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)  # broadcast_buffers=True
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    x, y = load("train").tensors
    mine = list(range(rank, SAMPLES, RANKS))  # dtrain's --sampler uneven --shuffle off
    with Join([ddp]):
        for b in range(0, len(mine), BATCH):
            rows = torch.tensor(mine[b:b + BATCH])
            opt.zero_grad()
            F.cross_entropy(ddp(x[rows]), y[rows]).backward()
            opt.step()
            # Rank 0's own state after each of its steps: on leaving the Join context PyTorch
            # broadcasts the last joiner's parameters and buffers to every rank (dtrain keeps the
            # replicas equal step by step instead), which would hide what rank 0 computed.
            final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if rank == 0:
        safetensors_io.save(out_path, final, {"format": "pt"})
    # Every rank has left Join's last collective. Tearing DDP and gloo down at interpreter exit
    # hung now and then here (1 run in 4: a rank stuck after torch_rank returned), so end at once.
    sys.stdout.flush()
    os._exit(0)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    init = {k: v.detach().clone() for k, v in ResNet18(WIDTH).state_dict().items()}
    with tempfile.TemporaryDirectory(prefix="dtrain_join_") as work:
        init_path = os.path.join(work, "init.safetensors")
        safetensors_io.save(init_path, init, {"format": "pt"})
        theirs_path = os.path.join(work, "torch.safetensors")
        mp.spawn(torch_rank, args=(free_port(), init_path, theirs_path), nprocs=RANKS)
        theirs, _ = safetensors_io.load(theirs_path)
        ck = os.path.join(work, "ck")
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OPENBLAS_NUM_THREADS="1")
        cmd = [os.environ.get("DTRAIN_MPIEXEC", "mpirun"), "-np", str(RANKS), "--oversubscribe", DTRAIN, "train", "--model", "resnet18", "--width",
               str(WIDTH), "--data", DATA, "--train-limit", str(SAMPLES), "--test-limit", "100", "--epochs", "1",
               "--batch-size", str(BATCH), "--sampler", "uneven", "--shuffle", "off", "--init-weights", init_path,
               "--threads", "1", "--optimizer", "sgd", "--lr", str(LR), "--momentum", "0", "--weight-decay", "0",
               "--checkpoint-dir", ck, "--quiet"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-2000:])
            raise SystemExit(f"FAIL dtrain: exit {r.returncode}")
        with open(os.path.join(ck, "latest")) as f:
            ours, _ = safetensors_io.load(os.path.join(ck, f.read().strip(), "model.safetensors"))

    check(set(ours) == set(theirs), "dtrain's model.safetensors holds the peer's state_dict names")
    worst = {"running": (0.0, ""), "param": (0.0, "")}
    counts_ok = True
    for name, w in theirs.items():
        if name not in ours:
            continue
        d = ours[name]
        if name.endswith("num_batches_tracked"):
            counts_ok = counts_ok and int(d) == int(w) == 3
            continue
        kind = "running" if name.endswith(("running_mean", "running_var")) else "param"
        # Parameters: absolute, since BatchNorm's biases start at 0 and after 3 small steps hold
        # float32 noise of channel sums that cancel (relative to their largest value, ~3e-2 at
        # np 1 already); the statistics: relative to the largest value.
        rel = (d.double() - w.double()).abs().max().item()
        if kind == "running":
            rel /= max(w.double().abs().max().item(), 1e-30)
        if rel > worst[kind][0]:
            worst[kind] = (rel, name)
    print(f"     worst running statistic: {worst['running'][1]} {worst['running'][0]:.2e}; "
          f"worst parameter: {worst['param'][1]} {worst['param'][0]:.2e}")
    check(counts_ok, "num_batches_tracked is 3 on rank 0 on both sides (rank 0 ran 3 forwards)")
    check(worst["running"][0] <= BOUND, f"rank 0's running statistics equal PyTorch DDP + Join's within {BOUND:g} "
          f"(the third step's buffers came from rank 1, the highest rank with data)")
    check(worst["param"][0] <= PARAM_BOUND, f"rank 0's parameters equal PyTorch's within {PARAM_BOUND:g} (absolute)")
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
