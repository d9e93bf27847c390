"""loco.stats against hand computations (written out below), with scipy as a cross-check."""

import math

import numpy as np
import pytest
from scipy import stats as st

from loco import stats


# --- t_critical -------------------------------------------------------------------------

def test_t_critical_by_hand():
  # Student's t with 2 df has the closed-form cdf F(t) = 1/2 + t / (2 sqrt(2 + t^2)).
  # Two-sided 95%: t / sqrt(2 + t^2) = 0.95 -> t^2 = 0.9025 * 2 / 0.0975 = 18.5128,
  # t = 4.3027.
  assert stats.t_critical(2) == pytest.approx(4.302653, abs=1e-6)
  assert round(stats.t_critical(2), 3) == 4.303
  # 90%: t / sqrt(2 + t^2) = 0.9 -> t^2 = 0.81 * 2 / 0.19 = 8.5263, t = 2.9200.
  assert stats.t_critical(2, level=0.90) == pytest.approx(2.919986, abs=1e-6)
  # Large df -> the normal 1.96; fractional (Welch) df lies between its neighbours.
  assert stats.t_critical(1e6) == pytest.approx(1.95996, abs=1e-4)
  assert stats.t_critical(math.inf) == pytest.approx(1.959964, abs=1e-6)
  assert stats.t_critical(3) < stats.t_critical(2.5) < stats.t_critical(2)


def test_two_standard_errors_at_three_seeds_is_not_a_95_percent_test():
  # The old rule "|d| > 2 SE" with df = 2: P(|T| > 2) = 1 - 2 / sqrt(2 + 4) = 0.1835,
  # an 82% test, not 95%. The review's claim 1 (t = 2.80, Welch df 2.5) has p = 0.084.
  assert 2 * st.t.sf(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6))
  assert 2 * st.t.sf(2.80, 2.5) == pytest.approx(0.0836, abs=1e-4)
  assert stats.t_critical(2.5) > 2.80


@pytest.mark.parametrize('df, level', [(0, 0.95), (-1, 0.95), (math.nan, 0.95),
                                       (2, 0.0), (2, 1.0), (2, 95)])
def test_t_critical_bad_input(df, level):
  with pytest.raises(ValueError, match='must'):
    stats.t_critical(df, level)


# --- paired t ---------------------------------------------------------------------------

# Three seeds; a_i and b_i share seed i.
A = [2.00, 2.10, 2.30]
B = [1.90, 2.05, 2.15]


def test_paired_t_by_hand():
  # d = a - b = [0.10, 0.05, 0.15]; mean 0.10; deviations 0, -0.05, +0.05;
  # sum of squares 0.005; s^2 = 0.005 / 2 = 0.0025, s = 0.05;
  # se = 0.05 / sqrt(3) = 0.0288675; t = 0.10 / 0.0288675 = 2 sqrt(3) = 3.4641; df 2.
  # With 2 df, p = 1 - t / sqrt(2 + t^2) = 1 - sqrt(12 / 14) = 0.0741799;
  # CI = 0.10 -+ 4.302653 * 0.0288675 = 0.10 -+ 0.124207.
  r = stats.paired_t(A, B)
  assert r.name == 'paired t'
  assert r.n == 3
  assert r.differences == pytest.approx((0.10, 0.05, 0.15))
  assert r.estimate == pytest.approx(0.10)
  assert r.se == pytest.approx(0.0288675, abs=1e-7)
  assert r.df == 2
  assert r.t == pytest.approx(3.464102, abs=1e-5)
  assert r.p == pytest.approx(0.0741799, abs=1e-6)
  assert r.p_greater == pytest.approx(0.0741799 / 2, abs=1e-6)
  assert r.p_less == pytest.approx(1 - 0.0741799 / 2, abs=1e-6)
  assert r.ci == pytest.approx((-0.024207, 0.224207), abs=1e-6)
  assert r.level == 0.95
  # scipy agrees, two- and one-sided.
  assert r.p == pytest.approx(st.ttest_rel(A, B).pvalue)
  assert r.p_less == pytest.approx(st.ttest_rel(A, B, alternative='less').pvalue)
  assert r.p_greater == pytest.approx(st.ttest_rel(A, B, alternative='greater').pvalue)


