"""Run the harness without importing the ``torch_tpu`` package itself.

    python torch_tpu/bench/standalone.py [options]      # same options as python -m torch_tpu.bench

``python -m torch_tpu.bench`` imports ``torch_tpu/__init__.py`` first, which
needs the built extension. Workers are started through this file instead, so
the cpu configurations measure plain PyTorch (device autoload disabled) and keep
working whatever state torch_tpu is in; tpu configurations get torch_tpu the
normal way, through ``import torch`` (autoload).
"""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.getcwd()) == _here:
    sys.path.pop(0)  # keep this directory's modules from shadowing top-level names

_NAME = "torch_tpu_bench"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, os.path.join(_here, "__init__.py"),
                                                   submodule_search_locations=[_here])
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _mod
    _spec.loader.exec_module(_mod)

if __name__ == "__main__":
    from torch_tpu_bench.cli import main

    sys.exit(main())
