"""Graphs -> mixing matrices -> static gossip plans; spectral quantities.

Pure host-side numpy, and all of loco's graph code (`loco.comm.gossip` only runs
it per worker). A `Topology` holds a doubly stochastic mixing matrix W (for a
random family: E[W]) and, per member of the family, a `GossipPlan`: W written as
a few static permutations, the form `loco.comm` runs inside
`jax.vmap(..., axis_name="workers")` or `shard_map` with `lax.ppermute`:

  x_i' = self_weight[i] x_i + sum_k recv_weight[k, i] ppermute(x, perms[k])_i.

Random time-varying graphs ("matching", `pairwise_family`) are a fixed, static
family (a 1-factorization of K_M); each round picks one member by index with
`lax.switch`, using `Topology.sample_choice_jax`. `resolve_topology` builds what
a gossip step runs once the number of workers is known. `Topology.spectral_gap` and
`chi1`, `chi2` (of the A2CiD2 communication rates, not of W) say how fast it mixes.

References:
  A2CiD2, Nabli et al., arXiv 2306.08289 (chi1, chi2).
  Koloskova et al., arXiv 2003.10422 (mixing parameter of random gossip).
  Boyd et al., "Fastest mixing Markov chain on a graph" (Metropolis weights).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, NamedTuple, Sequence, TYPE_CHECKING

import numpy as np

from loco.errors import ConfigError

if TYPE_CHECKING:
  import jax  # pylint: disable=g-bad-import-order

# One `lax.ppermute` permutation: (src, dst) pairs.
Perm = tuple[tuple[int, int], ...]

_ATOL = 1e-9


def _frozen(a: np.ndarray) -> np.ndarray:
  """Returns `a` read-only, so a frozen dataclass is frozen all the way down."""
  a = np.array(a)
  a.setflags(write=False)
  return a


@dataclasses.dataclass(frozen=True, eq=False)
class GossipPlan:
  """One gossip step as static permutations (the module docstring's formula).

  Every perm is a *full* permutation of range(M): `lax.ppermute` under
  `jax.vmap` requires one (its batching rule asserts len(perm) == axis size).
  A worker idle in perm k appears as a pair (i, i), a local copy that carries
  weight 0 and costs no bytes; `sends` counts only pairs with src != dst.

  Attributes:
    perms: K permutations, each a tuple of (src, dst) pairs sorted by src, with
      unique srcs and unique dsts; usable directly by `lax.ppermute`.
    self_weight: [M] float64, W_ii.
    recv_weight: [K, M] float64, the weight worker i gives to what it receives
      in perm k (W[i, src]); 0 where it receives its own value.
    sends: [M] int, messages worker i puts on the wire per application, which is
      its number of distinct neighbours (for byte accounting).
  """
  perms: tuple[Perm, ...]
  self_weight: np.ndarray
  recv_weight: np.ndarray
  sends: np.ndarray

  @property
  def num_workers(self) -> int:
    return int(self.self_weight.shape[0])

  @property
  def num_perms(self) -> int:
    return len(self.perms)

  @property
  def sources(self) -> np.ndarray:
    """[K, M] int: sources[k, i] is the worker i receives from in perm k.

    The gather form of the plan, `x[sources[k]]`, for a single-device path.
    """
    src = np.zeros((self.num_perms, self.num_workers), dtype=np.int32)
    for k, perm in enumerate(self.perms):
      for s, d in perm:
        src[k, d] = s
    return src

  @property
  def receives(self) -> np.ndarray:
    """[M] int: messages worker i receives per application: its sends, since a worker
    moved by a permutation both sends and receives one message in it."""
    return self.sends

  def to_dense(self) -> np.ndarray:
    """Returns the [M, M] mixing matrix this plan applies."""
    w = np.diag(self.self_weight).astype(np.float64)
    for k, perm in enumerate(self.perms):
      for s, d in perm:
        w[d, s] += self.recv_weight[k, d]
    return w


@dataclasses.dataclass(frozen=True, eq=False)
class Topology:
  """A communication graph, its mixing matrix and its static gossip plans.

  Compared by identity (eq=False), hence hashable: it can be a static argument
  or a closure constant of a jitted function.

  Attributes:
    name: topology name ("ring", ..., or "custom").
    num_workers: M.
    weights: [M, M] float64 mixing matrix W; for a random family, E[W], the
      mean over its equally likely members.
    plans: one `GossipPlan` per member (a single one for a fixed graph).
    adjacency: [M, M] bool, the graph (for a random family, the union of the
      members' graphs); no self-loops.
    rates: [M, M] float64, symmetric, zero diagonal: the A2CiD2 communication
      rates chi1 and chi2 are computed from. Each worker contacts its
      neighbour *slots* (directions: i+1 and i-1 on a ring, i +- 2^k on the
      exponential graph, one member of a random family) uniformly, as the
      A2CiD2 code does, so a neighbour reached by two slots (M=8 exponential:
      +4 and -4) counts twice. With R_ij = slots(i -> j) / slots(i), rates =
      (R + R^T) / 2 (each worker initiates at rate 1/2 and is contacted by its
      neighbours); on a regular graph rates = R, the code's W_ij = 1/deg(i).
    is_random: whether a member is drawn per round (time-varying graph).
  """
  name: str
  num_workers: int
  weights: np.ndarray
  plans: tuple[GossipPlan, ...]
  adjacency: np.ndarray
  rates: np.ndarray
  is_random: bool

  @property
  def plan(self) -> GossipPlan:
    """The plan of a fixed graph; a random family needs `plan_for(choice)`."""
    if self.is_random:
      raise ValueError(
          f'Topology {self.name!r} is a random family of {self.num_choices} '
          'plans; use plan_for(choice).')
    return self.plans[0]

  @property
  def num_choices(self) -> int:
    return len(self.plans)

  @property
  def degree(self) -> np.ndarray:
    """[M] int, distinct neighbours per worker (of the union graph)."""
    return self.adjacency.sum(axis=1)

  @property
  def edges(self) -> tuple[tuple[int, int], ...]:
    """Undirected edges (i, j), i < j, of the (union) graph."""
    i, j = np.nonzero(np.triu(self.adjacency, 1))
    return tuple(zip(i.tolist(), j.tolist()))

  def plan_for(self, choice: int) -> GossipPlan:
    return self.plans[self._check_choice(choice)]

  def weights_for(self, choice: int) -> np.ndarray:
    """[M, M] mixing matrix of member `choice` (W itself for a fixed graph)."""
    return self.plans[self._check_choice(choice)].to_dense()

  @functools.cached_property
  def member_weights(self) -> np.ndarray:
    """[num_choices, M, M]: every member's mixing matrix."""
    return np.stack([plan.to_dense() for plan in self.plans])

  def edges_used(self, choice: int = 0) -> np.ndarray:
    """[M] int, messages worker i sends when member `choice` is applied."""
    return self.plans[self._check_choice(choice)].sends

  def sample_choice(self, rng: np.random.Generator) -> int:
    """Draws a member index uniformly on the host."""
    return int(rng.integers(self.num_choices))

  def sample_choice_jax(self, key: jax.Array) -> jax.Array:
    """Draws a member index uniformly in jit: an int32 scalar for lax.switch."""
    # Imported here so that the graph code stays importable without JAX.
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    return jax.random.randint(key, (), 0, self.num_choices, dtype=jnp.int32)

  @functools.cached_property
  def spectral_gap(self) -> float:
    """1 - sqrt(lambda_max(E[W^T W] - 11^T/M)).

    E||W x - mean||^2 <= (1 - gap)^2 ||x - mean||^2 for every x, so the gap is
    the guaranteed per-step contraction of the (RMS) distance to consensus.
    For a fixed symmetric W this is 1 - max_{i>=2} abs(lambda_i(W)); for random
    matchings W_k^T W_k = W_k, so it is 1 - sqrt(lambda_2(E[W])).
    """
    m = self.num_workers
    centre = np.full((m, m), 1.0 / m)
    if not self.is_random:
      # Eigenvalues of W directly: sqrt of those of W^T W loses half the digits.
      lam = np.abs(np.linalg.eigvalsh(self.weights - centre)).max()
    else:
      gram = np.mean([w.T @ w for w in self.member_weights], axis=0)
      lam = math.sqrt(max(float(np.linalg.eigvalsh(gram - centre).max()), 0.0))
    return float(1.0 - lam)

  @functools.cached_property
  def _chis(self) -> tuple[float, float]:
    return laplacian_quantities(self.rates)

  @property
  def chi1(self) -> float:
    """1 / lambda_2(L), L the Laplacian of `rates` (A2CiD2, rate_com 1)."""
    return self._chis[0]

  @property
  def chi2(self) -> float:
    """max over edges of (e_i - e_j)^T L^+ (e_i - e_j) / 2 (A2CiD2, rate 1)."""
    return self._chis[1]

  def _check_choice(self, choice: int) -> int:
    if not 0 <= int(choice) < self.num_choices:
      raise IndexError(f'choice {choice} out of range [0, {self.num_choices}) '
                       f'for topology {self.name!r}.')
    return int(choice)


# ---------------------------------------------------------------------------
# Checks and spectral quantities.


def _is_connected(adjacency: np.ndarray) -> bool:
  seen = frontier = np.arange(len(adjacency)) == 0
  while frontier.any():
    frontier = adjacency[frontier].any(axis=0) & ~seen
    seen = seen | frontier
  return bool(seen.all())


def validate_mixing_matrix(weights: np.ndarray, *,
                           require_connected: bool = True,
                           atol: float = _ATOL) -> np.ndarray:
  """Checks that `weights` is a usable gossip matrix; returns it as float64.

  Args:
    weights: [M, M] candidate mixing matrix W.
    require_connected: also require the graph of W's nonzero off-diagonal
      entries to be connected (one member of a random family need not be).
    atol: absolute tolerance of the equality checks.

  Returns:
    W as a float64 array.

  Raises:
    ConfigError: naming the first property that fails: square, finite,
      nonnegative, symmetric, rows summing to 1, connected.
  """
  w = np.asarray(weights, dtype=np.float64)
  if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] == 0:
    raise ConfigError(f'Mixing matrix must be a non-empty square [M, M] '
                      f'array; got shape {w.shape}.')
  if not np.isfinite(w).all():
    raise ConfigError('Mixing matrix has non-finite entries; all entries must '
                      'be finite numbers in [0, 1].')
  if w.min() < -atol:
    i, j = np.unravel_index(np.argmin(w), w.shape)
    raise ConfigError(f'Mixing matrix has a negative entry W[{i}, {j}] = '
                      f'{w[i, j]:.3g}; all entries must be >= 0.')
  asym = np.abs(w - w.T)
  if asym.max() > atol:
    i, j = np.unravel_index(np.argmax(asym), w.shape)
    raise ConfigError(
        f'Mixing matrix is not symmetric (W[{i}, {j}] = {w[i, j]:.6g} but '
        f'W[{j}, {i}] = {w[j, i]:.6g}); it must equal its transpose.')
  rows = w.sum(axis=1)   # symmetric: the columns sum to the same
  if np.abs(rows - 1).max() > atol:
    i = int(np.argmax(np.abs(rows - 1)))
    raise ConfigError(f'Mixing matrix is not row-stochastic (row {i} sums to '
                      f'{rows[i]:.6g}); every row must sum to 1.')
  if require_connected:
    adjacency = (w > atol) & ~np.eye(w.shape[0], dtype=bool)
    if not _is_connected(adjacency):
      raise ConfigError('Mixing matrix is disconnected (its nonzero entries do '
                        'not link all workers); the graph must be connected to '
                        'reach consensus.')
  return w


def laplacian_quantities(rates: np.ndarray,
                         rate_com: float = 1.0) -> tuple[float, float]:
  """A2CiD2's graph constants (chi1, chi2).

  L = rate_com * (diag(A 1) - A) with A the off-diagonal part of `rates` (for a
  stochastic matrix, L = rate_com (I - W), the A2CiD2 form);
  chi1 = 1 / lambda_2(L) and chi2 = max over edges (A_ij > 0) of
  (e_i - e_j)^T L^+ (e_i - e_j) / 2. For M = 1 both are 0 (nothing to mix).

  Args:
    rates: [M, M] symmetric nonnegative communication rates (`Topology.rates`;
      the paper's W_ij = 1/deg(i) on a regular graph) or a mixing matrix.
    rate_com: communications per unit time, scaling L.

  Returns:
    (chi1, chi2).

  Raises:
    ConfigError: if `rates` is not square, symmetric and nonnegative, if
      `rate_com` <= 0, or if the graph is disconnected.

  References:
    A2CiD2, arXiv 2306.08289; code AdelNabli/ACiD `utils/graph_utils.py`.
  """
  r = np.asarray(rates, dtype=np.float64)
  if r.ndim != 2 or r.shape[0] != r.shape[1] or r.shape[0] == 0:
    raise ConfigError(f'Rates must be a non-empty square [M, M] array; got '
                      f'shape {r.shape}.')
  if not rate_com > 0:
    raise ConfigError(f'rate_com must be > 0; got {rate_com}.')
  off = r - np.diag(np.diag(r))
  if off.min() < -_ATOL or np.abs(off - off.T).max() > _ATOL:
    raise ConfigError('Rates must be symmetric with nonnegative off-diagonal '
                      'entries.')
  m = r.shape[0]
  if m == 1:
    return 0.0, 0.0
  lap = rate_com * (np.diag(off.sum(axis=1)) - off)
  evals, evecs = np.linalg.eigh(lap)
  if evals[1] <= 1e-12 * max(1.0, evals[-1]):
    raise ConfigError('Rates describe a disconnected graph (lambda_2(L) = 0); '
                      'chi1 and chi2 need a connected graph.')
  # L^+ from the eigendecomposition; column 0 spans the constants.
  pinv = (evecs[:, 1:] / evals[1:]) @ evecs[:, 1:].T
  i, j = np.nonzero(np.triu(off > _ATOL, 1))
  resistance = pinv[i, i] + pinv[j, j] - 2 * pinv[i, j]
  return float(1.0 / evals[1]), float(0.5 * resistance.max())


def _a2cid2_rates(slots: np.ndarray) -> np.ndarray:
  if len(slots) == 1:
    return np.zeros((1, 1))
  per_slot = slots / slots.sum(axis=1, keepdims=True)
  return (per_slot + per_slot.T) / 2


# ---------------------------------------------------------------------------
# Weights.


def _metropolis(adjacency: np.ndarray) -> np.ndarray:
  deg = adjacency.sum(axis=1)
  w = adjacency / (1.0 + np.maximum(deg[:, None], deg[None, :]))
  return w + np.diag(1.0 - w.sum(axis=1))


def _uniform(adjacency: np.ndarray) -> np.ndarray:
  # 1/(d_max + 1) on every edge keeps W symmetric on an irregular graph; the
  # rest of each row goes on the diagonal. On a d-regular graph: 1/(d + 1).
  w = adjacency / (1.0 + adjacency.sum(axis=1).max())
  return w + np.diag(1.0 - w.sum(axis=1))


_WEIGHTINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    'metropolis': _metropolis,
    'uniform': _uniform,
}


