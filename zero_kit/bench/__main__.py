"""`python -m zero_kit.bench --strategy S --options-json J --record F`: one rank, started by a launcher."""

from zero_kit.bench.worker import worker_main
from zero_kit.dist import exit_rank

exit_rank(worker_main())  # no interpreter teardown: see zero_kit.dist.exit_rank
