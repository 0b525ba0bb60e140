"""The checks of a run before its work: inputs (check first: a second's checks of every flag and file, in the
parent), model_files (the model's weights and the modules --lora-targets names, torch-free), preflight (the output's
filesystem and the host, in each rank; a disk that fills up anyway, named), fit (will the run fit in memory, before
a launch), oom (an out-of-memory that happened anyway, named), diverged (a NaN or infinite loss stops the run)."""
