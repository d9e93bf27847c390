"""Decentralized baselines with one local step per exchange or per round.

  dsgd    local step, then gossip of the models (adapt-then-combine), every step
  adpsgd  AD-PSGD, synchronous: average with a random neighbour, then the local step
  a2cid2  AD-PSGD-style pairwise exchanges with A2CiD2's continuous momentum
  noloco  every H steps, average with a random partner, heavy-ball outer step

All are compositions of the engine (`local_updates`) and `comm.gossip`; A2CiD2's
second variable lives in the state of its own exchange transform (inner chain), so
no engine change is needed.
"""

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from loco import comm
from loco.algorithms import optim
from loco.comm import topology as topology_lib
from loco.algorithms.spec import AlgorithmSpec
from loco.core.engine import Algorithm, local_updates, pairwise_gossip
from loco.comm import axis as comm_axis

PyTree = Any


def dsgd(inner: optax.GradientTransformation, *, topology: str = 'ring',
         weights: str = 'metropolis', gossip_step: float = 1.0,
         transport_dtype: str = 'float32', seed: int = 0, mesh=None) -> Algorithm:
  """D-SGD / D-AdamW: every step, a local inner step, then gossip of the models.

  `x_i <- sum_j W_ij (x_j - lr u_j)` (adapt-then-combine): GASLoC with H = 1 and
  outer SGD at learning rate 1.

  Args:
    inner: the per-worker inner optimizer.
    topology: graph name or `loco.comm.topology.Topology` (see `gasloc`).
    weights: 'metropolis' or 'uniform'.
    gossip_step: gossip step size in (0, 1].
    transport_dtype: dtype of the models on the wire.
    seed: seed of an 'erdos_renyi' graph.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    Lian et al., arXiv 1705.09056 (D-PSGD); Koloskova et al., arXiv 2003.10422.
  """
  mixer = comm.gossip(topology, 'models', step_size=gossip_step, dtype=transport_dtype,
                      weights=weights, seed=seed)
  return local_updates(inner, optax.chain(mixer, optim.outer_optimizer('sgd', 1.0)),
                       1, shared_anchor=False, mesh=mesh)


def adpsgd(inner: optax.GradientTransformation, *, topology: str = 'exponential',
           transport_dtype: str = 'float32', seed: int = 0, mesh=None) -> Algorithm:
  """AD-PSGD, simulated synchronously: `x_i <- (x_i + x_p(i)) / 2 + u_i(g_i(x_i))`.

  Every step each worker averages with the partner of a random matching of the
  graph (drawn per step, shared by all workers; `topology.pairwise_family`), then adds
  its local inner update, computed from the gradient at its pre-averaging params.

  Args:
    inner: the per-worker inner optimizer.
    topology: the graph the matchings are drawn from (AD-PSGD's default is the
      exponential graph; 'matching' draws from all pairs).
    transport_dtype: dtype of the models on the wire.
    seed: seed of an 'erdos_renyi' graph.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    Lian et al., arXiv 1710.06952 (AD-PSGD).
  """
  mixer = comm.gossip(topology, 'params', dtype=transport_dtype, seed=seed, pairwise=True)
  return local_updates(optax.chain(inner, mixer), None, 1, mesh=mesh)


class A2CiD2State(NamedTuple):
  """State of the A2CiD2 exchange: the second variable and the gossip bookkeeping."""
  tilde: PyTree          # x~, A2CiD2's momentum variable, in the params' dtype
  count: jax.Array       # int32, exchanges so far (seeds the draw without a tick key)
  comm: comm.Wire        # what the last exchange put on the wire


def a2cid2_exchange(topology: str = 'ring', *, weights: str = 'metropolis',
                    dtype: str = 'float32', seed: int = 0,
                    axis_name: str = comm.WORKERS) -> optax.GradientTransformationExtraArgs:
  """A2CiD2's events in one synchronous tick, as an inner-chain link after the optimizer.

  Time runs in units of one gradient step; each tick is: the gradient event (the
  inner update u applied to x and to x~), continuous mixing for half a unit
  (`x <- a x + b x~`, `x~ <- b x + a x~`, a = (1 + e^{-2 eta t})/2,
  b = (1 - e^{-2 eta t})/2), one pairwise exchange along a random matching of the
  graph (`x~ <- x~ + alpha~ (x_j - x_i)`, then `x <- (x_i + x_j)/2`), and mixing for
  the other half, so the next gradient is taken right after the tick. With
  eta = 1/(2 sqrt(chi1 chi2)) and alpha~ = sqrt(chi1/chi2)/2, chi1 and chi2 of the
  matching family's edge rates (one exchange per worker per gradient step).

  Args:
    topology: the graph the matchings are drawn from (name or `Topology`).
    weights: 'metropolis' or 'uniform' (only the graph matters: pairs average).
    dtype: transport dtype of the exchanged models.
    seed: seed of an 'erdos_renyi' graph and of the draws without a tick key.
    axis_name: the worker axis name.

  Returns:
    An optax transformation with extra arg `context`, state `A2CiD2State`.

  References:
    Nabli et al., arXiv 2306.08289 (A2CiD2); code AdelNabli/ACiD.
  """
  comm.transport_dtype(dtype)   # fail early on a bad dtype
  topology_lib.check_spec(topology, weights)

  resolve = functools.partial(topology_lib.resolve_topology, topology, weights=weights,
                              seed=seed, pairwise=True)

  def init(params):
    num_workers = comm.static_num_workers(axis_name)
    if num_workers is not None:
      resolve(num_workers)   # a topology that does not fit M fails at init
    return A2CiD2State(params, jnp.zeros((), jnp.int32), comm.empty_wire(axis_name))

  def update(updates, state, params=None, *, context=None, **extra):
    del extra
    family = resolve(comm_axis.axis_size(axis_name))
    if family.num_workers > 1:
      chi1, chi2 = family.chi1, family.chi2
      eta, alpha = 0.5 / math.sqrt(chi1 * chi2), 0.5 * math.sqrt(chi1 / chi2)
    else:
      eta = alpha = 0.0
    decay = math.exp(-2.0 * eta * 0.5)
    a, b = (1.0 + decay) / 2.0, (1.0 - decay) / 2.0

    def ode(x, xt):
      return (jax.tree.map(lambda p, q: a * p + b * q, x, xt),
              jax.tree.map(lambda p, q: b * p + a * q, x, xt))

    f32 = lambda t: optax.tree.cast(t, jnp.float32)
    x = optax.tree.add(f32(params), f32(updates))
    xt = optax.tree.add(f32(state.tilde), f32(updates))
    x, xt = ode(x, xt)
    key = comm.round_key(context, seed, state.count)
    mixed, sent = comm.mixing_step(x, family, context=context, key=key, dtype=dtype,
                                   axis_name=axis_name)
    # A matched pair moves by (x_j - x_i) / 2; unmatched and dead workers by 0.
    xt = optax.tree.add_scale(xt, 2.0 * alpha, mixed.moved)
    x, xt = ode(mixed.new, xt)
    new_updates = optax.tree.cast_like(optax.tree.sub(x, f32(params)), updates)
    return new_updates, A2CiD2State(optax.tree.cast_like(xt, state.tilde), state.count + 1, sent)

  return optax.GradientTransformationExtraArgs(init, update)


