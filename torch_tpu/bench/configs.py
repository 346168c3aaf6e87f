"""Benchmark configurations: what runs where, and how each one is selected."""

from dataclasses import dataclass, field

# Environment variables read by the tpu runtime when it initializes. The harness
# removes all of them from every worker's environment and sets only the ones the
# configuration asks for, so an exported variable in the user's shell cannot
# silently change what a configuration measures.
TPU_MODE_ENV = ("TORCH_TPU_LAUNCH_BLOCKING", "TORCH_TPU_DEFER_AND_FUSE")


@dataclass(frozen=True)
class Config:
    name: str
    device: str  # "cpu" or "tpu"
    compiler: str | None  # None (eager), "inductor" (torch.compile on cpu), "tpu"
    env: dict = field(default_factory=dict)
    requires: str | None = None  # feature probed before running: "fused", "compiled"
    description: str = ""


CONFIGS = {
    c.name: c
    for c in [
        Config("cpu-eager", "cpu", None, description="PyTorch CPU, eager"),
        Config("cpu-inductor", "cpu", "inductor",
               description="torch.compile (Inductor) on CPU; compile time is in first step / warm-up overhead"),
        Config("tpu-debug", "tpu", None, {"TORCH_TPU_LAUNCH_BLOCKING": "1"},
               description="torch_tpu Debug Eager: every op synchronous"),
        Config("tpu-strict", "tpu", None, {},
               description="torch_tpu Strict Eager (default): asynchronous launches"),
        Config("tpu-fused", "tpu", None, {"TORCH_TPU_DEFER_AND_FUSE": "1"}, requires="fused",
               description="torch_tpu Fused Eager: deferred ops fused at sync points"),
        Config("tpu-compiled", "tpu", "tpu", {}, requires="compiled",
               description="torch.compile with the torch_tpu backend"),
    ]
}

ALL_CONFIGS = list(CONFIGS)
DEFAULT_CONFIGS = ALL_CONFIGS
# --quick proves the harness end to end on the configurations that cost no
# compilation: PyTorch CPU and the default tpu mode (plus the availability probes).
QUICK_CONFIGS = ["cpu-eager", "tpu-strict", "tpu-fused", "tpu-compiled"]

BASELINE = "cpu-eager"
TPU_BASELINE = "tpu-strict"


def worker_env(base_env, config, threads):
    env = {k: v for k, v in base_env.items() if k not in TPU_MODE_ENV}
    env.update(config.env)
    if config.device == "cpu":
        # PyTorch CPU baselines are plain PyTorch: do not autoload torch_tpu into them
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    n = str(threads)
    env["OMP_NUM_THREADS"] = n
    env["MKL_NUM_THREADS"] = n
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["TRANSFORMERS_VERBOSITY"] = "error"
    env["PYTHONUNBUFFERED"] = "1"
    return env
