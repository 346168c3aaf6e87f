"""torch.save / torch.load of tpu tensors and modules."""
import io

import torch


def test_save_load_tensor_and_module(tmp_path):
    x = torch.randn(5, 3)
    t = x.tpu()
    path = tmp_path / "t.pt"
    torch.save({"t": t, "m": torch.nn.Linear(3, 2).tpu().state_dict()}, path)
    back = torch.load(path, weights_only=True)
    assert back["t"].device.type == "tpu" and torch.equal(back["t"].cpu(), x)
    assert back["m"]["weight"].is_tpu
    cpu = torch.load(path, map_location="cpu", weights_only=True)
    assert cpu["t"].device.type == "cpu" and torch.equal(cpu["t"], x)
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    moved = torch.load(buf, map_location="tpu", weights_only=True)
    assert moved.is_tpu and torch.equal(moved.cpu(), x)
    m = torch.nn.Linear(3, 2)
    m.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["m"])
    m2 = torch.nn.Linear(3, 2).tpu()
    m2.load_state_dict(back["m"])
    assert torch.equal(m2.weight.cpu(), m.weight)
