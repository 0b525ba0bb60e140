"""User-facing options for a DeepSpeed ZeRO config. One field per option; the docstring under a
field is its `--help` text (see `zero_kit.options`). Pure data: no torch, no deepspeed, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Offload = Literal["none", "cpu", "nvme"]
"""Where ZeRO puts what it offloads: nowhere, host RAM, or an NVMe directory (the one offload vocabulary)."""
Precision = Literal["bf16", "fp16", "fp32"]
Device = Literal["cuda", "cpu"]
"""What a config is meant to run on: CUDA GPUs (NCCL) or CPUs (gloo)."""


@dataclass(frozen=True)
class ZeroOptions:
    """The options `zero-kit config` and `zero-kit train` share, with one name, one meaning and one help text."""

    offload_optimizer: Offload = "none"
    """Where optimizer state lives: cpu (stage >= 1) or nvme (stage 3 only) frees GPU memory at the cost of speed."""
    offload_param: Offload = "none"
    """Where parameters live between uses: cpu or nvme (stage 3 only)."""
    nvme_path: str | None = None
    """Directory on a fast local NVMe drive for NVMe offload (required with nvme)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    gradient_clipping: float = 1.0
    """Clip gradients to this global norm (0 disables)."""


@dataclass(frozen=True)
class ZeroSpec(ZeroOptions):
    stage: Literal[0, 1, 2, 3] = 2
    """ZeRO stage: 0 plain data parallel, 1 shards optimizer state, 2 also gradients, 3 also parameters."""
    pin_memory: bool = True
    """Pin (page-lock) host buffers used by offload: faster copies, but counts against host RAM."""
    precision: Precision | None = None
    """Training precision: bf16 (Ampere and newer), fp16 (with dynamic loss scaling) or fp32. Default: bf16, and
    fp32 with --device cpu (DeepSpeed's bf16 and fp16 paths need a GPU)."""
    micro_batch: int | None = None
    """Micro batch per GPU (train_micro_batch_size_per_gpu)."""
    grad_accum: int | None = None
    """Gradient accumulation steps (gradient_accumulation_steps)."""
    global_batch: int | None = None
    """Global batch (train_batch_size) = micro batch x grad accum x data-parallel size (world size / --sp); give
    any two of the three."""
    world_size: int | None = None
    """Number of ranks (GPUs in all; with --sp N, world size / N of them data-parallel). Default: nodes x
    gpus-per-node, else 1."""
    nodes: int | None = None
    """Number of nodes (with --gpus-per-node, instead of --world-size)."""
    gpus_per_node: int | None = None
    """GPUs per node (with --nodes, instead of --world-size)."""
    hidden_size: int | None = None
    """Model hidden size h, for bucket sizes (reduce 25 h^2, prefetch 0.9 h^2, persistence 10 h). Read from --model DIR if given."""
    leaf_module: str | None = None
    """ZeRO-3: gather each module of this class as one, with one hook pair instead of one per submodule
    (zero_optimization.leaf_module), e.g. the decoder layer LlamaDecoderLayer: a few percent faster, more memory
    (docs/configs.md). Its input must require grad: with frozen embeddings (LoRA) a script calls
    model.enable_input_require_grads(), as zero-kit train does."""
    hf_auto: bool = False
    """Write "auto" for every value the Hugging Face Trainer fills itself (batch sizes, lr, precision, buckets)."""
    lr: float = 2e-5
    """Learning rate of the AdamW optimizer written into the config (not used with --hf-auto)."""
    device: Device = "cuda"
    """What the config will run on. cpu refuses CUDA-only features (ZeRO++ qwZ/qgZ): say cpu for a gloo run."""
    hpz: bool = False
    """ZeRO++ hpZ (stage 3): a secondary parameter shard inside each node, so forward/backward all-gathers stay on
    the node. Partition size: --hpz-partition-size, else --gpus-per-node when --nodes > 1."""
    hpz_partition_size: int | None = None
    """ZeRO++ hpZ: ranks sharing one secondary parameter shard (zero_hpz_partition_size); implies --hpz. Must
    divide --gpus-per-node and the world size."""
    quantized_weights: bool = False
    """ZeRO++ qwZ (stage 3, CUDA only): all-gather weights as int8 (zero_quantized_weights)."""
    quantized_gradients: bool = False
    """ZeRO++ qgZ (stage 3, CUDA only): reduce gradients as int4 all-to-all (zero_quantized_gradients)."""
    bf16_master_weights: bool = False
    """Keep ZeRO's master weights and gradients in bf16 (bf16.bf16_master_weights_and_grads; --precision bf16,
    stage >= 1). Needs --bf16-optimizer-states, or --offload-optimizer (DeepSpeedCPUAdam)."""
    bf16_optimizer_states: bool = False
    """Keep Adam's moments in bf16 (bf16.bf16_optimizer_states; needs --bf16-master-weights)."""
    tp: int = 1
    """Tensor-parallel ranks per model copy: DeepSpeed AutoTP training (tensor_parallel.autotp_size), with --stage
    0-2 (3 only where the installed DeepSpeed supports it). The ranks of a TP group share each sample, so a step
    trains on global batch / tp distinct samples; keep it inside a node (its all-reduces run every layer)."""
    sp: int = 1
    """Ulysses sequence parallelism (DeepSpeed's ALST): each sequence is split over N ranks, which exchange attention
    heads all-to-all (sequence_parallel_size; with --accelerate-yaml also accelerate's parallelism_config, sp_backend
    deepspeed). N must divide the world size, and the batch keys count the data-parallel ranks, world size / N."""
    torch_autocast: bool = False
    """Run forward/backward under torch.autocast in bf16 (the torch_autocast section; --precision bf16 or fp32):
    precision-sensitive ops stay fp32."""
    client_optimizer: bool | None = None
    """The training script builds its own optimizer and scheduler (an own accelerate loop, or one that passes
    optimizer= to deepspeed.initialize): no "optimizer" section. Default: yes with --accelerate-yaml (accelerate
    refuses a config optimizer beside the script's, and the HF Trainer then builds its own from its arguments), no
    otherwise (deepspeed.initialize builds the section's AdamW; a script's own optimizer replaces it)."""

    def __post_init__(self) -> None:
        if self.precision is None:  # frozen: the resolved default is set once, here
            object.__setattr__(self, "precision", "fp32" if self.device == "cpu" else "bf16")
