"""What one GPU, its links and its host can do per second: a small table of documented defaults per GPU type, and
what the step-time model divides by. Calibration from a measured run: `zero_kit.plan.calibration`.

Sources of the table (per direction, dense, no sparsity):
  peak FLOP/s: `zero_kit.metrics.PEAK_FLOPS` (NVIDIA data sheets).
  intra-node: NVLink 4 on H100/H200 SXM is 900 GB/s bidirectional = 450 GB/s per direction (H100 data sheet);
    NVLink 3 on A100 SXM 600 GB/s = 300 GB/s per direction; H100 PCIe, L40S, A10G: PCIe (Gen5 x16 64 GB/s,
    Gen4 x16 32 GB/s per direction), taken at ~80% as achievable.
  inter-node: the vendor reference node: DGX H100/H200 8 x 400 Gb/s ConnectX-7 = 3200 Gb/s per node; DGX A100
    8 x 200 Gb/s HDR = 1600 Gb/s; PCIe cards one 400 Gb/s (H100 PCIe) or 100 Gb/s NIC (AWS g5 / g6e: 100 Gb/s).
  host<->GPU: PCIe Gen5 x16 ~50 GB/s, Gen4 x16 ~25 GB/s achieved with pinned memory.
The MFU default, 0.40, is what Meta reports for Llama 3 pre-training on H100 (38-43% BF16, Llama 3 paper
Table 4): the compute a well-tuned step reaches when it is not waiting on communication.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zero_kit.metrics import PEAK_FLOPS

DEFAULT_MFU = 0.40
GBIT = 1e9 / 8  # bytes per second in one Gbit/s


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_key: str
    """Key of `zero_kit.metrics.PEAK_FLOPS`."""
    intra_gbps: float
    """Gbit/s per GPU per direction to the other GPUs of its node."""
    inter_gbps: float
    """Gbit/s per node per direction to other nodes (all its NICs)."""
    pcie_gbs: float
    """GB/s per GPU between host memory and the GPU."""


GPU_SPECS: dict[str, GpuSpec] = {
    "h100": GpuSpec("H100 SXM", "H100", 450 * 8, 3200, 50),
    "h200": GpuSpec("H200 SXM", "H200", 450 * 8, 3200, 50),
    "h100-pcie": GpuSpec("H100 PCIe", "H100 PCIe", 0.8 * 64 * 8, 400, 50),
    "a100": GpuSpec("A100 SXM", "A100", 300 * 8, 1600, 25),
    "l40s": GpuSpec("L40S", "L40S", 0.8 * 32 * 8, 100, 25),
    "a10g": GpuSpec("A10G", "A10G", 0.8 * 32 * 8, 100, 25),
}


@dataclass(frozen=True)
class Rates:
    """Speeds the step-time model divides by. Bandwidths in bytes per second."""

    flops_per_s: float
    """Achieved FLOP/s per GPU (peak x MFU, or calibrated)."""
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    latency_s: float
    """Seconds per collective call (the alpha of the alpha-beta model)."""
    pcie_bytes_per_s: float
    cpu_mem_bytes_per_s: float
    cpu_adam_bytes: float
    overlap: float
    compute_source: str
    """How flops_per_s was obtained, for the output."""
    comm_backend: str = "nccl"
    """The collective library, for its algorithms (zero_kit.plan.timing): nccl, or gloo (CPU ranks)."""
    overhead_s: dict[str, float] = field(default_factory=dict)
    """Seconds per step per strategy name that compute and communication do not explain, calibrated from a
    measured run (zero_kit.plan.calibration); 0 for a strategy not in it."""
    host_copy_bytes_per_s: float | None = None
    """How fast the ranks' own CPUs move a collective's bytes (CPU ranks: what they move with no link limiting
    them, e.g. the loopback); comm time beyond it is waiting on the link, which the overhead overlaps. None: the
    host moves none of them (NCCL's kernels do)."""


def peak_of(spec: GpuSpec, precision: str) -> float:
    return PEAK_FLOPS[spec.peak_key][precision]