# ---------------------------------------------------------------------------
# Plans.


def _edge_colouring(adjacency: np.ndarray) -> list[list[tuple[int, int]]]:
  """Misra-Gries: partitions the undirected edges into <= d_max + 1 matchings.

  Matchings (not arbitrary directed colour classes) so that every perm is an
  involution padded with (i, i) pairs that move no bytes.
  """
  m = adjacency.shape[0]
  num_colours = int(adjacency.sum(axis=1).max()) + 1
  at = [dict() for _ in range(m)]  # at[v][colour] = neighbour.
  colour_of = {}  # (min, max) -> colour.

  def key(a, b):
    return (a, b) if a < b else (b, a)

  def put(a, b, c):
    at[a][c], at[b][c] = b, a
    colour_of[key(a, b)] = c

  def drop(a, b):
    c = colour_of.pop(key(a, b))
    del at[a][c], at[b][c]

  def free(v):
    return next(c for c in range(num_colours) if c not in at[v])

  for u, v in zip(*map(np.ndarray.tolist, np.nonzero(np.triu(adjacency, 1)))):
    # Maximal fan of u starting at v.
    fan, in_fan = [v], {v}
    grown = True
    while grown:
      grown = False
      for c, w in at[u].items():
        if w not in in_fan and c not in at[fan[-1]]:
          fan.append(w)
          in_fan.add(w)
          grown = True
          break
    c, d = free(u), free(fan[-1])
    if c != d:
      # Invert the cd-path from u (it starts with d since c is free at u).
      path, x, want = [], u, d
      while want in at[x]:
        y = at[x][want]
        path.append((x, y, want))
        x, want = y, (c if want == d else d)
      for a, b, _ in path:
        drop(a, b)
      for a, b, col in path:
        put(a, b, c if col == d else d)
    # First w in the fan with d free whose prefix is still a fan.
    end = None
    for idx, w in enumerate(fan):
      if d not in at[w]:
        end = idx
        break
      nxt = colour_of.get(key(u, fan[idx + 1])) if idx + 1 < len(fan) else None
      if nxt is None or nxt in at[w]:
        break
    if end is None:
      raise RuntimeError('Misra-Gries edge colouring failed; this is a bug.')
    shifted = [colour_of[key(u, fan[idx + 1])] for idx in range(end)]
    for w in fan[1:end + 1]:
      drop(u, w)
    for idx in range(end):
      put(u, fan[idx], shifted[idx])
    put(u, fan[end], d)

  classes = [[] for _ in range(num_colours)]
  for (a, b), c in sorted(colour_of.items()):
    classes[c].append((a, b))
  return [cls for cls in classes if cls]


