"""The project's own text for the embedded tokenizer and the bundled datasets (written for zero_kit, not copied).

Each topic is (name, what it is, a detail, a practical tip). `python -m scripts.make_assets` turns these into
instruction/response pairs, chat conversations and plain-text paragraphs.
"""

from __future__ import annotations

TOPICS: list[tuple[str, str, str, str]] = [
    (
        "ZeRO",
        "ZeRO, the Zero Redundancy Optimizer, removes the copies of optimizer state, gradients and parameters "
        "that plain data parallel training keeps on every GPU.",
        "Each rank owns one slice of the training state and the ranks exchange slices with collectives when needed.",
        "Pick the lowest ZeRO stage that fits the model, because every higher stage adds communication.",
    ),
    (
        "ZeRO stage 1",
        "ZeRO stage 1 partitions the optimizer state across the data parallel ranks.",
        "With Adam in mixed precision the optimizer state is twelve bytes per parameter, so stage 1 saves the most "
        "memory for the least extra traffic.",
        "Start with stage 1 when the weights and gradients already fit but the optimizer state does not.",
    ),
    (
        "ZeRO stage 2",
        "ZeRO stage 2 partitions the optimizer state and the gradients.",
        "Gradients are reduced with a reduce-scatter, so each rank keeps only the slice it will update.",
        "Stage 2 costs about the same communication as data parallel training, so it is a safe default.",
    ),
    (
        "ZeRO stage 3",
        "ZeRO stage 3 partitions the optimizer state, the gradients and the parameters themselves.",
        "Before a layer runs, its parameters are gathered from all ranks, and they are released right after use.",
        "Use stage 3 when even the half precision weights do not fit on one GPU.",
    ),
    (
        "ZeRO-Offload",
        "ZeRO-Offload moves the optimizer state and the optimizer step to CPU memory.",
        "The GPU computes the forward and backward pass while the CPU runs Adam on the fp32 master weights.",
        "Offload helps when GPU memory is short but host memory is large; watch the PCIe bandwidth.",
    ),
    (
        "ZeRO-Infinity",
        "ZeRO-Infinity extends offloading to NVMe drives for parameters and optimizer state.",
        "It streams tensors between GPU, CPU and NVMe with asynchronous I/O so the GPU keeps working.",
        "Give NVMe offload a fast local drive and a path that exists on every node.",
    ),
    (
        "DeepSpeed",
        "DeepSpeed is a library that wraps a PyTorch model in an engine that runs ZeRO, mixed precision and "
        "gradient accumulation.",
        "The engine reads a JSON configuration that sets the batch sizes, the ZeRO stage, offloading and precision.",
        "Validate the DeepSpeed JSON before a long job, because a typo can silently disable a feature.",
    ),
    (
        "the deepspeed launcher",
        "The deepspeed launcher starts one process per GPU on every host listed in a hostfile.",
        "It sets the rank, local rank and world size in the environment of each process.",
        "On a single node the launcher needs no hostfile and no ssh.",
    ),
    (
        "FSDP",
        "FSDP, Fully Sharded Data Parallel, is the PyTorch native way to shard parameters, gradients and "
        "optimizer state.",
        "FSDP2 shards each parameter along its first dimension and gathers it per module during compute.",
        "Wrap each transformer block separately so gathers overlap with compute.",
    ),
    (
        "DDP",
        "DDP, Distributed Data Parallel, keeps a full copy of the model on every rank and averages gradients.",
        "Gradients are all-reduced in buckets while the backward pass is still running.",
        "DDP is the fastest choice when the whole model and its optimizer fit on each GPU.",
    ),
    (
        "gradient accumulation",
        "Gradient accumulation sums gradients over several micro batches before one optimizer step.",
        "It makes the effective batch larger without needing more memory for activations.",
        "Keep the global batch fixed when you change the number of GPUs by adjusting the accumulation steps.",
    ),
    (
        "the global batch size",
        "The global batch size is the micro batch per GPU times the accumulation steps times the number of GPUs.",
        "DeepSpeed checks that train_batch_size equals that product and stops if it does not.",
        "Set two of the three numbers and let the tool derive the third.",
    ),
    (
        "mixed precision",
        "Mixed precision runs most math in bf16 or fp16 while keeping fp32 master weights for the update.",
        "bf16 has the same exponent range as fp32, so it rarely needs loss scaling.",
        "Prefer bf16 on GPUs that support it and use fp16 with dynamic loss scaling elsewhere.",
    ),
    (
        "loss scaling",
        "Loss scaling multiplies the loss before backward so small fp16 gradients do not underflow.",
        "Dynamic loss scaling lowers the scale after an overflow and raises it after a run of clean steps.",
        "If many steps are skipped for overflow, check the learning rate and the data before the scaler.",
    ),
    (
        "activation checkpointing",
        "Activation checkpointing saves only some activations and recomputes the rest during backward.",
        "It trades about one third more compute for a large cut in activation memory.",
        "Turn it on when long sequences make activations larger than the weights.",
    ),
    (
        "a checkpoint",
        "A checkpoint stores the model, the optimizer, the scheduler, the random state and the data position.",
        "With ZeRO each rank writes its own shard, and a small file records which step is the latest.",
        "Move the latest pointer only after every shard is complete, so a crash never leaves a half checkpoint.",
    ),
    (
        "resuming training",
        "Resuming training loads the newest complete checkpoint and continues from the same step.",
        "An exact resume restores the random generators and skips the batches that were already seen.",
        "Test resume by comparing the weights of an interrupted run with an uninterrupted one.",
    ),
    (
        "a universal checkpoint",
        "A universal checkpoint stores each parameter whole, independent of how many ranks wrote it.",
        "It lets a run saved on two GPUs continue on one or four GPUs.",
        "Convert to the universal format when the world size changes between runs.",
    ),
    (
        "exporting a model",
        "Exporting gathers the sharded ZeRO weights into one Hugging Face directory with safetensors files.",
        "The exported directory loads with from_pretrained and needs no DeepSpeed at all.",
        "Stream the export shard by shard so host memory stays small.",
    ),
    (
        "LoRA",
        "LoRA trains two small low rank matrices beside each frozen weight instead of the weight itself.",
        "The rank r controls the size of the adapters and alpha scales their output.",
        "LoRA with ZeRO stage 3 lets a large model fine-tune on a few GPUs.",
    ),
    (
        "the all-reduce",
        "An all-reduce sums a tensor across all ranks and gives every rank the result.",
        "A ring all-reduce sends about twice the tensor size per rank, whatever the number of ranks.",
        "Large buckets use the network better than many small messages.",
    ),
    (
        "the reduce-scatter",
        "A reduce-scatter sums a tensor across ranks and leaves each rank with one slice of the sum.",
        "It moves half the data of an all-reduce, which is why ZeRO stage 2 is cheap.",
        "Match the bucket size to the hidden size of the model.",
    ),
    (
        "the all-gather",
        "An all-gather collects one slice from every rank so that each rank holds the whole tensor.",
        "ZeRO stage 3 all-gathers parameters before each layer in forward and in backward.",
        "Prefetching the next layer hides the all-gather behind compute.",
    ),
    (
        "NCCL",
        "NCCL is the NVIDIA library for collectives between GPUs.",
        "It uses NVLink inside a node and InfiniBand or Ethernet between nodes.",
        "Set a collective timeout so a dead rank stops the job instead of hanging it.",
    ),
    (
        "gloo",
        "Gloo is a collective backend that runs on CPUs.",
        "It lets distributed training code be tested on a laptop or a CI machine without GPUs.",
        "Use gloo for CPU tests and NCCL for GPU runs.",
    ),
    (
        "the world size",
        "The world size is the total number of processes in a distributed job.",
        "Each process has a global rank from zero to the world size minus one.",
        "Read the world size from the launcher environment instead of guessing it.",
    ),
    (
        "a hostfile",
        "A hostfile lists the nodes of a job and how many slots each one has.",
        "The deepspeed launcher reads it to decide where to start processes.",
        "Keep one line per host, with the host name and slots equal to its GPU count.",
    ),
    (
        "SLURM",
        "SLURM is a cluster scheduler that allocates nodes and starts tasks on them.",
        "Before preempting a job, SLURM sends SIGTERM so the job can save a checkpoint.",
        "Catch SIGTERM, finish the step, save, and exit with a clear code.",
    ),
    (
        "the learning rate schedule",
        "A learning rate schedule changes the step size during training, often with warmup and decay.",
        "Warmup avoids large updates while Adam statistics are still noisy.",
        "Save the scheduler state in every checkpoint or resume will jump the learning rate.",
    ),
    (
        "Adam",
        "Adam keeps a running mean and a running variance of the gradient for every parameter.",
        "In mixed precision it also needs an fp32 copy of the weights, twelve bytes per parameter in total.",
        "Budget sixteen bytes per parameter for weights, gradients and Adam state before ZeRO.",
    ),
    (
        "tokens per second",
        "Tokens per second counts how many training tokens the whole job processes each second.",
        "It is the fairest speed measure when sequence lengths and batch sizes differ.",
        "Exclude warmup steps and synchronize before reading the clock.",
    ),
    (
        "MFU",
        "MFU, model FLOPs utilization, is the achieved model FLOPs divided by the peak FLOPs of the hardware.",
        "A training step of a decoder costs about six FLOPs per parameter per token.",
        "Always state which peak number you divided by.",
    ),
    (
        "a tokenizer",
        "A tokenizer turns text into integer ids and back again.",
        "Byte level BPE merges frequent byte pairs, so any text can be encoded without unknown tokens.",
        "Ship the tokenizer with the model so the ids always match the embedding table.",
    ),
    (
        "a chat template",
        "A chat template renders a list of messages into the exact text the model was trained on.",
        "It marks where each user and assistant turn starts and ends.",
        "Train only on the assistant turns so the model does not learn to imitate the user.",
    ),
    (
        "prompt masking",
        "Prompt masking sets the labels of prompt tokens to minus one hundred so they add nothing to the loss.",
        "The model still reads the prompt; it just is not graded on predicting it.",
        "Check masking by decoding the tokens that keep their labels.",
    ),
    (
        "sequence packing",
        "Sequence packing joins several short examples into one full length sequence.",
        "It removes padding, so more of each batch is real training data.",
        "Restart the position ids at each example and mask the boundary so examples do not leak into each other.",
    ),
    (
        "padding",
        "Padding fills short sequences up to the length of the longest one in the batch.",
        "Padded positions get an attention mask of zero and a label of minus one hundred.",
        "Sort or pack examples by length to waste less compute on padding.",
    ),
    (
        "the LLaMA architecture",
        "The LLaMA architecture is a decoder-only transformer with RMSNorm, rotary position embeddings and SwiGLU.",
        "Grouped query attention shares key and value heads between several query heads.",
        "Mistral and Qwen2 models use the same layout, so the same training code serves them.",
    ),
    (
        "pipeline parallelism",
        "Pipeline parallelism splits the layers of a model across GPUs and streams micro batches through them.",
        "Bubbles appear at the start and end of each batch when some stages are idle.",
        "More micro batches per step shrink the bubble.",
    ),
    (
        "tensor parallelism",
        "Tensor parallelism splits single matrix multiplications across GPUs.",
        "It needs fast links, because it communicates inside every layer.",
        "Keep tensor parallel groups inside one node.",
    ),
    (
        "a memory plan",
        "A memory plan estimates the bytes each GPU needs for weights, gradients, optimizer state and activations.",
        "Divide the sharded parts by the number of ranks for the ZeRO stage in use.",
        "Leave headroom for fragmentation and communication buffers.",
    ),
    (
        "a preempted job",
        "A preempted job is stopped by the scheduler to make room for other work.",
        "If it saved a checkpoint on SIGTERM, the next run resumes with almost no lost steps.",
        "Use a short save interval on preemptible nodes.",
    ),
]

PARAGRAPH_LINKS = [
    "In practice,",
    "For example,",
    "As a rule of thumb,",
    "On a real cluster,",
    "When a job fails,",
]
