"""The torch.tpu module, torch.accelerator, streams, events, RNG and memory stats."""
import pytest
import torch
import torch_tpu


def test_registration():
    assert torch._C._get_privateuse1_backend_name() == "tpu"
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.accelerator.current_accelerator().type == "tpu"
    t = torch.ones(2, device="tpu")
    assert t.is_tpu and t.device == torch.device("tpu:0")
    assert torch.ones(2).tpu().is_tpu
    m = torch.nn.Linear(2, 2).tpu()
    assert m.weight.is_tpu
    assert t.untyped_storage().is_tpu if hasattr(t.untyped_storage(), "is_tpu") else True
    assert torch.tpu.is_initialized()


def test_properties():
    p = torch.tpu.get_device_properties(0)
    assert "vTPU" in p.name and p.total_memory > 0
    assert p.matrix_unit in ("AMX", "AVX512-BF16", "AVX2-FMA", "portable")
    assert torch.tpu.get_device_name() == p.name
    assert torch.tpu.current_device() == 0


def test_device_index_beyond_count():
    n = torch.tpu.device_count()
    with pytest.raises(RuntimeError, match=f"{n} tpu device"):
        torch.tpu.set_device(n)
    with pytest.raises(RuntimeError, match="tpu device"):
        torch.empty(2, device=f"tpu:{n}")
    with pytest.raises(RuntimeError, match="tpu device"):
        torch.tpu.get_device_properties(n + 3)


def test_device_context_manager():
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0


def test_streams_and_events():
    s = torch.tpu.Stream()
    assert s.device.type == "tpu"
    d = torch.tpu.default_stream()
    assert d.stream_id == 0
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() == s
        x = torch.ones(1000, device="tpu")
        y = x * 3
        e = torch.Event(device="tpu", enable_timing=True)
        e.record()
    assert torch.tpu.current_stream() == d
    e.synchronize()
    assert e.query()
    s.synchronize()
    assert s.query()
    start = torch.Event(device="tpu", enable_timing=True)
    end = torch.Event(device="tpu", enable_timing=True)
    start.record()
    z = (y @ y.reshape(1000, 1).expand(1000, 50).contiguous().T.contiguous().T).sum()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    # The default stream waits for s's work through an event.
    ev = s.record_event()
    d.wait_event(ev)
    assert y.cpu()[0].item() == 3 and z.item() == pytest.approx(9000 * 50, rel=1e-5)


def test_cross_stream_ordering():
    s1 = torch.tpu.Stream()
    with torch.tpu.stream(s1):
        a = torch.full((1 << 16,), 2.0, device="tpu")
        for _ in range(20):
            a = a + 1
    ev = torch.Event(device="tpu")
    ev.record(s1)
    torch.tpu.current_stream().wait_event(ev)
    b = a * 2
    assert b.cpu()[5].item() == 44.0
    a.record_stream(torch.tpu.current_stream())


def test_rng_state_and_seeds():
    torch.tpu.manual_seed(123)
    a = torch.randn(100, device="tpu")
    state = torch.tpu.get_rng_state()
    b = torch.randn(100, device="tpu")
    torch.tpu.set_rng_state(state)
    c = torch.randn(100, device="tpu")
    assert torch.equal(b.cpu(), c.cpu())
    torch.tpu.manual_seed(123)
    assert torch.equal(a.cpu(), torch.randn(100, device="tpu").cpu())
    assert torch.tpu.initial_seed() == 123
    torch.manual_seed(7)          # torch.manual_seed seeds tpu too
    d = torch.rand(10, device="tpu")
    torch.tpu.manual_seed_all(7)
    assert torch.equal(d.cpu(), torch.rand(10, device="tpu").cpu())
    g = torch.Generator(device="tpu")
    g.manual_seed(5)
    e = torch.rand(10, device="tpu", generator=g)
    g.manual_seed(5)
    assert torch.equal(e.cpu(), torch.rand(10, device="tpu", generator=g).cpu())
    torch.tpu.seed()
    assert isinstance(torch.tpu.initial_seed(), int)