def test_paired_t_describe_is_one_line():
  assert str(stats.paired_t(A, B)) == (
      '+0.1000 [-0.0242, +0.2242] 95% CI, paired t(2) = 3.46, p = 0.074')
  assert stats.paired_t(A, B).describe() == str(stats.paired_t(A, B))


def test_pairing_removes_the_shared_seed_effect():
  # Seed 1 is bad for both methods by the same amount: the paired test sees a constant
  # +0.01 advantage with little spread, Welch sees the seed spread on each side.
  b = np.array([1.90, 2.00, 1.95])
  a = b + np.array([0.010, 0.012, 0.011])
  assert stats.paired_t(a, b).p < 0.01
  assert stats.welch_t(a, b).p > 0.5


def test_paired_t_matches_scipy_on_random_data():
  rng = np.random.default_rng(0)
  for n in (2, 3, 5, 12):
    a, b = rng.normal(2, 0.1, n), rng.normal(2, 0.1, n)
    for ratio in (1.0, 1.02, 0.5):
      r = stats.paired_t(a, b, ratio=ratio)
      ref = st.ttest_rel(a, ratio * b)
      assert r.t == pytest.approx(ref.statistic)
      assert r.p == pytest.approx(ref.pvalue)
      ci = ref.confidence_interval(0.9)
      assert stats.paired_t(a, b, ratio=ratio, level=0.9).ci == pytest.approx(
          (ci.low, ci.high))


def test_ratio_margin_changes_the_verdict():
  # Claim: "a is within 2% of b", i.e. a < 1.02 b, i.e. a - 1.02 b < 0.
  b = [2.0, 2.1, 2.2]
  a = [2.010, 2.115, 2.211]
  # Without the margin, d = a - b = [0.010, 0.015, 0.011]: mean 0.012, deviations
  # -0.002, +0.003, -0.001, s^2 = 14e-6 / 2 = 7e-6, se = sqrt(7e-6 / 3) = 0.0015275,
  # CI = 0.012 -+ 4.302653 * 0.0015275 = [0.005428, 0.018572]: a is above b.
  plain = stats.paired_t(a, b)
  assert plain.ci == pytest.approx((0.005428, 0.018572), abs=1e-6)
  assert stats.verdict(plain.ci, claim='less') == 'not reproduced'
  # With it, d = a - 1.02 b = [2.010 - 2.040, 2.115 - 2.142, 2.211 - 2.244]
  # = [-0.030, -0.027, -0.033]: mean -0.030, deviations 0, +0.003, -0.003,
  # s^2 = 18e-6 / 2 = 9e-6, s = 0.003, se = 0.0017321,
  # CI = -0.030 -+ 4.302653 * 0.0017321 = [-0.037453, -0.022547]: below 0.
  margin = stats.paired_t(a, b, ratio=1.02)
  assert margin.estimate == pytest.approx(-0.030)
  assert margin.se == pytest.approx(0.0017321, abs=1e-7)
  assert margin.ci == pytest.approx((-0.037453, -0.022547), abs=1e-6)
  assert stats.verdict(margin.ci, claim='less') == 'reproduced'
  assert str(margin).startswith('a - 1.02 b: -0.0300 [-0.0375, -0.0225] 95% CI')


@pytest.mark.parametrize('a, b, match', [
    ([2.0], [1.9], 'at least 2 pairs'),
    ([], [], 'at least 2 pairs'),
    ([2.0, 2.1, 2.2], [1.9, 2.0], 'one b per a'),
    ([2.0, math.nan], [1.9, 2.0], 'non-finite'),
])
def test_paired_t_bad_input(a, b, match):
  with pytest.raises(ValueError, match=match):
    stats.paired_t(a, b)


