"""zero-kit's checkpoints on disk, read by `zero-kit train` and `zero-kit export` alike: store (which checkpoint-N is
complete and zero-kit's, what may be deleted), claim (one job per output), universal (resume at another world
size through DeepSpeed's universal checkpoint)."""
