"""torch.compile(backend="tpu"): FX graphs run as Fused Eager windows.

DESIGN
Dynamo hands the backend an FX graph of the user's code; AOTAutograd
(functionalized, forward and backward graphs split by the min-cut
partitioner, which recomputes cheap pointwise ops in the backward instead of
saving them) turns it into graphs of ATen ops. Each such graph is lowered to
the runtime's graph IR the way Fused Eager lowers eager code: its ops are
recorded, through the same op bindings and the same ops.def entries, into
the stream's window (the calling thread runs in Fused Eager for the call,
tpu_set_thread_eager_mode, whatever the process's mode), and the graph's end
flushes the window (unless the process itself is in Fused Eager: then the
graph joins the eager window around it). There is no second op mapping: the
planner fuses, drops dead intermediates and plans memory as for eager code,
and its plan cache (keyed by the window's structure) means that from the
second call of a graph a flush does no analysis.

Decompositions: an ATen op with a native tpu kernel stays whole (the kernel
and the fuser know it); one without (it would reach the CPU fallback) is
decomposed by PyTorch's core-ATen table where one exists, so compiled code
stays on the device where eager code would not.

Dynamic shapes: the graphs take sizes as arguments (Dynamo's symbolic
sizes) and nothing here specializes on them, so a new batch size or
sequence length runs the same compiled graph (Dynamo itself recompiles once
when it first sees a size change, unless the dimension was marked dynamic).

Not yet (issue 11): generated C kernels compiled in the background and
swapped in for the interpreter, the disk cache, bounded dynamic dimensions;
a compiled graph runs on Fused Eager's block interpreter today.

The default torch.compile backend, Inductor, has no code generator for our
device: the first compile of a graph holding tpu tensors raises at once,
naming backend="tpu" (registered for Inductor's "tpu" device when Inductor
loads, see _install_inductor_hook).
"""

import sys
import threading
import warnings

import torch

__all__ = ["tpu_backend", "compile_stats", "reset_compile_stats"]

_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_RECOMPILE_WARN = 8  # graphs compiled for one function before a warning

_lock = threading.Lock()
_stats = {}
_per_function = {}
_warned = set()


def reset_compile_stats() -> None:
    """Zero ``compile_stats()``."""
    with _lock:  # (zeroed in place, never cleared: graph calls bump a key without the lock)
        _stats.update(graphs_compiled=0, forward_graphs=0, backward_graphs=0, inference_graphs=0,
                      graph_nodes=0, graph_calls=0, frames_compiled=0, recompiles=0)
        _per_function.clear()


reset_compile_stats()


def compile_stats() -> dict:
    """torch.compile(backend="tpu")'s counters since start or
    ``reset_compile_stats()``: ``frames_compiled`` (Dynamo frames handed to
    the backend), ``recompiles`` (of those, a function compiled again after
    a guard failed), ``graphs_compiled`` (ATen graphs: ``forward_graphs``,
    ``backward_graphs``, ``inference_graphs``), ``graph_nodes`` (ATen ops in
    them), ``graph_calls`` (runs of compiled graphs) and ``per_function``
    (function name -> frames compiled). Kernels generated, C compile time and
    the disk cache are not counted: there is no code generation yet (a
    compiled graph runs on Fused Eager's interpreter)."""
    with _lock:
        out = dict(_stats)
        out["per_function"] = dict(_per_function)
    return out


def _runner(fn, where):
    """A boxed callable running `fn` (an ATen graph's forward) with this
    thread in Fused Eager: its ops go into one window, flushed at the end.
    An error gets a note naming the compiled function (`where`).

    Per call (16-element add, this 2-core host): Dynamo's frame and guards
    ~82 us, AOTAutograd's runtime wrapper ~50 us, this ~20 us (two mode
    switches through the dispatcher, the window's record and flush). The
    call counter is bumped without the lock (under the GIL; threads calling
    graphs at once may lose a count)."""
    set_mode = torch.ops.torch_tpu.set_thread_eager_mode
    stats = _stats

    def run(*args):
        stats["graph_calls"] += 1
        prev = set_mode("fused")
        try:
            out = fn(*args)
        except BaseException as e:
            try:
                set_mode(prev)
            except Exception:  # noqa: BLE001 - the graph's own error is the one to raise
                pass
            e.add_note(where)
            raise
        try:
            set_mode(prev)  # leaving Fused Eager flushes: kernel errors raise here
        except Exception as e:
            e.add_note(where)
            raise
        return out

    def run_boxed(args):
        return run(*args)

    run_boxed._boxed_call = True
    return run_boxed


def _graph_compiler(kind, name):
    where = f"(in the {kind} graph torch.compile(backend='tpu') compiled from {name})"

    def compile_graph(gm, example_inputs):
        n = sum(1 for node in gm.graph.nodes if node.op == "call_function")
        with _lock:
            _stats["graphs_compiled"] += 1
            _stats[kind + "_graphs"] += 1
            _stats["graph_nodes"] += n
        return _runner(gm.forward, where)

    compile_graph.__name__ = f"tpu_{kind}_compiler"
    return compile_graph


