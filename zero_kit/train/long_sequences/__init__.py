"""Long sequences: what a rank holds of one sequence. Sequence parallelism (`--sp`, Ulysses) is the HF Trainer's own
(zero_kit.train.rank.sequence_parallel_arguments); `tiled` slices the MLP and the logits with the loss."""