def test_paired_t_zero_spread_does_not_crash():
  # Every d_i = 0.5 exactly: t = +inf, p_less = P(T <= inf) = 1, p_greater = 0.
  r = stats.paired_t([2.5, 3.5, 4.5], [2.0, 3.0, 4.0])
  assert (r.se, r.df, r.t, r.p, r.p_less, r.p_greater) == (0.0, 2.0, math.inf, 0.0,
                                                          1.0, 0.0)
  assert r.ci == (0.5, 0.5)


# --- Welch t ----------------------------------------------------------------------------

WA = [4.0, 5.0, 6.0]
WB = [1.0, 3.0, 5.0]


def test_welch_t_by_hand():
  # mean a = 5, s_a^2 = (1 + 0 + 1) / 2 = 1; mean b = 3, s_b^2 = (4 + 0 + 4) / 2 = 4.
  # v_a = 1/3, v_b = 4/3, var = 5/3, se = sqrt(5/3) = 1.290994; t = 2 / se = 1.549193.
  # df = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2) = (25/9) / (17/18) = 50/17 = 2.941176.
  r = stats.welch_t(WA, WB)
  assert r.name == 'Welch t'
  assert r.n == (3, 3)
  assert r.differences == ()
  assert r.estimate == pytest.approx(2.0)
  assert r.se == pytest.approx(1.290994, abs=1e-6)
  assert r.t == pytest.approx(1.549193, abs=1e-6)
  assert r.df == pytest.approx(50 / 17)
  half = stats.t_critical(50 / 17) * math.sqrt(5 / 3)
  assert r.ci == pytest.approx((2 - half, 2 + half))
  ref = st.ttest_ind(WA, WB, equal_var=False)
  assert r.t == pytest.approx(ref.statistic)
  assert r.p == pytest.approx(ref.pvalue)
  assert r.df == pytest.approx(ref.df)
  assert r.p_less == pytest.approx(
      st.ttest_ind(WA, WB, equal_var=False, alternative='less').pvalue)
  assert r.p_greater == pytest.approx(
      st.ttest_ind(WA, WB, equal_var=False, alternative='greater').pvalue)
  assert str(r) == '+2.0000 [-2.1554, +6.1554] 95% CI, Welch t(2.94) = 1.55, p = 0.221'


def test_welch_t_ratio_by_hand():
  # ratio 2: estimate 5 - 2 * 3 = -1; v_b = 2^2 * 4 / 3 = 16/3, var = 17/3;
  # df = (17/3)^2 / ((1/3)^2 / 2 + (16/3)^2 / 2) = (289/9) / (257/18) = 578/257.
  r = stats.welch_t(WA, WB, ratio=2.0)
  assert r.estimate == pytest.approx(-1.0)
  assert r.se == pytest.approx(math.sqrt(17 / 3))
  assert r.df == pytest.approx(578 / 257)
  # Scaling b by the ratio first gives the same test.
  ref = st.ttest_ind(WA, 2 * np.array(WB), equal_var=False)
  assert r.p == pytest.approx(ref.pvalue)


def test_welch_t_zero_variance():
  # One side constant: var = v_a = 1/3, df = n_a - 1 = 2, t = 2 / sqrt(1/3) = 2 sqrt(3),
  # so p is the paired example's 0.0741799.
  r = stats.welch_t(WA, [3.0, 3.0, 3.0])
  assert r.df == pytest.approx(2.0)
  assert r.p == pytest.approx(0.0741799, abs=1e-6)
  # Both constant and different: se 0, t = -inf, p 0, a point CI.
  r = stats.welch_t([1.0, 1.0, 1.0], [2.0, 2.0])
  # p_less = P(T <= -inf) = 0 (strong evidence for < 0), p_greater = 1.
  assert (r.se, r.t, r.p, r.p_less, r.p_greater) == (0.0, -math.inf, 0.0, 0.0, 1.0)
  assert r.ci == (-1.0, -1.0)
  assert math.isnan(r.df)
  assert stats.verdict(r.ci, claim='less') == 'reproduced'
  # Both constant and equal: no evidence either way.
  r = stats.welch_t([2.0, 2.0], [2.0, 2.0, 2.0])
  assert math.isnan(r.t) and math.isnan(r.p)
  assert stats.verdict(r.ci, claim='less') == 'inconclusive'
  assert 'nan' in str(r)


