"""Streams and events: torch.tpu.Event / Stream with every torch.Stream, torch.Event and
torch.accelerator API, the fixed pool of hardware queues, and Ctrl-C during host waits."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import assert_close


def _threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


def test_event_is_a_torch_event():
    e = torch.tpu.Event(enable_timing=True)
    assert type(e) is torch.Event and e.device.type == "tpu"
    assert isinstance(e, torch.tpu.Event)
    assert isinstance(torch.Event(device="tpu"), torch.tpu.Event)
    assert not isinstance(torch.Event(device="cpu"), torch.tpu.Event)
    assert not isinstance(object(), torch.tpu.Event)
    with pytest.raises(NotImplementedError, match="interprocess"):
        torch.tpu.Event(interprocess=True)


def test_elapsed_time_between_tpu_events():
    x = torch.randn(256, 256, device="tpu")
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        x = x @ x.t() / 256
    end.record()
    end.synchronize()
    assert end.query() and start.query()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and 0 < ms < 60_000
    # Mixed with events made through torch.Event and torch.Stream.record_event.
    other = torch.tpu.current_stream().record_event(torch.Event(device="tpu", enable_timing=True))
    other.synchronize()
    assert start.elapsed_time(other) >= ms
    no_timing = torch.tpu.Event()
    no_timing.record()
    no_timing.synchronize()
    with pytest.raises(ValueError, match="enable_timing=True"):   # c10::Event's own check
        start.elapsed_time(no_timing)


def test_stream_record_event_and_wait():
    s = torch.tpu.Stream()
    ev = s.record_event(torch.tpu.Event())
    assert type(ev) is torch.Event
    with torch.tpu.stream(s):
        a = torch.ones(1000, device="tpu")
        for _ in range(10):
            a = a + 1
    done = s.record_event()
    torch.tpu.current_stream().wait_event(done)
    a.record_stream(torch.tpu.current_stream())
    assert_close(a * 2, torch.full((1000,), 22.0))
    # torch.Event.record / wait with a torch.tpu.Stream, and Stream.wait_stream.
    e = torch.tpu.Event()
    e.record(s)
    e.wait(torch.tpu.current_stream())
    torch.tpu.default_stream().wait_stream(s)
    e.synchronize()
    assert e.query()


def test_streams_through_torch_apis():
    s = torch.tpu.Stream(priority=-1)
    assert s.priority == -1 and torch.tpu.Stream().priority == 0 and torch.tpu.default_stream().priority == 0
    assert isinstance(s, torch.Stream) and s.device == torch.device("tpu", 0)
    # Streams made by torch itself count as tpu streams.
    assert isinstance(torch.accelerator.current_stream(), torch.tpu.Stream)
    assert not isinstance(torch.Stream(device="cpu"), torch.tpu.Stream)
    g = torch.Stream(device="tpu")
    assert isinstance(g, torch.tpu.Stream) and g.device_type == s.device_type
    prev = torch.accelerator.current_stream()
    torch.accelerator.set_stream(g)
    try:
        assert torch.tpu.current_stream() == g
        assert type(torch.tpu.current_stream()) is torch.tpu.Stream
        y = torch.arange(10.0, device="tpu") * 3
    finally:
        torch.accelerator.set_stream(prev)
    assert torch.tpu.current_stream() == prev
    with g:
        assert torch.accelerator.current_stream() == g
        z = y + 1
    torch.accelerator.synchronize()
    assert g.query()
    g.synchronize()
    assert_close(z, torch.arange(10.0) * 3 + 1)
    ev = torch.Event(device="tpu", enable_timing=True)
    ev.record(g)
    ev.synchronize()


def test_streams_sharing_a_queue_order_correctly():
    # 2 x 32 + 1 streams: some map onto the same hardware queue; cross-stream
    # waits between them must neither deadlock nor reorder.
    streams = [torch.tpu.Stream() for _ in range(65)]
    ids = {s.stream_id for s in streams}
    assert len(ids) == 32 and all(1 <= i <= 32 for i in ids)
    x = torch.zeros(4096, device="tpu")
    for i, s in enumerate(streams):
        s.wait_stream(torch.tpu.current_stream() if i == 0 else streams[i - 1])
        with torch.tpu.stream(s):
            x.add_(1)
        x.record_stream(s)
    torch.tpu.current_stream().wait_stream(streams[-1])
    assert_close(x, torch.full((4096,), 65.0))


def test_many_streams_bounded_threads_and_synchronize_covers_all():
    # Before the pool: the 1,025th stream onwards was invisible to
    # synchronize(), and every stream kept an OS thread.
    torch.tpu.synchronize()
    before = _threads()
    x = torch.randn(512, 512, device="tpu")
    torch.tpu.synchronize()                # the new streams read x without waiting for its stream
    out = []
    late = None
    for i in range(1500):
        s = torch.tpu.Stream(priority=-(i % 2))
        with torch.tpu.stream(s):
            if i == 1400:
                late = s
                y = x
                for _ in range(30):        # ~100 ms of work on a late stream
                    y = y @ x / 512
                out.append(y)
            else:
                out.append(x[0, :4] + i)
        del s
    torch.tpu.synchronize()
    assert late.query(), "torch.tpu.synchronize() returned while a late stream was still running"
    after = _threads()
    assert after - before <= 2 * 32 + 1, f"{before} threads before, {after} after 1500 streams"
    for i in (0, 1, 777, 1499):
        assert_close(out[i], x[0, :4].cpu() + i)


_INTERRUPT_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    signal.signal(signal.SIGINT, signal.default_int_handler)   # a parent run under nohup / & ignores SIGINT
    import torch
    mode = sys.argv[1]
    import torch_tpu
    torch_tpu.set_eager_mode(mode)
    x = torch.randn(1024, 1024, device="tpu")
    (x @ x).sum().item()                   # warm-up
    t = time.perf_counter()
    (x @ x @ x).sum().item()
    per = (time.perf_counter() - t) / 2
    n = max(8, int(2.0 / per))             # ~2 s of queued matmuls
    res = {"n": n, "per_matmul_s": per}
    for where in ("item", "synchronize"):
        sent = []
        def fire():
            sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGINT)
        timer = threading.Timer(0.25, fire)
        try:
            timer.start()
            y = x
            for _ in range(n):
                y = x @ y / 1024
            if where == "item":
                y.sum().item()
            else:
                torch.tpu.synchronize()
            res[where] = "no interrupt"
        except KeyboardInterrupt:
            res[where + "_latency_s"] = time.perf_counter() - sent[0]
        torch.tpu.synchronize()                # the backlog still runs; the device stays usable
    a = torch.randn(300, 200)
    b = torch.randn(200, 100)
    got = (a.to("tpu") @ b.to("tpu")).cpu()
    res["max_err"] = (got - a @ b).abs().max().item()
    print(json.dumps(res))
""")


def test_ctrl_c_interrupts_host_waits(eager_mode):
    env = dict(os.environ)
    env.pop("TORCH_TPU_LAUNCH_BLOCKING", None)
    p = subprocess.run([sys.executable, "-c", _INTERRUPT_SCRIPT, eager_mode], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    for where in ("item", "synchronize"):
        assert res.get(where) != "no interrupt", res
        # Strict Eager: the wait is interrupted, not after the rest of the ~2 s backlog;
        # Debug Eager: the loop itself is interrupted between ops.
        assert res[where + "_latency_s"] < 1.0, res
    assert res["max_err"] < 1e-3, res
