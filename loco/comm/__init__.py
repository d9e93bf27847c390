"""Communication steps: the only code that looks across workers (DESIGN §1, §5).

  core     CommState / Wire (what went over the wire), WorkerContext, all_reduce_mean
  gossip   one mixing step over a graph (all-reduce / sparse ppermute / dense), gossip
  sparse   compressed collectives: sparse_all_gather_mean, compressed_all_reduce_mean

The graphs themselves (topologies, random families, `resolve_topology`) are host-side
numpy in `loco.topology`; the names below re-export the ones algorithms use.
"""

from loco.comm.core import (ALL_GATHER, ALL_REDUCE, GOSSIP, KINDS, NO_COMM, CommState,
                            TRANSPORT_DTYPES, WORKERS, Wire, WorkerContext, alive_of,
                            alive_peers, all_reduce_mean, empty_comm_state, no_wire,
                            ring_all_reduce_state, static_num_workers, transport_dtype,
                            tree_bytes, wire_bytes, worker_mean)
from loco.comm.gossip import (GossipState, Mixed, gossip, keep_snapshots, mixing_step,
                              round_key)
from loco.comm.sparse import (CompressedCommState, compressed_all_reduce_mean,
                              sparse_all_gather_mean)
from loco.comm.sparta import SpartaState
from loco.topology import is_all_reduce, pairwise_family, resolve_topology

# The states of communication links: each worker's own (its wire record, error-feedback
# residual, random key), never copied from another worker (a keep-local catch-up copies
# the rest of the outer state).
LINK_STATES = (CommState, CompressedCommState, GossipState, SpartaState)
