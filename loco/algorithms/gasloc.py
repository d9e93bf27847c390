"""GASLoC: decentralized DiLoCo, the all-reduce replaced by gossip over a graph."""

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax

from loco import comm
from loco.algorithms import optim
from loco.comm import topology as topology_lib
from loco.algorithms.spec import AlgorithmSpec, Key
from loco.core.engine import Algorithm, pairwise_gossip
from loco.errors import ConfigError


FORMS = ('diloco_outer', 'proposed_points')


class ProposalState(NamedTuple):
  mixer: Any            # the gossip link's state
  previous: Any         # y_{t-1}, float32 (empty when gamma = 0)
  started: jnp.ndarray  # bool: a previous proposal exists


def proposed_point_gossip(mixer: optax.GradientTransformationExtraArgs, eta: float,
                          gamma: float) -> optax.GradientTransformationExtraArgs:
  """GASLoC's update as stated (REFERENCES.md): gossip the proposed points, heavy-ball.

  Per worker, with `Delta = theta - phi` (so the drift is `g = -Delta`): the proposed
  point `y = theta - eta Delta`, then `theta <- y - alpha Lambda y + gamma (y - y_prev)`,
  where `y - alpha Lambda y` is `mixer` (a `comm.gossip(mix='models')` link of step
  alpha) and `y_prev` this worker's previous proposed point (none at the first round).
  Returns the anchor's update `theta_new - theta`.
  """
  def init(params):
    previous = (optax.tree.zeros_like(optax.tree.cast(params, jnp.float32))
                if optim.positive(gamma) else ())
    return ProposalState(mixer.init(params), previous, jnp.zeros((), bool))

  def update(delta, state, params=None, **extra):
    step = optax.tree.scale(eta, optax.tree.cast(delta, jnp.float32))
    # The link mixes the models `params - step` = y and returns theta - (W_alpha y).
    mixed, mixer_state = mixer.update(step, state.mixer, params, **extra)
    out = optax.tree.scale(-1.0, mixed)
    previous = state.previous
    if optim.positive(gamma):
      y = optax.tree.sub(optax.tree.cast(params, jnp.float32), step)
      velocity = optax.tree.scale(gamma, optax.tree.sub(y, state.previous))
      out = optax.tree.where(state.started, optax.tree.add(out, velocity), out)
      previous = y
    return (optax.tree.cast_like(out, delta),
            ProposalState(mixer_state, previous, jnp.ones((), bool)))

  return optax.GradientTransformationExtraArgs(init, update)


def gasloc(inner: optax.GradientTransformation, *, sync_every: int = 500,
           topology: str = 'ring', weights: str = 'metropolis', mix: str = 'models',
           form: str = 'diloco_outer', outer_optimizer: str = 'nesterov', outer_lr: float = 0.7,
           outer_momentum: float = 0.9, gossip_step: float = 1.0,
           transport_dtype: str = 'float32', seed: int = 0, pairwise: bool = False,
           outer: optax.GradientTransformation | None = None, mesh=None) -> Algorithm:
  """GASLoC: H local steps, gossip the local models, then a per-worker outer step.

  Per worker i, every H inner steps: `z_i = sum_j W_ij phi_j` (gossip of the local
  models over `topology`), `Delta_i = theta_i - z_i`, and the outer optimizer on
  this worker's own `(theta_i, m_i)` (Nesterov by default), where the outer momentum
  doubles as gossip acceleration. With `mix='deltas'` the pseudo-gradients are
  gossiped instead. On the complete graph W = 11^T/M is the all-reduce and GASLoC is
  DiLoCo exactly. This is `form='diloco_outer'`, loco's reconstruction from the
  abstract.

  `form='proposed_points'` is the update as a later third-party statement of the paper
  gives it (REFERENCES.md): gossip of the proposed points `y_i = theta_i + eta g_i`
  (`g_i = phi_i - theta_i`) with step alpha, and heavy-ball gamma on consecutive proposed
  points, `theta <- y - alpha Lambda y + gamma (y - y_prev)`, with eta = `outer_lr`,
  alpha = `gossip_step`, gamma = `outer_momentum` (`outer_optimizer` and `mix` unused).
  The forms agree at eta = 1, gamma = 0 and outer SGD lr 1; on the complete graph with
  gamma = 0 it is DiLoCo with outer SGD at lr eta.

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
      `loco.comm.topology.Topology`; it must fit num_workers.
    weights: 'metropolis' or 'uniform' mixing weights.
    mix: 'models' (the paper's reconstruction) or 'deltas'.
    form: 'diloco_outer' (gossip the local models, then a DiLoCo outer optimizer) or
      'proposed_points' (the stated form: gossip y = theta + eta g, heavy-ball on y).
    outer_optimizer: 'nesterov', 'heavy_ball', 'sgd' or 'adam'.
    outer_lr: outer learning rate.
    outer_momentum: outer momentum.
    gossip_step: gossip step size gamma in (0, 1].
    transport_dtype: dtype of what is sent over each edge.
    seed: seed of an 'erdos_renyi' graph.
    pairwise: gossip with one random neighbour per round (a random matching of the
      graph, `topology.pairwise_family`: the paper's "sparse randomized peer
      communication") instead of every neighbour.
    outer: an optax chain to use as the outer optimizer instead of the named one.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    GASLoC, arXiv 2606.11081; DiLoCo, arXiv 2311.08105.
  """
  if form not in FORMS:
    raise ConfigError(f'algorithm.form must be one of {", ".join(FORMS)}, got {form!r}.')
  if mix not in ('models', 'deltas'):
    raise ConfigError(f"algorithm.mix must be 'models' or 'deltas', got {mix!r}.")
  if form == 'proposed_points' and (outer is not None or mix != 'models'):
    raise ConfigError("algorithm.form='proposed_points' gossips the proposed points "
                      "with its own heavy-ball step: it takes no outer chain and mix "
                      "'models' only.")
  if form != 'proposed_points' and outer is None:
    outer = optim.outer_optimizer(outer_optimizer, outer_lr, outer_momentum)

  def outer_chain(stale: bool) -> optax.GradientTransformation:
    mixer = comm.gossip(topology, mix, step_size=gossip_step, dtype=transport_dtype,
                        weights=weights, seed=seed, stale=stale, pairwise=pairwise)
    if form == 'proposed_points':
      return proposed_point_gossip(mixer, outer_lr, outer_momentum)
    return optax.chain(mixer, outer)

  # Per-worker local steps (the paper's H_i) are the engine's `local_steps` key.
  peers = lambda m: topology_lib.resolve_topology(topology, m, weights=weights,
                                                  seed=seed).adjacency
  return pairwise_gossip(inner, outer_chain, sync_every, peers, transport_dtype, mesh)


GASLOC = AlgorithmSpec(
    gasloc,
    keys={'mix': Key(str, 'GASLoC gossips: models | deltas'),
          'form': Key(str, 'GASLoC form: diloco_outer | proposed_points'),
          'pairwise': Key(bool, 'GASLoC: one random neighbour per round (a random '
                          'matching of the graph)')},
    example=dict(sync_every=2, topology='ring'), variants={'matching': dict(topology='matching')},
    carrier='collective-permute',
    simulated_as={'gasloc_matching': 'a random perfect matching is simulated as the ring '
                                     'shifts its pairs are made of, every worker keeping '
                                     "its partner's (up to 7 shifts of the model on 8 "
                                     'workers); a deployment sends one model to one '
                                     'partner, which the wire record counts'})
