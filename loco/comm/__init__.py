"""Communication steps: the only code that looks across workers (DESIGN §1, §5).

  core     CommState / Wire (what went over the wire), WorkerContext, all_reduce_mean
  gossip   gossip over a graph (dense / sparse ppermute / all-reduce), gossip_residual
  sparse   compressed collectives: sparse_all_gather_mean, compressed_all_reduce_mean
"""

from loco.comm.core import (ALL_GATHER, ALL_REDUCE, GOSSIP, KINDS, NO_COMM, CommState,
                            TRANSPORT_DTYPES, WORKERS, Wire, WorkerContext, all_reduce_mean,
                            empty_comm_state, no_wire, num_workers, other_participants,
                            ring_all_reduce_state, transport_dtype, tree_bytes, wire_bytes,
                            worker_mean)
from loco.comm.gossip import (GossipState, gossip, gossip_residual, is_all_reduce,
                              pairwise_family, resolve_topology, round_key,
                              static_num_workers)
from loco.comm.sparse import (CompressedCommState, compressed_all_reduce_mean,
                              sparse_all_gather_mean)