def _matching_perm(num_workers: int, pairs: Sequence[tuple[int, int]]) -> Perm:
  dst = list(range(num_workers))  # Unmatched workers keep their own value.
  for a, b in pairs:
    dst[a], dst[b] = b, a
  return tuple((i, dst[i]) for i in range(num_workers))


def _make_plan(weights: np.ndarray,
               perms: Sequence[Perm] | None) -> GossipPlan:
  """Writes W as `perms` (edge-coloured from W's support when None)."""
  m = weights.shape[0]
  support = (weights > 0) & ~np.eye(m, dtype=bool)
  if perms is None:
    perms = [_matching_perm(m, cls) for cls in _edge_colouring(support)]
  perms = tuple(tuple(sorted((int(s), int(d)) for s, d in p)) for p in perms)
  recv = np.zeros((len(perms), m))
  sends = np.zeros(m, dtype=np.int64)
  covered = np.zeros((m, m), dtype=np.int64)
  for k, perm in enumerate(perms):
    srcs, dsts = [s for s, _ in perm], [d for _, d in perm]
    if sorted(srcs) != list(range(m)) or sorted(dsts) != list(range(m)):
      raise RuntimeError(f'perm {k} is not a permutation of range({m}).')
    for s, d in perm:
      if s != d:
        recv[k, d] = weights[d, s]
        sends[s] += 1
        covered[d, s] += 1
  if not np.array_equal(covered, support.astype(np.int64)):
    raise RuntimeError('perms do not cover each edge exactly once; a bug.')
  return GossipPlan(perms=perms, self_weight=_frozen(np.diag(weights)),
                    recv_weight=_frozen(recv), sends=_frozen(sends))


