"""Communication steps: the only code that looks across workers (DESIGN §1, §5).

The modules::

  core     WorkerContext, all_reduce_mean, ring_all_reduce_state; each transform's state
           holds a `loco.wire.Wire` (what went over the wire), re-exported here
  gossip   one mixing step over a graph (all-reduce / sparse ppermute / dense), gossip
  sparse   compressed collectives: sparse_all_gather_mean, compressed_all_reduce_mean
  ties     ties_mean: outer gradients pruned by magnitude and merged by sign (TIES)
  drift    a sync's drift diagnostics (pseudo-gradient norms and cosine, consensus
           distance): reductions over the worker axis that measure, not communicate
  rejoin   catch_up: a rejoining worker copies an up-to-date worker's state (offline
           dropout), LINK_STATES: the link states it never copies

The graphs themselves (topologies, random families, `resolve_topology`) are host-side
numpy in `loco.comm.topology`; the names below re-export the ones algorithms use.
"""

from loco.comm.core import (TRANSPORT_DTYPES, WORKERS, WorkerContext, alive_of, alive_peers,
                            all_reduce_mean, empty_wire, ring_all_reduce_state,
                            static_num_workers, transport_dtype, tree_bytes, worker_mean)
from loco.comm.drift import Drift
from loco.comm.gossip import (GossipState, Mixed, gossip, keep_snapshots, mixing_step,
                              round_key)
from loco.comm.rejoin import LINK_STATES, catch_up
from loco.comm.sparse import (CompressedState, compressed_all_reduce_mean,
                              sparse_all_gather_mean)
from loco.comm.sparta import SpartaState
from loco.comm.ties import ties_mean
from loco.comm.topology import is_all_reduce, pairwise_family, resolve_topology
from loco.wire import ALL_GATHER, ALL_REDUCE, GOSSIP, KINDS, NO_COMM, Wire
