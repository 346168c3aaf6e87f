# setup.py - builds torch_tpu._C (the C++ glue) against the C runtime
# (build/libtpurt.a, built by `make runtime`). Install with
#   pip install --no-build-isolation -e .
import os
import subprocess
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(ROOT, "build", "libtpurt.a")

if not os.path.exists(LIB):
    subprocess.check_call(["make", "-C", ROOT, "runtime"])

setup(
    ext_modules=[
        CppExtension(
            "torch_tpu._C",
            sources=["csrc/device.cpp", "csrc/ops.cpp", "csrc/autocast.cpp", "csrc/dist.cpp"],  # ops.cpp includes csrc/ops_*.cpp (one unit: compile time)
            include_dirs=[os.path.join(ROOT, "runtime", "include")],
            extra_objects=[LIB],
            depends=[LIB, "csrc/tpu_glue.h", "csrc/complex_route.h", "csrc/ops_core.cpp", "csrc/ops_pointwise.cpp", "csrc/ops_nn.cpp", "csrc/ops_linalg.cpp", "csrc/ops_spectral.cpp", "csrc/ops_attention.cpp"] + [os.path.join("runtime/include/tpu", f)
                                                for f in os.listdir(os.path.join(ROOT, "runtime/include/tpu"))],
            extra_compile_args=["-std=c++20", "-O2", "-g0", "-Wno-unused-parameter"],
            extra_link_args=["-pthread"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
