"""The PyTorch side of the GPU comparison in the README ("GPU users"): the peer's GPT
(../shared/peers/torch_gpt_peer.py, its classes unchanged but for device placement) on one GPU
at GPT-2 124M's shape, bf16 autocast, TF32, fused AdamW, clipping; median step time of steps
4.. -> tokens/s. --sdpa: attention through F.scaled_dot_product_attention (flash), as nanoGPT
does; without it the T x T scores are materialised, as dtrain does.
  python3 bench/torch_gpt_gpu.py --data DIR [--sdpa] [--steps 20] [--batch 8]
DIR holds byte shards (dtrain data shard --bytes ... -o DIR); DTRAIN_PEER_DIR overrides where
the peer lives."""
import argparse, math, sys, time, os, torch, torch.nn.functional as F
sys.path.insert(0, os.environ.get("DTRAIN_PEER_DIR",
                                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/peers")))
import torch_gpt_peer as P  # noqa: E402
a = argparse.ArgumentParser(); a.add_argument("--data"); a.add_argument("--sdpa", action="store_true")
a.add_argument("--steps", type=int, default=20); a.add_argument("--batch", type=int, default=8)
a.add_argument("--compile", action="store_true")
a = a.parse_args()
L, H, C, T, V, B = 12, 12, 768, 1024, 50257, a.batch
def attn_fwd(self, x):
    Bq, Tq, Cq = x.shape
    q, k, v = self.c_attn(x).split(Cq, dim=2)
    q, k, v = (t.view(Bq, Tq, self.H, Cq // self.H).transpose(1, 2) for t in (q, k, v))
    if a.sdpa:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(Cq // self.H))
        att = att.masked_fill(~self.mask[:Tq, :Tq], float("-inf")).softmax(dim=-1)
        y = att @ v
    return self.c_proj(y.transpose(1, 2).contiguous().view(Bq, Tq, Cq))
P.Attention.forward = attn_fwd
def gpt_fwd(self, idx, targets):
    t = self.transformer
    x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device))
    for blk in t.h: x = blk(x)
    logits = self.lm_head(t.ln_f(x))
    return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))
P.Gpt.forward = gpt_fwd
torch.manual_seed(0); torch.backends.cuda.matmul.allow_tf32 = True
m = P.Gpt(V, T, L, H, C).cuda()
for blk in m.transformer.h: blk.attn.mask = blk.attn.mask.cuda()
opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), fused=True)
step_fn = torch.compile(m) if a.compile else m
tok = P.tokens(a.data, "train")
times = []
for s in range(a.steps):
    x, y = P.batch(tok, s, 0, 1, B, T)
    x, y = x.long().cuda(non_blocking=True), y.long().cuda(non_blocking=True)
    torch.cuda.synchronize(); t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step_fn(x, y)
    loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
w = sorted(times[3:]); med = w[len(w) // 2]
print(f"torch {torch.__version__} {'sdpa' if a.sdpa else 'materialised'}{' compiled' if a.compile else ''} B{B} T{T}: "
      f"median step {med*1e3:.1f} ms, {B*T/med:,.0f} tokens/s, loss {loss.item():.4f}, peak {torch.cuda.max_memory_allocated()/2**30:.2f} GiB")