# ---------------------------------------------------------------------------
# Graphs. A builder returns the members of its family (one for a fixed graph).


class _Graph(NamedTuple):
  slots: np.ndarray  # [M, M] int: how many of i's neighbour slots point at j.
  perms: tuple[Perm, ...] | None  # Full-permutation decomposition, or None.


def _from_maps(num_workers: int, maps: Sequence[np.ndarray]) -> _Graph:
  """A graph whose worker i sends to maps[k][i] (one slot per map)."""
  slots = np.zeros((num_workers, num_workers), dtype=np.int64)
  perms = {}  # Coinciding maps (+4 and -4 at M=8) are one ppermute.
  for f in maps:
    np.add.at(slots, (np.arange(num_workers), f), 1)
    perms.setdefault(tuple(int(x) for x in f), None)
  return _Graph(slots, tuple(tuple(enumerate(p)) for p in perms))


def _circulant(num_workers: int, offsets: Sequence[int]) -> _Graph:
  i = np.arange(num_workers)
  return _from_maps(num_workers, [(i + s) % num_workers for s in offsets])


def _need_workers(name: str, num_workers: int, minimum: int) -> None:
  if num_workers < minimum:
    raise ConfigError(f'Topology {name!r} needs num_workers >= {minimum}; got '
                      f'{num_workers} (use "complete" for a single worker).')