@pytest.mark.parametrize('a, b', [([1.0], [1.0, 2.0]), ([1.0, 2.0], [3.0]), ([], [])])
def test_welch_t_bad_input(a, b):
  with pytest.raises(ValueError, match='at least 2 values on each side'):
    stats.welch_t(a, b)


# --- mean_ci ----------------------------------------------------------------------------

def test_mean_ci_by_hand():
  # x = [4, 5, 6]: mean 5, s = 1, se = 1 / sqrt(3) = 0.577350, CI 5 -+ 4.302653 * se.
  m = stats.mean_ci([4.0, 5.0, 6.0])
  assert m.mean == 5.0
  assert m.se == pytest.approx(0.577350, abs=1e-6)
  assert m.ci == pytest.approx((5 - 2.484138, 5 + 2.484138), abs=1e-6)
  assert m.n == 3
  with pytest.raises(ValueError, match='at least 2 values'):
    stats.mean_ci([1.0])


# --- clustered standard errors ----------------------------------------------------------

# 6 windows from 3 documents; each document's windows are both low or both high.
X = [1.0, 3.0, 2.0, 4.0, 6.0, 8.0]
DOCS = ['d1', 'd1', 'd2', 'd2', 'd3', 'd3']
IID_SE = math.sqrt(34 / 30)


def test_clustered_se_by_hand_inflates_the_iid_se():
  # mean 24 / 6 = 4; residuals -3, -1, -2, 0, +2, +4.
  # Document sums -4, -2, +6; squares 16 + 4 + 36 = 56.
  # CR1: se^2 = G / (G - 1) * 56 / n^2 = 3/2 * 56 / 36 = 7/3, se = 1.527525.
  # iid: sum r^2 = 9 + 1 + 4 + 0 + 4 + 16 = 34, s^2 = 34 / 5, se^2 = 34 / 30,
  # se = 1.064581: clustering inflates it 1.43x.
  mean, se, g = stats.clustered_mean(X, DOCS)
  assert (mean, g) == (4.0, 3)
  assert se == pytest.approx(1.527525, abs=1e-6)
  assert stats.clustered_se(X, DOCS) == se
  assert stats.mean_ci(X).se == pytest.approx(IID_SE)
  assert se / IID_SE == pytest.approx(1.434860, abs=1e-6)


def test_clustered_se_with_one_window_per_cluster_is_the_iid_se():
  # G = n: n / (n - 1) * sum r^2 / n^2 = sum r^2 / (n (n - 1)) = s^2 / n exactly.
  mean, se, g = stats.clustered_mean(X, range(6))
  assert g == 6
  assert se == pytest.approx(IID_SE, rel=1e-12)


def test_clustered_se_anticorrelated_windows_shrink_it():
  # Residuals -3, +3 | -2, +2 | -1, +1 cancel inside each document: se 0.
  _, se, _ = stats.clustered_mean([1.0, 7.0, 2.0, 6.0, 3.0, 5.0], DOCS)
  assert se == pytest.approx(0.0, abs=1e-12)


def test_clusters_need_not_be_contiguous_or_strings():
  order = [4, 0, 2, 5, 1, 3]
  labels = [(7, 'x'), 7, 3, (7, 'x'), 7, 3]   # d3 -> (7,'x'), d1 -> 7, d2 -> 3
  mean, se, g = stats.clustered_mean([X[i] for i in order], labels)
  assert (mean, g) == (4.0, 3)
  assert se == pytest.approx(math.sqrt(7 / 3))


def test_paired_clustered_by_hand():
  # b = a - 0.01 * X, so a - b = 0.01 * X: mean 0.04, clustered se 0.01 sqrt(7/3).
  a = np.array([2.0, 2.2, 1.8, 2.4, 2.1, 2.5])
  b = a - 0.01 * np.array(X)
  d, se, g = stats.paired_clustered(a, b, DOCS)
  assert d == pytest.approx(0.04)
  assert se == pytest.approx(0.01 * math.sqrt(7 / 3))
  assert g == 3
  # ratio 2: a - 2 b = -a + 0.02 X.
  d, se, _ = stats.paired_clustered(a, b, DOCS, ratio=2.0)
  assert d == pytest.approx(-a.mean() + 0.08)
  assert se == pytest.approx(stats.clustered_se(-a + 0.02 * np.array(X), DOCS))


