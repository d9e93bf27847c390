"""GASLoC: decentralized DiLoCo, the all-reduce replaced by gossip over a graph."""

import optax

from loco import comm
from loco import optim
from loco import topology as topology_lib
from loco.engine import Algorithm, AsyncReplay, local_updates
from loco.errors import ConfigError


def gasloc(inner: optax.GradientTransformation, *, sync_every: int = 500,
           topology: str = 'ring', weights: str = 'metropolis', mix: str = 'models',
           outer_optimizer: str = 'nesterov', outer_lr: float = 0.7,
           outer_momentum: float = 0.9, gossip_step: float = 1.0,
           transport_dtype: str = 'float32', seed: int = 0,
           outer: optax.GradientTransformation | None = None, mesh=None) -> Algorithm:
  """GASLoC: H local steps, gossip the local models, then a per-worker outer step.

  Per worker i, every H inner steps: `z_i = sum_j W_ij phi_j` (gossip of the local
  models over `topology`), `Delta_i = theta_i - z_i`, and the outer optimizer on
  this worker's own `(theta_i, m_i)` (Nesterov by default), where the outer momentum
  doubles as gossip acceleration. With `mix='deltas'` the pseudo-gradients are
  gossiped instead. On the complete graph W = 11^T/M is the all-reduce and GASLoC is
  DiLoCo exactly.

  The defaults are DiLoCo's (H 500, Nesterov 0.7 / 0.9, arXiv 2311.08105), so that
  `topology='complete'` reproduces `diloco()` at its defaults; like DiLoCo's, they
  are meant for long runs at H in the hundreds and overshoot on short tiny runs from
  scratch (REFERENCES.md, calibration): see experiments/tiny_gasloc.py for values
  that fit those.

  Args:
    inner: the per-worker inner optimizer.
    sync_every: H, inner steps per round.
    topology: graph name ('ring', 'torus', 'exponential', 'hypercube', 'complete',
      'erdos_renyi', or 'matching' for one random perfect matching per round) or a
      `loco.topology.Topology`; it must fit num_workers.
    weights: 'metropolis' or 'uniform' mixing weights.
    mix: 'models' (the paper's reconstruction) or 'deltas'.
    outer_optimizer: 'nesterov', 'heavy_ball', 'sgd' or 'adam'.
    outer_lr: outer learning rate.
    outer_momentum: outer momentum.
    gossip_step: gossip step size gamma in (0, 1].
    transport_dtype: dtype of what is sent over each edge.
    seed: seed of an 'erdos_renyi' graph.
    outer: an optax chain to use as the outer optimizer instead of the named one.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    GASLoC, arXiv 2606.11081; DiLoCo, arXiv 2311.08105.
  """
  if outer is None:
    outer = optim.outer_optimizer(outer_optimizer, outer_lr, outer_momentum)
  if mix not in ('models', 'deltas'):
    raise ConfigError(f"algorithm.mix must be 'models' or 'deltas', got {mix!r}.")
  mixer = comm.gossip(topology, mix, step_size=gossip_step, dtype=transport_dtype,
                      weights=weights, seed=seed)
  algorithm = local_updates(inner, optax.chain(mixer, outer), sync_every=sync_every, mesh=mesh)
  peers = lambda m: topology_lib.resolve_topology(topology, m, weights=weights, seed=seed).adjacency
  return algorithm._replace(replay=AsyncReplay(sync_every, peers, transport_dtype))