def _complete(num_workers: int, **_) -> tuple[_Graph, ...]:
  return (_circulant(num_workers, range(1, num_workers)),)


def _ring(num_workers: int, **_) -> tuple[_Graph, ...]:
  _need_workers('ring', num_workers, 2)
  return (_circulant(num_workers, (1, -1)),)


def _exponential(num_workers: int, **_) -> tuple[_Graph, ...]:
  _need_workers('exponential', num_workers, 2)
  # i +- 2^k for 2^k < M; coinciding neighbours (M=8: +4, -4) are one edge of
  # W but two slots of the A2CiD2 rates, as in its code.
  powers = [1 << k for k in range(num_workers.bit_length()) if
            (1 << k) < num_workers]
  return (_circulant(num_workers, [s for p in powers for s in (p, -p)]),)


def torus_shape(num_workers: int) -> tuple[int, int]:
  """The most square r x c = M with 2 <= r <= c (a 2-D torus's shape).

  Raises:
    ConfigError: if M has no such factorization (M < 4 or M prime).
  """
  r = next((r for r in range(math.isqrt(max(num_workers, 0)), 1, -1)
            if num_workers % r == 0), None)
  if r is None:
    raise ConfigError(
        f'Topology "torus" needs num_workers = r x c with r, c >= 2; got '
        f'{num_workers}, which has no such factorization (use e.g. 4, 6, 8, 9, '
        '12, 16, or "ring").')
  return r, num_workers // r


