"""FSDP2 on two tpu ranks: GPT-2-small-shaped layers (hidden 768, 12 heads,
MLP 3072, GPT-2's vocabulary cut to 8192 for speed) trained with
`fully_shard` per block, beside the same model trained in one process on
the whole batch. The two loss curves agree within float tolerance.

    python examples/train_fsdp.py            # spawns 2 ranks itself (make run-dist)
    torchrun --nproc_per_node 2 examples/train_fsdp.py

Each rank holds half of every parameter and optimizer state; the
all-gathers and reduce-scatters go through tpu_dist (the default backend
for tpu), over shared memory between the ranks' processes.
"""
import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HIDDEN, HEADS, LAYERS, VOCAB, SEQ, BATCH, STEPS = 768, 12, 2, 8192, 64, 4, 8


class Block(nn.Module):  # GPT-2's block: pre-norm attention and MLP with residuals
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.fc, self.out = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, HIDDEN // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, HIDDEN))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f, self.head = nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def batches(world):  # a learnable language: each token follows from the one before
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        cols = [torch.randint(0, VOCAB, (BATCH * world,), generator=g)]
        for _ in range(SEQ):
            cols.append((cols[-1] * 7 + 3) % VOCAB)
        yield torch.stack(cols, 1)


def train(model, opt, data, part):
    losses, times = [], []
    for tokens in data:
        x, y = tokens[part, :-1].to("tpu"), tokens[part, 1:].to("tpu")
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss = loss.detach()
        if dist.is_initialized():
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # the whole batch's loss: the mean of equal halves
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    return losses, times


def rank_main(rank, world):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = GPT().to("tpu")
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    part = slice(rank * BATCH, (rank + 1) * BATCH)
    losses, times = train(model, opt, batches(world), part)
    shard = sum(p.to_local().numel() for p in model.parameters())
    full = sum(p.numel() for p in model.parameters())
    return losses, times, shard, full


def single_process(world):
    torch.manual_seed(0)
    model = GPT().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return train(model, opt, batches(world), slice(None))


def report(losses, times, shard, full, world):
    ref, ref_times = single_process(world)
    print(f"== GPT-2-small-shaped layers ({LAYERS} blocks, hidden {HIDDEN}, vocab {VOCAB}), "
          f"FSDP2 on {world} ranks vs one process, global batch {BATCH * world} x {SEQ}")
    print(f"parameters: {full:,} in all, {shard:,} on rank 0 ({shard / full:.0%})")
    print(f"{'step':>4} {'1 process':>10} {f'FSDP2 x{world}':>10} {'|diff|':>9}")
    for s, (a, b) in enumerate(zip(ref, losses)):
        print(f"{s:4d} {a:10.5f} {b:10.5f} {abs(a - b):9.2e}")
    med = lambda v: sorted(v[1:])[len(v[1:]) // 2] * 1e3
    print(f"time per step (median after the first): 1 process {med(ref_times):.0f} ms, "
          f"FSDP2 x{world} {med(times):.0f} ms (both ranks share this machine's cores)")
    worst = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(ref, losses))
    ok = worst < 1e-4
    print(f"largest relative loss difference: {worst:.2e}", "(equal within tolerance)" if ok else "MISMATCH")
    return ok


def _spawned(rank, world, init_file, q):
    try:
        import torch_tpu  # noqa: F401
        dist.init_process_group(init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        q.put((rank, rank_main(rank, world)))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put((rank, e))


def main():
    import torch_tpu  # noqa: F401
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group()
        rank, world = dist.get_rank(), dist.get_world_size()
        res = rank_main(rank, world)
        dist.destroy_process_group()
        if rank == 0 and not report(*res, world):
            sys.exit(1)
        return
    import torch.multiprocessing as mp
    world = 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init_file = os.path.join(tempfile.mkdtemp(prefix="tpu_fsdp_"), "init")
    procs = [ctx.Process(target=_spawned, args=(r, world, init_file, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=600) for _ in range(world))
    for p in procs:
        p.join()
    for r, v in results.items():
        if isinstance(v, BaseException):
            raise RuntimeError(f"rank {r} failed") from v
    if not report(*results[0], world):
        sys.exit(1)


if __name__ == "__main__":
    main()