def a2cid2(inner: optax.GradientTransformation, *, topology: str = 'ring',
           transport_dtype: str = 'float32', seed: int = 0, mesh=None) -> Algorithm:
  """A2CiD2: pairwise gossip with a continuous momentum, one exchange per step.

  Synchronous simulation of the asynchronous method: each step is one gradient and
  one exchange per worker along a random matching of `topology` (see
  `a2cid2_exchange`); the second variable x~ is part of the inner chain's state.

  Args:
    inner: the per-worker inner optimizer.
    topology: the graph the matchings are drawn from (the paper's: 'ring', 'exponential').
    transport_dtype: dtype of the models on the wire.
    seed: seed of an 'erdos_renyi' graph.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    Nabli, Belilovsky, Oyallon, arXiv 2306.08289.
  """
  exchange = a2cid2_exchange(topology, dtype=transport_dtype, seed=seed)
  return local_updates(optax.chain(inner, exchange), None, 1, mesh=mesh)


def noloco(inner: optax.GradientTransformation, *, sync_every: int = 50,
           topology: str = 'matching', outer_lr: float = 0.7, outer_momentum: float = 0.5,
           transport_dtype: str = 'float32', seed: int = 0, mesh=None) -> Algorithm:
  """NoLoCo: every H steps, average with a random partner and take a heavy-ball step.

  `m <- mu m - lr (phi_i - mean_{j in G} p_j)`, `phi_i <- phi_i + m`, `p_i <- phi_i`,
  with G = {i, its partner in a random perfect matching}: GASLoC on random
  matchings with a heavy-ball outer optimizer (optax's trace form is the same
  recursion with m = -lr * trace).

  Args:
    inner: the per-worker inner optimizer.
    sync_every: H (50).
    topology: the graph partners are drawn from ('matching': any pair, the paper's
      group size 2; needs an even number of workers).
    outer_lr: outer learning rate (0.7).
    outer_momentum: outer heavy-ball momentum mu (0.5).
    transport_dtype: dtype of the models on the wire.
    seed: seed of an 'erdos_renyi' graph.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    Kolehmainen et al., arXiv 2506.10911 (NoLoCo); code jkolehm/noloco.
  """
  outer = optim.outer_optimizer('heavy_ball', outer_lr, outer_momentum)

  def outer_chain(stale: bool) -> optax.GradientTransformation:
    return optax.chain(comm.gossip(topology, 'models', dtype=transport_dtype, seed=seed,
                                   pairwise=True, stale=stale), outer)

  peers = lambda m: topology_lib.resolve_topology(topology, m, seed=seed,
                                                  pairwise=True).adjacency
  return pairwise_gossip(inner, outer_chain, sync_every, peers, transport_dtype, mesh)


DSGD = AlgorithmSpec(dsgd, example=dict(topology='ring'), carrier='collective-permute')
_PAIR = ('a random pair exchange is simulated as the ring shifts toward every candidate '
         "partner, each worker keeping its partner's (2 on a ring, up to 7 for a perfect "
         'matching of 8 workers); a deployment sends one model to one partner, which the '
         'wire record counts')
ADPSGD = AlgorithmSpec(adpsgd, example=dict(topology='exponential'),
                       carrier='collective-permute', simulated_as={'adpsgd': _PAIR})
A2CID2 = AlgorithmSpec(a2cid2, example=dict(topology='ring'), carrier='collective-permute',
                       simulated_as={'a2cid2': _PAIR})
NOLOCO = AlgorithmSpec(noloco, example=dict(sync_every=3, topology='matching'),
                       carrier='collective-permute', simulated_as={'noloco': _PAIR})