def _torus(num_workers: int, **_) -> tuple[_Graph, ...]:
  rows, cols = torus_shape(num_workers)
  a, b = np.divmod(np.arange(num_workers), cols)
  # A side of length 2 makes its +1 and -1 neighbours coincide: degree 3 (2
  # when 2 x 2, a 4-cycle), with that neighbour counted as two slots.
  maps = [((a + s) % rows) * cols + b for s in (1, -1)]
  maps += [a * cols + (b + s) % cols for s in (1, -1)]
  return (_from_maps(num_workers, maps),)


def _hypercube(num_workers: int, **_) -> tuple[_Graph, ...]:
  if num_workers < 2 or num_workers & (num_workers - 1):
    raise ConfigError(f'Topology "hypercube" needs num_workers a power of two '
                      f'>= 2; got {num_workers}.')
  i = np.arange(num_workers)
  return (_from_maps(num_workers, [i ^ (1 << k) for k in
                                   range(num_workers.bit_length() - 1)]),)


def _erdos_renyi(num_workers: int, *, seed: int, p: float,
                 **_) -> tuple[_Graph, ...]:
  _need_workers('erdos_renyi', num_workers, 2)
  if not 0 < p <= 1:
    raise ConfigError(f'Topology "erdos_renyi" needs 0 < p <= 1; got p={p}.')
  rng = np.random.default_rng(seed)
  upper = np.triu(rng.random((num_workers, num_workers)) < p, 1)
  adjacency = upper | upper.T
  if not _is_connected(adjacency):
    hint = min(1.0, 2 * math.log(num_workers) / num_workers)
    raise ConfigError(
        f'Topology "erdos_renyi" with num_workers={num_workers}, p={p}, '
        f'seed={seed} is disconnected; use a larger p (p >= {hint:.2f} is '
        'connected with high probability) or another seed.')
  return (_Graph(adjacency.astype(np.int64), None),)


def one_factorization(num_workers: int) -> list[list[tuple[int, int]]]:
  """Circle method: M - 1 perfect matchings; each pair is in one (M even)."""
  n = num_workers - 1
  rounds = []
  for r in range(n):
    pairs = [(r, n)]
    pairs += [((r + k) % n, (r - k) % n) for k in range(1, num_workers // 2)]
    rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs))
  return rounds


def _matching(num_workers: int, **_) -> tuple[_Graph, ...]:
  if num_workers < 2 or num_workers % 2:
    raise ConfigError(f'Topology "matching" needs an even num_workers >= 2 '
                      f'(a perfect matching pairs every worker); got '
                      f'{num_workers}.')
  members = []
  for pairs in one_factorization(num_workers):
    perm = _matching_perm(num_workers, pairs)
    members.append(_from_maps(num_workers, [np.array([d for _, d in perm])]))
  return tuple(members)


_BUILDERS: dict[str, Callable[..., tuple[_Graph, ...]]] = {
    'complete': _complete,
    'ring': _ring,
    'torus': _torus,
    'exponential': _exponential,
    'hypercube': _hypercube,
    'erdos_renyi': _erdos_renyi,
    'matching': _matching,
}
_RANDOM = frozenset({'matching'})

TOPOLOGIES = tuple(_BUILDERS)
WEIGHTINGS = tuple(_WEIGHTINGS)


