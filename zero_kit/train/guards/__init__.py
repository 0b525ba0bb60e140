"""The checks of a run before its work: inputs (check first: a second's checks of every flag and file, in the
parent), preflight (the output's filesystem and the host, in each rank), fit (will the run fit in memory, before a
launch), oom (an out-of-memory that happened anyway, named)."""
