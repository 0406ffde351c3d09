"""dtrain's GPT against the PyTorch peer (torch_gpt_peer.py), step for step (CTest label torch).

    /usr/bin/python3 gpt_fidelity_test.py PATH/TO/dtrain PEERS_DIR

PEERS_DIR holds torch_gpt_peer.py and llmc_shards.py (the team's shared peers; the test imports
the peer's Gpt and lr_at, so the model and the schedule are the peer's own, not a re-statement).
Byte-level shards of a small text (the json package of Python's standard library) are written
with llmc_shards.py; the peer's model (L2 H2 C32 T32, vocabulary 256, seed 0) saves its initial
weights to safetensors (lm_head.weight left out: it is wte); PyTorch then trains it for 50 AdamW
steps in one process exactly as the peer's worker does (warm-up 10, cosine to lr/10, clipping at
1.0, betas 0.9/0.95, weight decay 0.1 on tensors of 2+ dimensions, batch 4, shuffle off: step s
reads slot s), and dtrain trains from the same file with the same settings (--init-weights,
--shuffle off). Checks:
  1. every tensor of dtrain's final model.safetensors within 1e-4 of PyTorch's
     (max|w_dtrain - w_torch| / max|w_torch|, per tensor), but for the key third of each
     c_attn.bias at the peer's eps 1e-8, held to 1e-3 around its exact value 0 (Note [The key
     bias]); a second pair of runs at AdamW eps
     1e-6 holds every tensor, key bias included, to the same bound;
  2. the peer's model loads dtrain's file with strict=True (lm_head.weight re-tied to wte), and
     its validation loss over val slots 0..K-1 (the peer's batch() at rank 0 of 1) equals the
     val_loss dtrain's --json line reports (--eval-batches K) within 1e-5;
     `dtrain eval --weights CHECKPOINT --eval-batches K` prints that loss too (1e-5);
  3. `dtrain sample --temperature 0` with dtrain's checkpoint prints the continuation the peer's
     model (dtrain's weights loaded) writes greedily from the same prompt, byte for byte.
Exit 77 (CTest: skipped) with the reason when torch cannot be imported or the peers are missing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import types

try:
    import torch
    from torch import nn
except Exception as e:  # noqa: BLE001 - any import failure means: skip, saying why
    print(f"skipped: /usr/bin/python3 cannot import torch: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

DTRAIN = os.path.abspath(sys.argv[1])
PEERS = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("DTRAIN_PEERS_DIR", ""))
if not all(os.path.isfile(os.path.join(PEERS, name)) for name in ("torch_gpt_peer.py", "llmc_shards.py")):
    print(f"skipped: torch_gpt_peer.py and llmc_shards.py not found in '{PEERS}' (pass the peers' folder)")
    sys.exit(77)
sys.path.insert(0, PEERS)
from torch_gpt_peer import Gpt, batch, lr_at, tokens  # noqa: E402
from llmc_shards import write_bytes_dataset  # noqa: E402

# Note [The key bias]
#   The key third of c_attn.bias (rows C..2C) has a gradient of exactly zero: adding b to every
#   key adds q.b to every score of a query, and softmax is invariant to that shift. What float32
#   computes is rounding noise (~1e-10), and AdamW at eps 1e-8 turns noise into steps of up to
#   lr * |g| / (|g| + eps) (Note [AdamW at eps 1e-8] in agreement_test.py): after 50 steps the
#   key bias is ~1e-6 in both programs, in different directions, while float64 PyTorch keeps it
#   at 0. Measured (L2 H2 C32, 50 steps): every other tensor within 3e-7 of PyTorch float32 (the
#   q and v thirds of c_attn.bias within 5e-9 absolutely); the key bias 1.2e-6 and 1.4e-6 from
#   PyTorch float32, which is itself 8.6e-7 from float64 (the whole tensor: 1.0e-4 and 1.4e-4 of
#   max|c_attn.bias| = 0.0146, against float32/float64 PyTorch's 5.9e-5). Being noise, it moves
#   with any change of summation order: dtrain's |b_k| / max|c_attn.bias| read 7.5e-5, then 8.8e-5
#   after the attention kernel changed its loop order, and 1.5e-4 under an unrelated mutant;
#   PyTorch's is 5.5e-5 to 5.9e-5. So at eps 1e-8 the key third is held to what it is, noise near
#   its exact value 0 (|b_k| <= KEY_BIAS_BOUND = 1e-3 of max|c_attn.bias|, 10x the weights' bound,
#   still far below any real update), and the rest to 1e-4; at eps 1e-6 the same noise moves it
#   100 times less, and every tensor whole, key bias included, is held to 1e-4.
TEXT = "/usr/lib/python3.11/json"
LAYERS, HEADS, EMBD, CONTEXT, VOCAB, BATCH = 2, 2, 32, 32, 256, 4
# The peer's hyper-parameters (its argparse defaults, but for the step count), as lr_at reads them.
HP = types.SimpleNamespace(lr=1e-3, warmup=10, steps=50, wd=0.1, clip=1.0)
EVAL_BATCHES = 4
WEIGHT_BOUND, LOSS_BOUND = 1e-4, 1e-5
KEY_BIAS_BOUND = 1e-3  # Note [The key bias]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def dtrain(*args):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    r = subprocess.run([DTRAIN, *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit(f"FAIL dtrain {' '.join(args)}: exit {r.returncode}")
    return r.stdout


def peer_model():
    return Gpt(VOCAB, CONTEXT, LAYERS, HEADS, EMBD)


def stored(model):
    """The state_dict as dtrain stores it: no lm_head.weight (it is wte, as in GPT-2's files)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def train_peer(init, train, eps=1e-8):
    """The peer's worker loop at world size 1, without the DDP wrapper (one process: no reduction)."""
    model = peer_model()
    model.load_state_dict({**init, "lm_head.weight": init["transformer.wte.weight"]}, strict=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HP.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=HP.lr, betas=(0.9, 0.95), eps=eps)
    for step in range(HP.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, HP)
        x, y = batch(train, step, 0, 1, BATCH, CONTEXT)
        opt.zero_grad(set_to_none=True)
        model(x, y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), HP.clip)
        opt.step()
    return model


