"""The statistics behind every loco report and the claims page: tests, CIs and verdicts.

Which tool to use when:

* `paired_t` — two methods run on the same seeds, where a seed fixes both the init and
  the data order (loco's `train.py` keys both on the seed). The per-seed differences
  d_i = a_i - ratio * b_i cancel what the seed shares, df = n - 1. Report it first.
* `welch_t` — the runs are not paired (different seeds, different counts). Welch-
  Satterthwaite df, which at n = 3 per side is 2-4: the 95% critical t is 2.8-4.3,
  not the normal 1.96 ("2 SE" at n = 3 is not a 95% test).
* `clustered_mean` / `paired_clustered` — a mean over eval windows. Windows cut from
  the same document move together, so the iid SE understates the uncertainty about
  held-out text; the SE is clustered by document (CR1).
* `holm` — a claim made of several comparisons ("all 12 pairs pass"). Without a
  multiplicity correction, some sub-test fails by chance far more often than 5%.
* `verdict` — the words from a confidence interval; a relative margin ("a within 2% of
  b") goes into the difference through `ratio`, so the bound is usually 0.

Only numpy and scipy: a report or a notebook can import this without jax.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
import dataclasses
import math
from typing import Any, NamedTuple

import numpy as np
from scipy import optimize
from scipy import stats as _st

_CLAIMS = ('less', 'greater')


def t_critical(df: float, level: float = 0.95) -> float:
  """The two-sided critical value of Student's t: P(abs(T_df) <= c) = level.

  Args:
    df: degrees of freedom, > 0; may be fractional (Welch) or inf (the normal).
    level: the confidence level, in (0, 1).

  Returns:
    c, e.g. 4.303 at df = 2 and 1.960 at df = inf (level 0.95).
  """
  if not df > 0:
    raise ValueError(f'degrees of freedom must be > 0, got {df}')
  _check_level(level)
  return float(_st.t.ppf(0.5 + level / 2, df))


@dataclasses.dataclass(frozen=True)
class TTest:
  """One t test of a difference `a - ratio * b`; `str()` gives one readable line.

  `p_less` is the one-sided p for H1: true difference < 0, `p_greater` for > 0. `n` is
  the number of pairs (paired) or (n_a, n_b) (Welch); `differences` holds the per-seed
  differences of a paired test and is empty for Welch.
  """
  name: str
  estimate: float
  se: float
  df: float
  t: float
  p: float
  p_less: float
  p_greater: float
  ci: tuple[float, float]
  level: float
  n: int | tuple[int, int]
  differences: tuple[float, ...] = ()
  ratio: float = 1.0

  def describe(self) -> str:
    """E.g. `+0.0412 [+0.0101, +0.0723] 95% CI, paired t(2) = 5.71, p = 0.029`."""
    low, high = self.ci
    what = '' if self.ratio == 1.0 else f'a - {self.ratio:g} b: '
    p = f'{self.p:.3f}' if not self.p < 0.001 else f'{self.p:.1e}'
    return (f'{what}{self.estimate:+.4f} [{low:+.4f}, {high:+.4f}] '
            f'{self.level * 100:g}% CI, {self.name}({self.df:.3g}) = {self.t:.2f}, '
            f'p = {p}')

  __str__ = describe


def paired_t(a: Sequence[float], b: Sequence[float], *, ratio: float = 1.0,
             level: float = 0.95) -> TTest:
  """The paired t test of d_i = a_i - ratio * b_i, where a_i and b_i share seed i.

  Pairing is valid when a seed fixes the init and the data order of both methods;
  then the seed's luck cancels in d_i. estimate = mean(d), se = sd(d) / sqrt(n) with
  the n - 1 sample sd, df = n - 1. With ratio = 1.02, "a is within 2% of b" is the
  claim that the difference is < 0. If every d_i is equal, se = 0: see `welch_t`.

  Args:
    a: one value per seed (e.g. final eval losses of method A).
    b: the same seeds' values of method B, in the same order.
    ratio: the multiplier of b; 1 + margin for a relative margin.
    level: the level of `ci`.

  Returns:
    A `TTest` named 'paired t'.
  """
  a, b = _values(a, 'a'), _values(b, 'b')
  if a.size != b.size:
    raise ValueError(f'a paired test needs one b per a, got {a.size} a and {b.size} b')
  if a.size < 2:
    raise ValueError(f'a paired test needs at least 2 pairs, got {a.size}')
  d = a - ratio * b
  n = d.size
  se = float(np.std(d, ddof=1)) / math.sqrt(n)
  return _ttest('paired t', float(np.mean(d)), se, n - 1, level, n,
                tuple(float(x) for x in d), ratio)


def welch_t(a: Sequence[float], b: Sequence[float], *, ratio: float = 1.0,
            level: float = 0.95) -> TTest:
  """Welch's unequal-variance t test of mean(a) - ratio * mean(b).

  var = v_a + v_b with v_a = s_a^2 / n_a and v_b = ratio^2 s_b^2 / n_b (sample
  variances, ddof 1); Welch-Satterthwaite
  df = (v_a + v_b)^2 / (v_a^2 / (n_a - 1) + v_b^2 / (n_b - 1)).

  Zero variance never raises: if one side is constant, df is the other side's n - 1.
  If se = 0 (both constant), the CI is the point (estimate, estimate), t is +-inf
  with p = 0 when estimate != 0 (one-sided p 0 or 1), and t and every p are nan when
  estimate = 0 (no evidence either way); df, undefined, is nan (printed as such).

  Args:
    a: values of method A (>= 2).
    b: values of method B (>= 2), not paired with a.
    ratio: the multiplier of b; 1 + margin for a relative margin.
    level: the level of `ci`.

  Returns:
    A `TTest` named 'Welch t', with n = (n_a, n_b).
  """
  a, b = _values(a, 'a'), _values(b, 'b')
  if a.size < 2 or b.size < 2:
    raise ValueError(f'a Welch test needs at least 2 values on each side, '
                     f'got {a.size} and {b.size}')
  va = float(np.var(a, ddof=1)) / a.size
  vb = ratio**2 * float(np.var(b, ddof=1)) / b.size
  denom = va**2 / (a.size - 1) + vb**2 / (b.size - 1)
  df = (va + vb)**2 / denom if denom > 0 else math.nan
  estimate = float(np.mean(a)) - ratio * float(np.mean(b))
  return _ttest('Welch t', estimate, math.sqrt(va + vb), df, level,
                (a.size, b.size), (), ratio)


def _ttest(name, estimate, se, df, level, n, differences, ratio) -> TTest:
  _check_level(level)
  if se > 0:
    t = estimate / se
    p_less, p_greater = float(_st.t.cdf(t, df)), float(_st.t.sf(t, df))
    p = float(min(1.0, 2 * _st.t.sf(abs(t), df)))
    half = t_critical(df, level) * se
    ci = (estimate - half, estimate + half)
  else:  # no spread: the data pin the difference (see welch_t)
    t = math.copysign(math.inf, estimate) if estimate != 0 else math.nan
    p = 0.0 if estimate != 0 else math.nan
    # p_less = P(T <= t) = cdf(t): 0 at t = -inf, 1 at t = +inf.
    p_less = float(estimate > 0) if estimate != 0 else math.nan
    p_greater = float(estimate < 0) if estimate != 0 else math.nan
    ci = (estimate, estimate)
  return TTest(name, estimate, se, float(df), t, p, p_less, p_greater,
               (float(ci[0]), float(ci[1])), level, n, differences, ratio)


class MeanCI(NamedTuple):
  """A mean, its standard error and its t confidence interval."""
  mean: float
  se: float
  ci: tuple[float, float]
  n: int


def mean_ci(x: Sequence[float], level: float = 0.95) -> MeanCI:
  """The mean of x with se = sd / sqrt(n) (ddof 1) and a t CI with n - 1 df."""
  x = _values(x, 'x')
  if x.size < 2:
    raise ValueError(f'a confidence interval needs at least 2 values, got {x.size}')
  mean, se = float(np.mean(x)), float(np.std(x, ddof=1)) / math.sqrt(x.size)
  half = t_critical(x.size - 1, level) * se
  return MeanCI(mean, se, (mean - half, mean + half), x.size)


def clustered_mean(values: Sequence[float],
                   clusters: Sequence[Hashable]) -> tuple[float, float, int]:
  """The mean of per-window values and its document-clustered (CR1) standard error.

  With n windows in G clusters (documents) and residuals r_i = x_i - mean:

      se^2 = G / (G - 1) * sum_g (sum_{i in g} r_i)^2 / n^2

  Windows of one document that move together add up inside the square, so the SE
  grows; with every window its own cluster (G = n) this is exactly the iid SE
  s / sqrt(n) with the n - 1 sample variance, since n / (n - 1) * sum r_i^2 / n^2 =
  s^2 / n. With G clusters the SE has about G - 1 degrees of freedom, not n - 1.

  Args:
    values: one number per window (e.g. a mean token loss).
    clusters: one label per window (e.g. the document id); any hashable values.

  Returns:
    (mean, se, number of clusters G).
  """
  x = _values(values, 'values')
  labels = list(clusters)
  if len(labels) != x.size:
    raise ValueError(f'need one cluster label per value, got {len(labels)} labels '
                     f'for {x.size} values')
  index: dict[Hashable, int] = {}
  ids = np.array([index.setdefault(c, len(index)) for c in labels], dtype=np.int64)
  g = len(index)
  if g < 2:
    raise ValueError(f'a clustered standard error needs at least 2 clusters, got {g}')
  mean = float(np.mean(x))
  sums = np.bincount(ids, weights=x - mean, minlength=g)
  se = math.sqrt(g / (g - 1) * float(np.sum(sums**2)) / x.size**2)
  return mean, se, g


def clustered_se(values: Sequence[float], clusters: Sequence[Hashable]) -> float:
  """The CR1 cluster-robust SE of the mean of `values`; see `clustered_mean`."""
  return clustered_mean(values, clusters)[1]


def paired_clustered(a: Sequence[float], b: Sequence[float],
                     clusters: Sequence[Hashable], *,
                     ratio: float = 1.0) -> tuple[float, float, int]:
  """Mean of a_i - ratio * b_i over the same windows, with its clustered SE.

  a and b are two models' per-window losses on identical windows, so the difference
  cancels how hard each window is; the rest still clusters by document.

  Returns:
    (mean difference, clustered se, number of clusters), as `clustered_mean`.
  """
  a, b = _values(a, 'a'), _values(b, 'b')
  if a.size != b.size:
    raise ValueError(f'paired windows need one b per a, got {a.size} a and {b.size} b')
  return clustered_mean(a - ratio * b, clusters)


class Holm(NamedTuple):
  """Holm-adjusted p-values and reject flags, both in the input order."""
  adjusted: np.ndarray
  reject: np.ndarray


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> Holm:
  """The Holm-Bonferroni step-down correction for a claim made of m comparisons.

  With p sorted ascending, p_(1) <= ... <= p_(m), the adjusted value is
  min(1, max_{j <= i} (m - j + 1) p_(j)): the running max makes it monotone, so the
  step-down stops at the first comparison that fails. Controls the family-wise error
  rate at alpha under any dependence between the comparisons.

  Args:
    pvalues: one p-value per comparison, each in [0, 1].
    alpha: the family-wise error rate.

  Returns:
    `Holm(adjusted, reject)`, with reject = adjusted <= alpha.
  """
  p = np.asarray(pvalues, dtype=np.float64).reshape(-1)
  if not np.all((p >= 0) & (p <= 1)):  # also catches nan
    raise ValueError(f'p-values must lie in [0, 1], got {p.tolist()}')
  m = p.size
  order = np.argsort(p, kind='stable')
  stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
  adjusted = np.empty(m)
  adjusted[order] = np.minimum(stepped, 1.0)
  return Holm(adjusted, adjusted <= alpha)


def time_to_target(xs: Sequence[float], ys: Sequence[float],
                   target: float) -> float | None:
  """The first x at which a learning curve reaches ys <= target, or None if never.

  Between the last point above the target and the first at or below it, x is
  interpolated linearly; if the first point already meets the target it is returned.
  Non-finite ys (a failed eval) are skipped, so the interpolation spans the gap.

  Args:
    xs: strictly increasing positions (e.g. simulated seconds or steps).
    ys: the curve at xs (e.g. eval losses).
    target: the level to reach.
  """
  x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
  if x.shape != y.shape or x.ndim != 1:
    raise ValueError(f'xs and ys must be two lists of equal length, got {x.size} xs '
                     f'and {y.size} ys')
  if not np.all(np.diff(x) > 0):   # also refuses a nan x
    raise ValueError(f'xs must be strictly increasing, got {x.tolist()}')
  keep = np.isfinite(y)
  x, y = x[keep], y[keep]
  hit = np.nonzero(y <= target)[0]
  if hit.size == 0:
    return None
  i = int(hit[0])
  if i == 0:
    return float(x[0])
  x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]   # y0 > target >= y1
  return float(x0 + (y0 - target) / (y0 - y1) * (x1 - x0))


def verdict(ci: tuple[float, float], *, claim: str = 'less', bound: float = 0.0) -> str:
  """The verdict words for a claim about a difference, from its confidence interval.

  For claim 'less' (true difference < bound): 'reproduced' if the CI lies below the
  bound, 'not reproduced' if it lies above it, else 'inconclusive'; 'greater' mirrors
  it. A CI touching the bound, or with a nan end, is 'inconclusive'.
  """
  if claim not in _CLAIMS:
    raise ValueError(f"claim must be one of {_CLAIMS}, got {claim!r}")
  low, high = ci
  below, above = high < bound, low > bound
  if claim == 'greater':
    below, above = above, below
  return 'reproduced' if below else 'not reproduced' if above else 'inconclusive'


def seed_groups(items: Iterable[Any],
                key: Callable[[Any], Hashable]) -> list[tuple[Hashable, list[Any]]]:
  """Groups items by key(item) in first-seen order: the runs that differ only in seed."""
  groups: dict[Hashable, list[Any]] = {}
  for item in items:
    groups.setdefault(key(item), []).append(item)
  return list(groups.items())


def minimum_detectable(sd: float, n: int, level: float = 0.95,
                       power: float = 0.8) -> float:
  """The smallest true mean difference a two-sided paired t test detects with `power`.

  Exact: solves P(abs(T') > c) = power for delta, where c = t_critical(n - 1, level) and
  T' is noncentral t with n - 1 df and noncentrality delta sqrt(n) / sd. The usual
  approximation (c + t_{power, n-1}) sd / sqrt(n) is close for n >= 10 but optimistic
  at n = 3 (its power there is 0.77, not 0.8).

  Args:
    sd: the sd of the per-seed differences (e.g. from a pilot).
    n: the number of seeds (pairs), >= 2.
    level: the test's confidence level.
    power: the wanted probability of rejecting, in (0, 1).
  """
  if n < 2 or not sd > 0:
    raise ValueError(f'need n >= 2 pairs and sd > 0, got n = {n}, sd = {sd}')
  _check_level(power)
  df, c = n - 1, t_critical(n - 1, level)
  if power <= 1 - level:
    raise ValueError(f'power must exceed the false-positive rate {1 - level:g}')

  def gap(delta):
    nc = delta * math.sqrt(n) / sd
    # scipy's nct.cdf can return nan far in the tail, where the term is ~0 anyway.
    wrong_side = float(np.nan_to_num(_st.nct.cdf(-c, df, nc), nan=0.0))
    return float(_st.nct.sf(c, df, nc)) + wrong_side - power

  high = 2 * (c + _st.t.ppf(power, df)) * sd / math.sqrt(n)   # twice the approximation
  while gap(high) < 0:
    high *= 2
  # gap(0) = (1 - level) - power < 0: the root lies in (0, high].
  return float(optimize.brentq(gap, 0.0, high, xtol=1e-12 * sd))


def _values(x, name: str) -> np.ndarray:
  v = np.asarray(x, dtype=np.float64).reshape(-1)
  if not np.all(np.isfinite(v)):
    raise ValueError(f'{name} holds a non-finite value (a diverged run?): {v.tolist()}')
  return v


def _check_level(level: float) -> None:
  if not 0 < level < 1:
    raise ValueError(f'a level or power must lie in (0, 1), got {level}')