def make_topology(name: str, num_workers: int, *, weights: str = 'metropolis',
                  seed: int = 0, p: float = 0.3) -> Topology:
  """Builds a named topology with its mixing matrix and gossip plans.

  Args:
    name: "complete" (every pair; W = 11^T/M), "ring" (i +- 1), "torus" (2-D,
      the most square r x c = M, see `torus_shape`), "exponential" (i +- 2^k
      for 2^k < M, coinciding neighbours merged), "hypercube" (M a power of
      two), "erdos_renyi" (G(M, p) drawn with `seed`; must be connected) or
      "matching" (a random perfect matching per round, drawn from the circle
      method's 1-factorization of K_M; M even; each pair averages,
      W = I - 1/2 sum (e_i - e_j)(e_i - e_j)^T).
    num_workers: M; 1 is allowed for "complete" only.
    weights: "metropolis" (W_ij = 1 / (1 + max(d_i, d_j)) on edges) or
      "uniform" (1 / (d_max + 1) on edges); the rest of each row goes on the
      diagonal. Both give 1/(d + 1) on a d-regular graph, 1/2 on a matching.
    seed: seed of the "erdos_renyi" graph.
    p: edge probability of "erdos_renyi".

  Returns:
    A validated `Topology` (symmetric, doubly stochastic, connected).

  Raises:
    ConfigError: for an unknown name or weighting, or a size the graph
      cannot have.

  References:
    Metropolis weights: Xiao & Boyd 2004; exponential graph: Ying et al.,
    arXiv 2110.13363; pairwise matching: AD-PSGD, arXiv 1710.06952.
  """
  if name not in _BUILDERS:
    raise ConfigError(f'Unknown topology name {name!r}; allowed: '
                      f'{", ".join(TOPOLOGIES)}.')
  if weights not in _WEIGHTINGS:
    raise ConfigError(f'Unknown topology weights {weights!r}; allowed: '
                      f'{", ".join(WEIGHTINGS)}.')
  if isinstance(num_workers, bool) or not isinstance(num_workers,
                                                     (int, np.integer)):
    raise ConfigError(f'num_workers must be an int; got {num_workers!r}.')
  num_workers = int(num_workers)
  if num_workers < 1:
    raise ConfigError(f'num_workers must be >= 1; got {num_workers}.')
  members = _BUILDERS[name](num_workers, seed=seed, p=p)
  plans = []
  for g in members:
    w = validate_mixing_matrix(_WEIGHTINGS[weights](g.slots > 0),
                               require_connected=False)
    plans.append(_make_plan(w, g.perms))
  expected = np.mean([pl.to_dense() for pl in plans], axis=0)
  validate_mixing_matrix(expected)
  slots = sum(g.slots for g in members)
  return Topology(name=name, num_workers=num_workers,
                  weights=_frozen(expected), plans=tuple(plans),
                  adjacency=_frozen(slots > 0),
                  rates=_frozen(_a2cid2_rates(slots)), is_random=name in _RANDOM)


def topology_from_matrix(weights: np.ndarray, name: str = 'custom') -> Topology:
  """Wraps a user-supplied mixing matrix (validated) as a fixed `Topology`.

  Its plan is an edge colouring of W's support into <= d_max + 1 matchings;
  its rates treat every neighbour as one slot.
  """
  w = validate_mixing_matrix(weights)
  m = w.shape[0]
  adjacency = (w > 0) & ~np.eye(m, dtype=bool)
  plan = _make_plan(w, None)
  return Topology(name=name, num_workers=m, weights=_frozen(plan.to_dense()),
                  plans=(plan,), adjacency=_frozen(adjacency),
                  rates=_frozen(_a2cid2_rates(adjacency.astype(np.int64))), is_random=False)


# ---------------------------------------------------------------------------
# What a gossip step runs: a spec resolved for M workers, pairwise families.


def check_spec(spec, weights: str = 'metropolis') -> None:
  """Fails early on an unknown topology name or weighting (an algorithm's config)."""
  if isinstance(spec, str) and spec not in _BUILDERS:
    raise ConfigError(f'algorithm.topology must be one of {", ".join(TOPOLOGIES)}, '
                      f'got {spec!r}.')
  if weights not in _WEIGHTINGS:
    raise ConfigError(f'algorithm.weights must be one of {", ".join(WEIGHTINGS)}, '
                      f'got {weights!r}.')


def is_all_reduce(topo: Topology) -> bool:
  """Whether `topo` is the complete graph with uniform weights (W = 11^T / M)."""
  return not topo.is_random and bool(
      np.allclose(topo.weights, 1.0 / topo.num_workers, atol=1e-12))


