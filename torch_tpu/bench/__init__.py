"""torch_tpu benchmark harness.

One reproducible command runs torch_tpu beside its peers (PyTorch CPU eager and
Inductor) on the same cores, in the same run:

    python -m torch_tpu.bench                 # full run, writes benchmarks/results/
    python -m torch_tpu.bench --quick         # tiny sizes, proves the harness works
    python -m torch_tpu.bench --help

Every (configuration, workload) pair runs in its own subprocess
(``python -m torch_tpu.bench --worker ...``) because the tpu execution mode is
chosen by environment variables when the tpu runtime initializes, and so that a
crash or hang is recorded as an error instead of ending the run.

This subpackage only talks to the device through ``torch`` / ``torch.tpu`` (and a
getattr-guarded ``torch_tpu.fallback_counts``); see benchmarks/README.md.
"""

__all__ = ["main"]


def main(argv=None):
    from .cli import main as _main

    return _main(argv)