def test_random_distributions():
    torch.tpu.manual_seed(0)
    u = torch.empty(200000, device="tpu").uniform_(2, 3).cpu()
    assert 2 <= u.min() and u.max() < 3 and abs(u.mean() - 2.5) < 0.01
    n = torch.randn(200000, device="tpu").cpu()
    assert abs(n.mean()) < 0.01 and abs(n.std() - 1) < 0.01
    b = torch.bernoulli(torch.full((100000,), 0.25, device="tpu")).cpu()
    assert abs(b.mean() - 0.25) < 0.01
    r = torch.randint(3, 9, (100000,), device="tpu").cpu()
    assert r.min() == 3 and r.max() == 8 and r.dtype == torch.int64
    p = torch.randperm(10, device="tpu") if False else None  # randperm runs through the CPU fallback
    x = torch.ones(1000, device="tpu")
    y = torch.nn.functional.dropout(x, 0.5, training=True).cpu()
    assert set(y.unique().tolist()) <= {0.0, 2.0}


def test_memory_stats_and_empty_cache():
    torch.tpu.empty_cache()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    x = torch.empty(1 << 20, device="tpu")
    assert torch.tpu.memory_allocated() >= base + 4 * (1 << 20)
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()
    del x
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.max_memory_allocated() >= base + 4 * (1 << 20)
    assert torch.tpu.memory_reserved() >= 4 * (1 << 20)
    torch.tpu.empty_cache()
    assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated()
    free, total = torch.tpu.mem_get_info()
    assert total == torch.tpu.get_device_properties().total_memory and 0 < free <= total
    st = torch.tpu.memory_stats()
    assert st["allocated_bytes.all.current"] == base and st["num_ooms"] >= 0
    # torch.accelerator.memory goes through our c10::DeviceAllocator
    assert torch.accelerator.memory_allocated() == base
    assert torch.accelerator.memory_reserved() >= base


def test_eager_mode_api():
    mode = torch_tpu.get_eager_mode()
    with torch_tpu.eager_mode("debug"):
        assert torch_tpu.get_eager_mode() == "debug"
    assert torch_tpu.get_eager_mode() == mode
    with torch_tpu.eager_mode("fused"):
        assert torch_tpu.get_eager_mode() == "fused"
    with torch_tpu.eager_mode("defer_and_fuse"):
        assert torch_tpu.get_eager_mode() == "fused"
    assert torch_tpu.get_eager_mode() == mode
    with pytest.raises(ValueError, match=r"unknown eager mode 'bogus'; expected one of \['debug', 'fused', 'strict'\]"):
        torch_tpu.set_eager_mode("bogus")
    assert torch_tpu.get_eager_mode() == mode


def test_pin_memory_and_non_blocking():
    x = torch.randn(1000)
    p = x.pin_memory()
    assert p.is_pinned()
    t = p.to("tpu", non_blocking=True)
    back = torch.empty(1000).pin_memory()
    back.copy_(t, non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(back, x)


def test_two_chips():
    """With TPU_NUM_DEVICES=2: tensors on tpu:1, copies between chips, per-chip memory stats."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import torch
        assert torch.tpu.device_count() == 2
        a = torch.arange(12.0).reshape(3, 4)
        t1 = a.to("tpu:1")
        assert t1.device == torch.device("tpu:1")
        assert torch.tpu.memory_allocated(1) > 0 and torch.tpu.memory_allocated(0) == 0
        t0 = (t1 * 2).to("tpu:0")
        assert t0.device.index == 0 and torch.equal(t0.cpu(), a * 2)
        nc = t1.t().to("tpu:0")                      # non-contiguous source on another chip
        assert torch.equal(nc.cpu(), a.t())
        with torch.tpu.device(1):
            x = torch.ones(5, device="tpu")
            assert x.device.index == 1 and torch.tpu.current_device() == 1
        assert torch.tpu.current_device() == 0
        try:
            t0 + t1
        except RuntimeError as e:
            assert "same device" in str(e), e
        else:
            raise SystemExit("mixing chips did not raise")
        m = torch.nn.Linear(4, 2).to("tpu:1")
        y = m(t1).sum()
        y.backward()
        assert m.weight.grad.device.index == 1
        print("ok")
    """)
    env = dict(__import__("os").environ, TPU_NUM_DEVICES="2")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