def _cycle_matchings(perm: Perm) -> list[list[tuple[int, int]]]:
  """Splits the cycles of a permutation into at most 3 matchings (2 if all even)."""
  dst = dict(perm)
  seen, out = set(), [[], [], []]
  for start in sorted(dst):
    if start in seen or dst[start] == start:
      continue
    cycle, v = [], start
    while v not in seen:
      seen.add(v)
      cycle.append(v)
      v = dst[v]
    length = len(cycle)
    if length == 2:
      out[0].append(tuple(sorted(cycle)))
      continue
    for k in range(length):
      edge = tuple(sorted((cycle[k], cycle[(k + 1) % length])))
      out[2 if (length % 2 and k == length - 1) else k % 2].append(edge)
  return [m for m in out if m]


@functools.lru_cache(maxsize=64)
def pairwise_family(topo: Topology) -> Topology:
  """The random family 'one matching of `topo`'s graph per round, pairs average'.

  A random-matching topology is returned as is. Otherwise the graph's edges are
  split into matchings (each permutation of the plan into its cycles' alternate
  edges, duplicates dropped: a ring of even M gives 2 perfect matchings, the
  exponential graph of M = 2^k its degree), one of which is drawn per round, so
  every worker makes about one exchange per round, as in AD-PSGD and A2CiD2. The
  family's `rates` are the probabilities that an edge is used in a round, so its
  chi1, chi2 are the A2CiD2 constants of this simulation (at one exchange per
  gradient step they equal the A2CiD2 paper's for rings and the complete graph).

  Args:
    topo: a resolved topology.

  Returns:
    A random-family `Topology` whose members are matchings with weight 1/2.
  """
  m = topo.num_workers
  if m == 1 or topo.is_random and all(
      p.num_perms == 1 and np.all(p.recv_weight[p.recv_weight > 0] == 0.5)
      for p in topo.plans):
    return topo
  covered, plans = set(), []
  for perm in (perm for plan in topo.plans for perm in plan.perms):
    for matching in _cycle_matchings(perm):
      fresh = [e for e in matching if e not in covered]
      covered.update(fresh)
      if fresh:
        w = np.eye(m)
        for a, b in fresh:
          w[a, a] = w[b, b] = w[a, b] = w[b, a] = 0.5
        plans.append(_make_plan(w, [_matching_perm(m, fresh)]))
  weights = np.mean([p.to_dense() for p in plans], axis=0)
  rates = 2.0 * (weights - np.diag(np.diag(weights)))
  return Topology(name=f'{topo.name}/pairwise', num_workers=m, weights=_frozen(weights),
                  plans=tuple(plans), adjacency=_frozen(rates > 0), rates=_frozen(rates),
                  is_random=True)


@functools.lru_cache(maxsize=64)
def resolve_topology(spec: str | Topology, num_workers: int, *,
                     weights: str = 'metropolis', seed: int = 0,
                     pairwise: bool = False) -> Topology:
  """The `Topology` a gossip step uses for `num_workers` workers (cached).

  Args:
    spec: a topology name (see `TOPOLOGIES`) or a built `Topology`.
    num_workers: M, the static size of the worker axis.
    weights: 'metropolis' or 'uniform' (for a name).
    seed: the 'erdos_renyi' graph's seed.
    pairwise: one random matching of the graph per round (`pairwise_family`).

  Returns:
    A Topology of `num_workers` workers.

  Raises:
    ConfigError: an unknown name or weighting, or a graph that cannot have M workers.
  """
  if isinstance(spec, Topology):
    if spec.num_workers != num_workers:
      raise ConfigError(f'algorithm.topology has {spec.num_workers} workers but the run '
                        f'has num_workers={num_workers}; build it for {num_workers}.')
    topo = spec
  elif isinstance(spec, str):
    try:
      topo = make_topology(spec, num_workers, weights=weights, seed=seed)
    except ConfigError as e:
      raise ConfigError(f'algorithm.topology={spec!r} does not fit num_workers='
                        f'{num_workers}: {e}') from None
  else:
    raise ConfigError(f'algorithm.topology must be a name ({", ".join(TOPOLOGIES)}) '
                      f'or a loco.comm.topology.Topology, got {spec!r}.')
  return pairwise_family(topo) if pairwise else topo
