"""The slow tier's shares: packed by measured time, every slow test in exactly one."""

from tests import tiers


def test_shares_are_packed_by_time_and_cover_every_test():
  seconds = {'a': 200.0, 'b': 150.0, 'c': 100.0, 'd': 90.0, 'e': 60.0}
  shares = tiers.slow_shares([*seconds, 'new_1', 'new_2'], seconds, budget=240)
  # First fit, longest first, at most 240 s a share: [a], [b, d], [c, e].
  assert [[n for n in s if n in seconds] for s in shares] == [['a'], ['b', 'd'], ['c', 'e']]
  placed = sorted(n for s in shares for n in s)
  assert placed == sorted([*seconds, 'new_1', 'new_2'])      # each test exactly once
  # A test not measured yet lands in the same share every time (its id's hash).
  again = tiers.slow_shares([*seconds, 'new_1', 'new_2'], seconds, budget=240)
  assert again == shares


def test_a_test_longer_than_a_share_is_alone_and_nothing_measured_is_one_share():
  seconds = {'long': 1000.0, 'x': 30.0, 'y': 20.0}
  shares = tiers.slow_shares(list(seconds), seconds, budget=240)
  assert shares == [['long'], ['x', 'y']]
  assert tiers.slow_shares(['p', 'q'], {}, budget=240) == [['p', 'q']]
