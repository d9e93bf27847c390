"""Communication steps: the only code that looks across workers (DESIGN §1, §5).

  core     CommState, WorkerContext, byte accounting, all_reduce_mean
"""

from loco.comm.core import (CommState, TRANSPORT_DTYPES, WORKERS, WorkerContext,
                            all_reduce_mean, empty_comm_state, num_workers, transport_dtype,
                            tree_bytes, wire_bytes, worker_mean)