@pytest.mark.parametrize('values, clusters, match', [
    ([1.0, 2.0, 3.0], ['a', 'a', 'a'], 'at least 2 clusters'),
    ([1.0, 2.0, 3.0], ['a', 'b'], 'one cluster label per value'),
    ([1.0, math.inf], ['a', 'b'], 'non-finite'),
])
def test_clustered_bad_input(values, clusters, match):
  with pytest.raises(ValueError, match=match):
    stats.clustered_mean(values, clusters)


def test_paired_clustered_unequal_lengths():
  with pytest.raises(ValueError, match='one b per a'):
    stats.paired_clustered([1.0, 2.0], [1.0], ['a', 'b'])


# --- Holm -------------------------------------------------------------------------------

def test_holm_by_hand():
  # m = 4. Sorted: 0.005 (#3), 0.01 (#0), 0.03 (#2), 0.04 (#1).
  # Times m - j + 1: 4 * 0.005 = 0.02, 3 * 0.01 = 0.03, 2 * 0.03 = 0.06, 1 * 0.04 = 0.04;
  # running max makes the last 0.06 (monotone). Input order: [0.03, 0.06, 0.06, 0.02].
  adjusted, reject = stats.holm([0.01, 0.04, 0.03, 0.005])
  assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert reject.tolist() == [True, False, False, True]
  # 0.04 < 0.05 alone, but the step-down stopped at 0.03 (> 0.05 / 2).


def test_holm_caps_at_one():
  # Sorted: 0.001 -> 0.004; 0.4 * 3 = 1.2 -> 1; 0.6 * 2 = 1.2 -> 1; 0.9 -> max 1.2 -> 1.
  adjusted, reject = stats.holm([0.6, 0.4, 0.9, 0.001])
  assert adjusted == pytest.approx([1.0, 1.0, 1.0, 0.004])
  assert reject.tolist() == [False, False, False, True]


def test_holm_twelve_borderline_pairs():
  # Claim 7's shape: 12 comparisons each at p = 0.04. Each adjusts to 12 * 0.04 = 0.48.
  adjusted, reject = stats.holm([0.04] * 12)
  assert adjusted == pytest.approx([0.48] * 12)
  assert not reject.any()


def test_holm_edge_cases():
  adjusted, reject = stats.holm([])
  assert adjusted.size == 0 and reject.size == 0
  assert stats.holm([0.02], alpha=0.05).reject.tolist() == [True]
  with pytest.raises(ValueError, match=r'\[0, 1\]'):
    stats.holm([0.1, math.nan])
  with pytest.raises(ValueError, match=r'\[0, 1\]'):
    stats.holm([0.1, 1.5])


# --- time to target ---------------------------------------------------------------------

def test_time_to_target_interpolates_the_crossing():
  # 2.5 at x = 10, 1.9 at x = 20; 2.0 is 0.5 / 0.6 of the way: 10 + 10 * 5/6 = 18.3333.
  xs, ys = [0.0, 10.0, 20.0, 30.0], [3.0, 2.5, 1.9, 1.7]
  assert stats.time_to_target(xs, ys, 2.0) == pytest.approx(18.333333, abs=1e-6)
  assert stats.time_to_target(xs, ys, 2.5) == 10.0     # met exactly at a point
  assert stats.time_to_target(xs, ys, 1.0) is None     # never reached
  assert stats.time_to_target(xs, ys, 3.0) == 0.0      # the first point meets it
  assert stats.time_to_target(xs, ys, 5.0) == 0.0
  assert stats.time_to_target([], [], 1.0) is None


