"""A small training loop gives the same losses on tpu as on CPU."""
import pytest
import torch
import torch.nn.functional as F
import torch_tpu


def train(device, opt_name, steps=6, dropout=0.0, foreach=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                                torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 5)).to(device)
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=foreach)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, foreach=foreach)
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(256, 20, generator=g), torch.randint(0, 5, (256,), generator=g)
    losses = []
    for i in range(steps):
        x, y = X[i * 32:(i + 1) * 32].to(device), Y[i * 32:(i + 1) * 32].to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("foreach", [None, False])
def test_mlp_training_matches_cpu(opt_name, foreach):
    torch_tpu.reset_fallback_counts()
    cpu_losses, cpu_model = train("cpu", opt_name, foreach=foreach)
    tpu_losses, tpu_model = train("tpu", opt_name, foreach=foreach)
    assert tpu_losses == pytest.approx(cpu_losses, rel=1e-4, abs=1e-5)
    for a, b in zip(tpu_model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), atol=1e-4, rtol=1e-4)
    # The training step runs natively: no op fell back to the CPU.
    assert torch_tpu.fallback_counts() == {}


def test_training_with_dropout_runs_natively():
    torch_tpu.reset_fallback_counts()
    losses, _ = train("tpu", "adamw", steps=4, dropout=0.2)
    assert all(l == l and l < 10 for l in losses)
    assert torch_tpu.fallback_counts() == {}