def val_loss(model, val):
    with torch.no_grad():
        return sum(model(*batch(val, i, 0, 1, BATCH, CONTEXT)).item() for i in range(EVAL_BATCHES)) / EVAL_BATCHES


def greedy(model, prompt, n):
    """The peer's model continuing `prompt` (bytes) by n bytes, each the argmax (the lowest id
    among equals, as torch.argmax) over a window of the last CONTEXT bytes."""
    ids = list(prompt)
    t = model.transformer
    with torch.no_grad():
        for _ in range(n):
            w = torch.tensor([ids[-CONTEXT:]])
            x = t.wte(w) + t.wpe(torch.arange(w.shape[1]))
            for block in t.h:
                x = block(x)
            ids.append(int(model.lm_head(t.ln_f(x))[0, -1].argmax()))
    return bytes(ids)


def train_dtrain(work, data, init_path, eps):
    ck = os.path.join(work, f"ck-eps{eps}")
    out = dtrain("train", "--model", "gpt", "--layers", str(LAYERS), "--heads", str(HEADS), "--embd", str(EMBD),
                 "--context", str(CONTEXT), "--data", data, "--batch-size", str(BATCH),
                 "--init-weights", init_path, "--shuffle", "off", "--steps", str(HP.steps),
                 "--warmup-steps", str(HP.warmup), "--lr-schedule", "cosine", "--lr", str(HP.lr),
                 "--optimizer", "adamw", "--beta2", "0.95", "--adam-eps", eps, "--weight-decay", str(HP.wd),
                 "--clip-grad-norm", str(HP.clip), "--eval-batches", str(EVAL_BATCHES), "--threads", "1",
                 "--checkpoint-dir", ck, "--quiet", "--json")
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    with open(os.path.join(ck, "latest")) as f:
        weights, metadata = safetensors_io.load(os.path.join(ck, f.read().strip(), "model.safetensors"))
    return summary, weights, metadata, ck


