"""Suite part a (environment) and the overhead constants of part e. Everything touching CUDA runs in a child
process, so the suite's own process never holds a CUDA context that would skew later memory readings."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from benchmarks.gpu.common import Context

# Child-process probes: print one JSON object on the last line. Timing: warm-up excluded, synchronize before
# reading clocks, median of N.
_MICRO = r"""
import json, statistics, sys, time, torch
cuda, n, size, copy_mib = sys.argv[1] == "cuda", int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dev = "cuda" if cuda else "cpu"
dtype = torch.bfloat16 if cuda else torch.float32
sync = torch.cuda.synchronize if cuda else (lambda: None)
a, b = torch.randn(size, size, device=dev, dtype=dtype), torch.randn(size, size, device=dev, dtype=dtype)
def timed(fn):
    for _ in range(3): fn()
    sync(); times = []
    for _ in range(n):
        t = time.perf_counter(); fn(); sync(); times.append(time.perf_counter() - t)
    return statistics.median(times)
mm = timed(lambda: a @ b)
src = torch.empty(copy_mib * 2**20, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
cp = timed(lambda: dst.copy_(src))
print(json.dumps({"matmul": {"shape": [size] * 3, "dtype": str(dtype), "median_s": mm, "repeats": n,
    "tflops": 2 * size**3 / mm / 1e12}, "copy": {"bytes": src.numel(), "median_s": cp, "repeats": n,
    "gb_per_s_read_plus_write": 2 * src.numel() / cp / 1e9, "what": "device-to-device" if cuda else "host memcpy"}}))
"""

_OVERHEAD = r"""
import json, os, torch, torch.distributed as dist
torch.cuda.init()
free0, total = torch.cuda.mem_get_info()  # the first call creates the primary context
x = torch.empty(1, device="cuda"); torch.cuda.synchronize()
free1, _ = torch.cuda.mem_get_info()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("ZK_PORT", "29799"), RANK="0", WORLD_SIZE="1")
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
t = torch.ones(2**20, device="cuda"); dist.all_reduce(t); torch.cuda.synchronize()
free2, _ = torch.cuda.mem_get_info()
print(json.dumps({"total": total, "used_after_context": total - free0, "first_tensor_delta": free0 - free1,
    "reserved_after_first_tensor": torch.cuda.memory_reserved(),
    "nccl_delta": free1 - free2 - (torch.cuda.memory_reserved() - 2 * 2**20),
    "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))}))
dist.destroy_process_group()
"""

_VERSIONS = r"""
import json, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
       "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    out.update(gpu=torch.cuda.get_device_name(), gpu_memory=p.total_memory, capability=list(torch.cuda.get_device_capability()),
               sm_count=p.multi_processor_count, bf16_supported=torch.cuda.is_bf16_supported(),
               nccl=".".join(map(str, torch.cuda.nccl.version())))
else:
    out.update(bf16_supported=False, nccl=None)
print(json.dumps(out))
"""

_DS_OPS = r"""
import json
from deepspeed.ops.op_builder.all_ops import ALL_OPS
out = {}
for name, builder in ALL_OPS.items():
    try:
        out[name] = bool(builder.is_compatible(verbose=False))
    except Exception as err:  # an op's probe can itself fail on a bare image: record it
        out[name] = f"error: {err}"
print(json.dumps(out))
"""


def child_json(code: str, *args: str, timeout: float = 300, env: dict | None = None) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"probe failed ({done.returncode}): {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def nvidia_smi() -> dict[str, Any]:
    fields = "name,driver_version,memory.total,memory.used"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"error": str(err)}
    if not out:
        return {"error": "nvidia-smi printed nothing"}
    name, driver, total, used = (s.strip() for s in out[0].split(","))
    return {"name": name, "driver": driver, "memory_total_mib": float(total), "memory_used_mib": float(used)}


def ds_report() -> str:
    done = subprocess.run([sys.executable, "-m", "deepspeed.env_report"], capture_output=True, text=True, timeout=300)
    return (done.stdout + done.stderr)[-6000:]


def pip_freeze() -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    return done.stdout.splitlines()


def environment(ctx: Context) -> tuple[str, str | None, dict]:
    """Part a: versions, driver, NCCL, DeepSpeed op compatibility, bf16, measured matmul peak and copy bandwidth."""
    versions = child_json(_VERSIONS)
    size, repeats, copy_mib = (512, 5, 64) if not ctx.cuda else (8192, 50, 1024)
    micro = child_json(_MICRO, "cuda" if ctx.cuda else "cpu", str(repeats), str(size), str(copy_mib), timeout=600)
    data = {
        "device": versions.get("gpu") or "cpu",
        **{k: versions.get(k) for k in ("torch", "cuda", "cudnn", "nccl", "bf16_supported", "capability")},
        "gpu_memory_bytes": versions.get("gpu_memory"),
        "nvidia_smi": nvidia_smi() if ctx.cuda else None,
        "deepspeed_ops": child_json(_DS_OPS),
        "ds_report": ds_report(),
        "pip_freeze": pip_freeze(),  # the image's exact versions: refine benchmarks/gpu/image.txt from them
        **micro,
        "notes": "matmul: bf16 8192^3 on CUDA (fp32 512^3 on CPU in dry mode); warm-up 3, median of repeats",
    }
    return "ok", None, data


def overhead_constants(ctx: Context, baseline_used_mib: float | None) -> dict[str, Any]:
    """CUDA context, first allocation and NCCL communicator memory, from a fresh child process."""
    import os

    if not ctx.cuda:
        return {"status": "skipped", "reason": "skipped: no CUDA"}
    found = child_json(_OVERHEAD, env={**os.environ, "ZK_PORT": str(ctx.port(1))})
    if baseline_used_mib is not None:  # memory other processes held before ours: not our context
        found["context_bytes"] = found["used_after_context"] - int(baseline_used_mib * 2**20)
    found["status"] = "ok"
    return found
