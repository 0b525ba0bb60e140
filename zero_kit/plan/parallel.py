"""Model parallelism beside data parallelism in the planner: tensor parallel (DeepSpeed AutoTP training, FSDP2 +
DTensor) and pipeline parallel (torch.distributed.pipelining, GPipe or 1F1B), alone or combined with a data-parallel
row of the byte table (DDP, ZeRO-0/1/2/3, FSDP2). Pure arithmetic in the vocabulary of `zero_kit.plan.accounting`
(StateBytes) and `zero_kit.plan.traffic` (Collective, TierBytes); the benchmark's TP/PP strategies compare against
the same functions: `parallel_state_bytes`, `parallel_collectives` (+ `traffic.tier_bytes`), `bubble_fraction`.

Rank order (DeepSpeed's `_init_tp_mesh_device` mesh is (data_parallel, tensor_parallel); the pipeline outermost):
rank = (stage x dp + dp index) x tp + tp index. So a tp group is tp neighbouring ranks (inside a node when tp <= L),
a dp group strides tp, a pipeline's stages stride dp x tp (whole nodes apart once dp x tp >= L).

What AutoTP splits (DeepSpeed 0.19.8 with transformers' LLaMA tp_plan: q/k/v/gate/up "colwise", o/down "rowwise",
lm_head "colwise_gather_output"; engine.py `_apply_autotp_partitioning` converts the HF plan): every linear weight
of a block and the column-parallel biases are divided by tp; row-parallel biases, every norm (also Qwen3's q/k
norms) and the input embedding stay whole on every tp rank (the plan does not name embed_tokens); an untied lm_head
is divided by tp; a tied lm_head is the embedding, kept whole (auto_tp.py `_configure_gathered_column_tie_fallbacks`).

Collectives per micro batch (module_inject/layers.py, tp_overlap_comm off): forward, RowParallel all-reduces o_proj's
and down_proj's outputs (2 x a bsh per layer); backward, ColumnParallel all-reduces the input gradient of EVERY
column-parallel linear (q, k, v, gate, up: 5 x a bsh per layer; Phi-3's fused qkv/gate_up: 2), where Megatron-LM
needs 2 (one per block); lm_head gathers its logits (a bsV, all-gather) and all-reduces its input gradient (a bsh).
A pipeline sends each micro batch's activations (a bsh) to the next stage and their gradient back. The data-parallel
row then syncs each rank's slice (Ψr parameters) over its dp group, once per optimizer step.

Activations (saved for backward, as `zero_kit.plan.memory._layer_saved` per layer): with tp the block's inner
tensors (q, attention output, k, v, the MLP's 4 intermediates) divide by tp; the norms' tensors and the
projections' replicated inputs do not: bs[(8 + 4a)h + (2a h + 2a h_kv + 4a I)/tp]. A pipeline stage keeps the
activations of the micro batches in flight: 1F1B at most p on the first stage (min(p, m)), GPipe all m.

Pipeline bubble: of a step's (m + p - 1) slots per stage only m compute, so the idle fraction is (p-1)/(m+p-1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zero_kit.plan.accounting import DTYPE_BYTES, StateBytes, model_state_bytes
from zero_kit.plan.shapes import LlamaShape
from zero_kit.plan.traffic import Collective, collectives
from zero_kit.plan.workload import Workload, from_record
from zero_kit.strategies import STRATEGIES

BASES = ("ddp", "zero0", "zero1", "zero2", "zero3", "fsdp")
SCHEDULES = ("1f1b", "gpipe")
Terms = dict[str, tuple[int, str]]


@dataclass(frozen=True)
class Layout:
    """How N ranks split the model: tp x pp model-parallel ranks per replica, N / (tp x pp) data-parallel replicas."""

    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    """m: micro batches per optimizer step on each replica (the pipeline's schedule; without one, accumulation)."""
    base: str = "zero1"
    """The data-parallel row of the byte table over each dp group: ddp, zero0..zero3 or fsdp."""
    schedule: str = "1f1b"

    def dp(self, world_size: int) -> int:
        return world_size // (self.tp * self.pp)

    @property
    def label(self) -> str:
        return "".join(f"+{name}{n}" for name, n in (("tp", self.tp), ("pp", self.pp)) if n > 1)


def layout_problems(layout: Layout, shape: LlamaShape, world_size: int) -> list[str]:
    """What makes a layout impossible, each naming the value (empty: plannable)."""
    problems = []
    if layout.base not in BASES:
        problems.append(f"base {layout.base!r} is not one of {list(BASES)}")
    if layout.schedule not in SCHEDULES:
        problems.append(f"schedule {layout.schedule!r} is not one of {list(SCHEDULES)}")
    if min(layout.tp, layout.pp, layout.micro_batches) < 1:
        problems.append(f"tp ({layout.tp}), pp ({layout.pp}) and micro_batches ({layout.micro_batches}) must be >= 1")
    elif world_size % (layout.tp * layout.pp):
        problems.append(f"tp x pp ({layout.tp} x {layout.pp}) does not divide the world size ({world_size})")
    if layout.tp > 1 and shape.heads % layout.tp:
        problems.append(f"tp ({layout.tp}) does not divide the attention heads ({shape.heads})")
    if layout.pp > shape.layers:
        problems.append(f"pp ({layout.pp}) is more than the layers ({shape.layers})")
    return problems


@dataclass(frozen=True)
class TpSplit:
    """Parameter counts of one block and of the model's ends: the part AutoTP divides by tp and the part it keeps."""

    block_sharded: int
    block_replicated: int
    embedding: int
    head_sharded: int
    head_replicated: int
    final_norm: int


def tp_split(shape: LlamaShape) -> TpSplit:
    """What AutoTP divides (module doc): block linears and column biases; not norms, row biases, the embedding."""
    h = shape.hidden_size
    norms = h * (4 if shape.sandwich_norms else 2) + (2 * shape.head_dim if shape.qk_norm else 0)
    row_bias = (h if shape.o_bias else 0) + (h if shape.mlp_bias else 0)
    replicated = norms + row_bias
    vh = shape.vocab_size * h
    head_sharded, head_replicated = (0, 0) if shape.tie_word_embeddings else (vh, 0)
    return TpSplit(shape.block_params - replicated, replicated, vh, head_sharded, head_replicated, h)


def stage_layers(layers: int, pp: int) -> list[int]:
    """Decoder layers per pipeline stage, as even as possible, the extra ones on the first stages."""
    return [layers // pp + (1 if stage < layers % pp else 0) for stage in range(pp)]


def stage_params(shape: LlamaShape, tp: int, pp: int) -> list[int]:
    """Parameters each rank of each stage holds (first stage: embedding; last: final norm and head; a tied head on
    a separate last stage is a second whole copy of the embedding)."""
    split = tp_split(shape)
    per_layer = -(-split.block_sharded // tp) + split.block_replicated
    out = []
    for stage, layers in enumerate(stage_layers(shape.layers, pp)):
        held = layers * per_layer
        if stage == 0:
            held += split.embedding
        if stage == pp - 1:
            held += split.final_norm + -(-split.head_sharded // tp)
            if shape.tie_word_embeddings and pp > 1:
                held += split.embedding
        out.append(held)
    return out


def parallel_state_bytes(work: Workload, layout: Layout, world_size: int) -> StateBytes:
    """Model-state bytes of the fullest rank: its slice (Ψr, the largest stage's parameters with AutoTP's split)
    under the base row sharded over the dp group. LoRA is not planned with model parallelism (ValueError)."""
    if work.lora_r:
        raise ValueError("LoRA with tensor or pipeline parallelism is not planned")
    problems = layout_problems(layout, work.shape, world_size)
    if problems:
        raise ValueError("; ".join(problems))
    psi_rank = max(stage_params(work.shape, layout.tp, layout.pp))
    states = model_state_bytes(layout.base, psi_rank, layout.dp(world_size), work.precision)
    rename = lambda text: text.replace("Ψ", "Ψr").replace("/N", "/N_dp")  # noqa: E731
    return replace(states, formula=rename(states.formula), part_formulas=tuple(map(rename, states.part_formulas)))


def tp_collectives(work: Workload, layout: Layout) -> list[Collective]:
    """The tp group's all-reduces (and lm_head's all-gather) per optimizer step, on the fullest stage (module doc)."""
    if layout.tp < 2:
        return []
    shape, a, m = work.shape, DTYPE_BYTES[work.precision], layout.micro_batches
    bsh = work.micro_batch * work.seq_len * shape.hidden_size * a
    layers = max(stage_layers(shape.layers, layout.pp))
    backward_per_layer = 2 if shape.fused else 5
    group = {"group": "tp", "size": layout.tp, "stride": 1}
    out = [
        Collective(
            "tp all-reduce o/down outputs (fwd)", "allreduce", 2 * layers * m * bsh, 2 * layers * m, False, **group
        ),
        Collective(
            "tp all-reduce column input grads (bwd)",
            "allreduce",
            backward_per_layer * layers * m * bsh,
            backward_per_layer * layers * m,
            False,
            **group,
        ),
    ]
    if not shape.tie_word_embeddings:
        logits = work.micro_batch * work.seq_len * shape.vocab_size * a
        out.append(Collective("tp all-gather lm_head logits (fwd)", "allgather", m * logits, m, False, **group))
        out.append(Collective("tp all-reduce lm_head input grad (bwd)", "allreduce", m * bsh, m, False, **group))
    return out


def parallel_collectives(work: Workload, layout: Layout, world_size: int) -> list[Collective]:
    """Every collective of one optimizer step on the fullest rank: tp, pp (point to point) and the base's over dp."""
    out = tp_collectives(work, layout)
    dp = layout.dp(world_size)
    if layout.pp > 1:
        bsh = work.micro_batch * work.seq_len * work.shape.hidden_size * DTYPE_BYTES[work.precision]
        calls = 2 * layout.micro_batches
        group = {"group": "pp", "size": layout.pp, "stride": dp * layout.tp}
        out.append(
            Collective("pp activations fwd / grads bwd", "p2p", layout.micro_batches * bsh, calls, False, **group)
        )
    if dp > 1:
        psi_rank = max(stage_params(work.shape, layout.tp, layout.pp))
        rank_work = replace(work, n_params=psi_rank)
        for c in collectives(STRATEGIES[layout.base], rank_work):
            out.append(replace(c, what=f"dp {c.what}", group="dp", size=dp, stride=layout.tp))
    return out


def bubble_fraction(pp: int, micro_batches: int) -> float:
    """The idle share of a pipeline step, (p-1)/(m+p-1): GPipe's and 1F1B's (1F1B saves memory, not time)."""
    return (pp - 1) / (micro_batches + pp - 1)


def layer_saved_tp(work: Workload, tp: int) -> tuple[int, str]:
    """Bytes one decoder layer saves for backward on one tp rank (module doc; 16-bit or fp32 weights, no autocast)."""
    s, a = work.shape, DTYPE_BYTES[work.precision]
    bs = work.micro_batch * work.seq_len
    kept = (8 + 4 * a) * s.hidden_size
    divided = 2 * a * s.hidden_size + 2 * a * s.kv_size + 4 * a * s.intermediate_size
    formula = f"bs[{8 + 4 * a}h + ({2 * a}h + {2 * a}h_kv + {4 * a}I)/tp]"
    return bs * (kept + -(-divided // tp)), formula


def in_flight(layout: Layout) -> int:
    """Micro batches whose activations the first stage holds at once (1F1B: up to p; GPipe: all m)."""
    if layout.pp == 1:
        return 1
    return min(layout.pp, layout.micro_batches) if layout.schedule == "1f1b" else layout.micro_batches


def parallel_activation_terms(work: Workload, layout: Layout) -> Terms:
    """Activation bytes on the fullest rank: the first stage's in-flight micro batches over its layers, or the last
    stage's one micro batch plus the loss (logits gathered whole, fp32 copy and log-softmax), whichever is larger."""
    s, a = work.shape, DTYPE_BYTES[work.precision]
    bs = work.micro_batch * work.seq_len
    layer, formula = layer_saved_tp(work, layout.tp)
    if work.activation_checkpointing:
        layer, formula = bs * a * s.hidden_size, f"{a}bsh (checkpointed input)"
    layers = stage_layers(s.layers, layout.pp)
    working, working_formula = layer_saved_tp(work, layout.tp)
    first: Terms = {
        f"saved activations, {in_flight(layout)} micro batch(es) x {layers[0]} layers": (
            in_flight(layout) * layers[0] * layer,
            f"{in_flight(layout)} x {layers[0]} x {formula}",
        ),
        "backward working set (one layer)": (working, working_formula),
    }
    loss = bs * s.vocab_size * (a + 8 if a < 4 else 8)
    last: Terms = {
        f"saved activations, 1 micro batch x {layers[-1]} layers": (layers[-1] * layer, f"{layers[-1]} x {formula}"),
        "final norm + lm_head input": (bs * (4 + 2 * a) * s.hidden_size, f"{4 + 2 * a}bsh"),
        "logits (gathered), fp32 copy, log-softmax": (loss, f"bsV x {a + 8 if a < 4 else 8}"),
    }
    if layout.pp == 1:
        return first | dict(list(last.items())[1:])
    return max(first, last, key=lambda terms: sum(v for v, _ in terms.values()))


def record_layout(record: dict) -> tuple[Layout, Workload]:
    """The Layout and Workload of a tensor- or pipeline-parallel `zero-kit bench` record: a replica (tp x pp ranks)
    trains micro x accum x tp x pp rows per step, tp x micro rows per micro batch, the byte table's row over dp."""
    info = STRATEGIES[record["strategy"]]
    tp, pp, batch = info.tensor_parallel, info.pipeline_stages, record["batch"]
    layout = Layout(tp=tp, pp=pp, micro_batches=batch["grad_accum"] * pp, base=info.accounting)
    return layout, replace(from_record(record), micro_batch=batch["micro"] * tp)