def test_time_to_target_skips_non_finite():
  # Without the nan at x = 10, the crossing is between (0, 3.0) and (20, 1.9):
  # 0 + 20 * (3.0 - 2.0) / (3.0 - 1.9) = 20 / 1.1 = 18.1818.
  xs, ys = [0.0, 10.0, 20.0, 30.0], [3.0, math.nan, 1.9, 1.7]
  assert stats.time_to_target(xs, ys, 2.0) == pytest.approx(18.181818, abs=1e-6)
  assert stats.time_to_target([0.0, 10.0, 20.0], [math.inf, 2.5, 1.9], 2.6) == 10.0


@pytest.mark.parametrize('xs, ys, match', [
    ([0.0, 1.0], [3.0], 'equal length'),
    ([0.0, 1.0, 1.0], [3.0, 2.0, 1.0], 'strictly increasing'),
    ([0.0, 2.0, 1.0], [3.0, 2.0, 1.0], 'strictly increasing'),
    ([0.0, math.nan, 1.0], [3.0, 2.0, 1.0], 'strictly increasing'),
])
def test_time_to_target_bad_input(xs, ys, match):
  with pytest.raises(ValueError, match=match):
    stats.time_to_target(xs, ys, 2.0)


# --- verdict ----------------------------------------------------------------------------

@pytest.mark.parametrize('ci, claim, bound, words', [
    ((-0.3, -0.1), 'less', 0.0, 'reproduced'),
    ((0.1, 0.3), 'less', 0.0, 'not reproduced'),
    ((-0.1, 0.3), 'less', 0.0, 'inconclusive'),
    ((-0.1, 0.0), 'less', 0.0, 'inconclusive'),       # touching the bound
    ((0.1, 0.3), 'greater', 0.0, 'reproduced'),
    ((-0.3, -0.1), 'greater', 0.0, 'not reproduced'),
    ((-0.1, 0.3), 'greater', 0.0, 'inconclusive'),
    ((0.1, 0.3), 'less', 0.5, 'reproduced'),
    ((0.1, 0.3), 'greater', 0.2, 'inconclusive'),
    ((math.nan, math.nan), 'less', 0.0, 'inconclusive'),
])
def test_verdict_words(ci, claim, bound, words):
  assert stats.verdict(ci, claim=claim, bound=bound) == words


def test_verdict_bad_claim():
  with pytest.raises(ValueError, match="'less', 'greater'"):
    stats.verdict((0.0, 1.0), claim='lower')


# --- seed groups, minimum detectable ---------------------------------------------------

def test_seed_groups_keeps_first_seen_order():
  runs = [{'method': m, 'seed': s} for m, s in
          [('diloco', 1), ('ddp', 1), ('diloco', 2), ('ddp', 2), ('sparse', 1)]]
  groups = stats.seed_groups(runs, key=lambda r: r['method'])
  assert [k for k, _ in groups] == ['diloco', 'ddp', 'sparse']
  assert [r['seed'] for r in groups[0][1]] == [1, 2]
  assert stats.seed_groups([], key=str) == []


def test_minimum_detectable():
  # The textbook approximation (t_{0.975,2} + t_{0.8,2}) sd / sqrt(3): with 2 df,
  # t_{0.8}: t / sqrt(2 + t^2) = 0.6 -> t^2 = 1.125, t = 1.06066;
  # (4.302653 + 1.060660) / 1.732051 = 3.096510. Its exact power is only 0.77, so the
  # exact answer is larger.
  approx = 3.096510
  exact = stats.minimum_detectable(1.0, 3)
  assert exact > approx
  nc, c = exact * math.sqrt(3), stats.t_critical(2)
  assert st.nct.sf(c, 2, nc) + st.nct.cdf(-c, 2, nc) == pytest.approx(0.8, abs=1e-6)
  # Linear in sd; at n = 30 the approximation is within 0.1%.
  assert stats.minimum_detectable(0.02, 3) == pytest.approx(0.02 * exact)
  approx30 = (stats.t_critical(29) + st.t.ppf(0.8, 29)) / math.sqrt(30)
  assert stats.minimum_detectable(1.0, 30) == pytest.approx(approx30, rel=1e-3)
  with pytest.raises(ValueError, match='n >= 2'):
    stats.minimum_detectable(1.0, 1)
