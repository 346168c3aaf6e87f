"""The same training script on "cpu" and on "tpu": the only difference is the device string.

Prints both loss curves (they agree within float tolerance) and the time per step.
"""
import time

import torch
import torch.nn.functional as F


def run(device: str, steps: int = 30, opt_name: str = "adamw"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).to(device)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3) if opt_name == "adamw"
           else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    g = torch.Generator().manual_seed(1)
    X = torch.randn(4096, 256, generator=g)
    W = torch.randn(256, 10, generator=g)
    Y = (X @ W).argmax(1)                                   # a learnable synthetic task
    losses, times = [], []
    for step in range(steps):
        i = (step * 128) % 4096
        x, y = X[i:i + 128].to(device), Y[i:i + 128].to(device)
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())                          # .item() waits for the device
        times.append(time.perf_counter() - t0)
    return losses, times


def main():
    import torch_tpu  # noqa: F401  (torch autoloads it; imported here only to report fallbacks)
    for opt_name in ("sgd", "adamw"):
        cpu_l, cpu_t = run("cpu", opt_name=opt_name)
        tpu_l, tpu_t = run("tpu", opt_name=opt_name)
        print(f"\n== MLP 256-512-512-10, batch 128, {opt_name}")
        print(f"{'step':>4} {'cpu loss':>10} {'tpu loss':>10} {'|diff|':>9}")
        for s in range(0, len(cpu_l), 3):
            print(f"{s:4d} {cpu_l[s]:10.5f} {tpu_l[s]:10.5f} {abs(cpu_l[s] - tpu_l[s]):9.2e}")
        med = lambda v: sorted(v[5:])[len(v[5:]) // 2] * 1e3
        print(f"time per step (median after warm-up): cpu {med(cpu_t):.2f} ms, tpu {med(tpu_t):.2f} ms")
        worst = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(cpu_l, tpu_l))
        print(f"largest relative loss difference: {worst:.2e}", "(equal within tolerance)" if worst < 1e-3 else "MISMATCH")
        if worst >= 1e-3:
            raise SystemExit(1)
    fb = torch_tpu.fallback_counts()
    print("\nops that fell back to the CPU:", fb if fb else "none")


if __name__ == "__main__":
    main()