_decomp_table = None


def _has_native_kernel(op):
    name = op.name()
    for key in ("PrivateUse1", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
                "CompositeExplicitAutogradNonFunctional"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            return True
    return False


# Ops whose composite kernel ends in one the tpu lacks (functionalization's
# batch norm calls _native_batch_norm_legit, which would reach the CPU
# fallback): decomposed although they have a kernel.
_ALSO_DECOMPOSE = ("_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                   "_native_batch_norm_legit_no_training")


def _decompositions():
    """Core-ATen decompositions of the ops the tpu has no kernel for."""
    global _decomp_table
    if _decomp_table is None:
        from torch._decomp import core_aten_decompositions, get_decompositions

        table = {}
        for op, fn in core_aten_decompositions().items():
            if isinstance(op, torch._ops.OpOverload) and not _has_native_kernel(op):
                table[op] = fn
        table.update(get_decompositions([getattr(torch.ops.aten, n) for n in _ALSO_DECOMPOSE]))
        _decomp_table = table
    return _decomp_table


def _frame(gm):
    """(name of the function Dynamo compiles, whether this is a recompile of it)."""
    name = "<unknown>"
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
        name = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
    except Exception:  # noqa: BLE001 - called outside Dynamo (a user passing a GraphModule)
        pass
    cid = getattr(gm, "meta", {}).get("dynamo_compile_id")
    return name, bool(cid is not None and cid.frame_compile_id)


def tpu_backend(gm, example_inputs, mode=None, options=None):
    """The Dynamo backend ``"tpu"``: ``torch.compile(model, backend="tpu")``.

    ``mode`` is accepted for every value torch.compile knows
    (``"reduce-overhead"`` included: there are no CUDA graphs to capture, and
    the plan cache already makes a repeated graph cheap); ``options`` takes
    no keys yet."""
    if mode not in _MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(m for m in _MODES if m)}")
    if options:
        raise RuntimeError(f"Unexpected optimization option {next(iter(options))}, known options are []")
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    name, again = _frame(gm)
    with _lock:
        _stats["frames_compiled"] += 1
        count = _per_function.get(name, 0) + 1
        _per_function[name] = count
        if again:
            _stats["recompiles"] += 1
        warn = count > _RECOMPILE_WARN and name not in _warned
        if warn:
            _warned.add(name)
    if warn:
        warnings.warn(f"torch.compile(backend='tpu') has compiled {name} {count} times: a guard fails on each "
                      "call (TORCH_LOGS=recompiles names it); mark a changing size with "
                      "torch._dynamo.mark_dynamic or pass dynamic=True", stacklevel=2)
    compiler = aot_autograd(
        fw_compiler=_graph_compiler("forward", name),
        bw_compiler=_graph_compiler("backward", name),
        inference_compiler=_graph_compiler("inference", name),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=_decompositions(),
        keep_inference_input_mutations=True,
    )
    return compiler(gm, example_inputs)


# ---- Inductor: refuse tpu graphs at once, naming the backend that takes them ----

_INDUCTOR_MESSAGE = ("torch.compile's default backend (Inductor) cannot generate code for the tpu device; "
                     "use torch.compile(model, backend=\"tpu\")")


def _register_inductor_refusal(common):
    class Refuse(type):
        def __getattr__(cls, name):  # a class attribute Inductor asks for (supports_caching, ...)
            raise RuntimeError(_INDUCTOR_MESSAGE)

    class TpuInductorRefusal(metaclass=Refuse):
        """Inductor's scheduling and wrapper codegen for device "tpu":
        raises when Inductor would generate code for a tpu graph."""

        def __init__(self, *args, **kwargs):
            raise RuntimeError(_INDUCTOR_MESSAGE)

    if common.get_scheduling_for_device("tpu") is None:  # (the refusal stands for its wrapper codegen too)
        common.register_backend_for_device("tpu", TpuInductorRefusal, TpuInductorRefusal)


class _InductorHook:
    """A meta-path finder that registers the refusal right after Inductor's
    codegen registry loads (importing Inductor ourselves would add seconds
    to ``import torch``), before Inductor registers its own "tpu" device
    (a Pallas code generator for a JAX-backed TPU, not ours)."""

    TARGET = "torch._inductor.codegen.common"

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.TARGET:
            return None
        import importlib.machinery

        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _register_inductor_refusal(module)

        loader.exec_module = exec_and_register
        return spec


def _install_inductor_hook():
    mod = sys.modules.get(_InductorHook.TARGET)
    if mod is not None:
        _register_inductor_refusal(mod)
    elif not any(isinstance(f, _InductorHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _InductorHook())