def compare_weights(weights, expected, what, key_bias_apart):
    check(set(weights) == set(expected),
          f"{what}: dtrain's file holds the peer's tensors, no more, no less (extra "
          f"{sorted(set(weights) - set(expected))}, missing {sorted(set(expected) - set(weights))})")
    worst = 0.0
    for name, w in expected.items():
        if name not in weights:
            continue
        d, scale = weights[name], w.abs().max()
        if key_bias_apart and name.endswith("attn.c_attn.bias"):
            key = slice(EMBD, 2 * EMBD)
            rest = torch.cat([(d - w)[:EMBD], (d - w)[2 * EMBD:]])
            rel = (rest.abs().max() / scale).item()
            noise = (d[key].abs().max() / scale).item()
            print(f"     {name:36s} max|d|/max|w| = {rel:.2e} (q, v); key bias |b_k|/max|w| = {noise:.2e}, "
                  f"the peer's {(w[key].abs().max() / scale).item():.2e}, differing by "
                  f"{((d - w)[key].abs().max() / scale).item():.2e}")
            check(noise <= KEY_BIAS_BOUND, f"{what}: {name}'s key bias stays rounding noise near its exact value 0 "
                                           f"(Note [The key bias]): {noise:.2e} <= {KEY_BIAS_BOUND:g}")
        else:
            rel = ((d - w).abs().max() / scale).item()
            print(f"     {name:36s} max|d|/max|w| = {rel:.2e}")
        worst = max(worst, rel)
    check(worst <= WEIGHT_BOUND, f"{what}: {HP.steps} AdamW steps (warm-up, cosine, clip): every tensor within "
                                 f"{WEIGHT_BOUND:g} of the peer's (worst {worst:.2e})")


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dtrain_gpt_torch_") as work:
        data = os.path.join(work, "shards")
        write_bytes_dataset(data, [TEXT])
        train, val = tokens(data, "train"), tokens(data, "val")
        init = stored(peer_model())
        init_path = os.path.join(work, "init.safetensors")
        safetensors_io.save(init_path, init, {"format": "pt"})

        reference = train_peer(init, train)
        summary, weights, metadata, ck = train_dtrain(work, data, init_path, "1e-8")
        compare_weights(weights, stored(reference), "eps 1e-8 (the peer's)", key_bias_apart=True)
        _, weights_eps6, _, _ = train_dtrain(work, data, init_path, "1e-6")
        compare_weights(weights_eps6, stored(train_peer(init, train, eps=1e-6)), "eps 1e-6", key_bias_apart=False)

        loaded = peer_model()
        loaded.load_state_dict({**weights, "lm_head.weight": weights["transformer.wte.weight"]}, strict=True)
        loaded.lm_head.weight = loaded.transformer.wte.weight  # re-tied: one tensor again, as the peer builds it
        check(loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr(), "lm_head re-tied to wte")
        peer_val = val_loss(loaded, val)
        got = summary.get("val_loss")
        check(got is not None and abs(peer_val - got) <= LOSS_BOUND,
              f"the peer's validation loss with dtrain's weights over {EVAL_BATCHES} val slots, {peer_val:.7f}, "
              f"equals dtrain's --json val_loss {got} (bound {LOSS_BOUND:g})")
        out = dtrain("eval", "--weights", ck, "--data", data, "--eval-batches", str(EVAL_BATCHES), "--batch-size",
                     str(BATCH), "--threads", "1")
        m = re.search(r"^val loss ([0-9.]+) \| perplexity", out, re.M)
        check(m is not None and abs(peer_val - float(m[1])) <= LOSS_BOUND,
              f"dtrain eval of dtrain's weights over the same {EVAL_BATCHES} val slots, "
              f"{m[1] if m else out.strip()[-200:]!r}, equals the peer's {peer_val:.7f} (bound {LOSS_BOUND:g})")
        prompt, n = b"import json\ndef ", 48  # longer than the context by the end: the window slides
        want = greedy(loaded, prompt, n)
        r = subprocess.run([DTRAIN, "sample", "--weights", ck, "--prompt", prompt.decode(), "--tokens", str(n),
                            "--temperature", "0", "--threads", "1"], capture_output=True,
                           env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        got = r.stdout[:-1] if r.stdout.endswith(b"\n") else r.stdout
        check(r.returncode == 0 and got == want,
              f"dtrain sample --temperature 0 writes the peer's greedy continuation: {got!r} (exit {r.returncode}, "
              f"{r.stderr.decode()[-300:].strip()}) vs the peer's {want!r}")
        print(f"     (the peer's own weights: val loss {val_loss(reference, val):.7f}; "
              f"metadata dtrain.model={metadata.get('dtrain.model')})")
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
