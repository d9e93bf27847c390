"""The claims page's practitioner figures (launch/claims_figures.py) on hand-made finals:
warm starts counted from their source run's step 0, loss against simulated time per
network, the Pareto front over bytes, and the page's lines."""

import json
import os

import pytest

from launch import claims
from launch import claims_figures as cf
from loco.lab import retime
from loco.lab import study

BUDGET = study.Budget(base='experiments/micro.py:ddp', steps=12, steps_h1=6, common={},
                      inner_lrs=(1e-3, 2e-3, 4e-3), seeds=(1, 2))
WARM = {'init_from': os.path.join('{out}', 'final', 'ddp', 'seed{seed}', 'checkpoints', '6')}
METHODS = [study.Method('ddp', {}),
           study.Method('dn', {'algorithm.name': 'diloco'}),
           study.Method('sp', {'algorithm.name': 'sparseloco'}),
           study.Method('h1', {'algorithm.name': 'dsgd'}, h1=True)]
FINALS = [study.Final('ddp', 'ddp'), study.Final('dn', 'dn'), study.Final('sp', 'sp'),
          study.Final('warm', 'dn', WARM), study.Final('dn_e3m0', 'dn',
                                                       {'algorithm.compression': 'e3m0'}),
          study.Final('dn_h5', 'dn', {'algorithm.sync_every': 5}), study.Final('h1', 'h1')]
TOKENS = 2048          # per step


def _rows(path, rows):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, 'metrics.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in rows))


def _run(out, name, seed, steps, sent_per_step, seconds_per_step, losses, networks=()):
  """A final's metrics (a row every 6 steps, evals `losses`) and its re-timings."""
  rows = [{'step': s, 'tokens': s * TOKENS, 'bytes_sent': s * sent_per_step,
           'bytes_received': 2 * s * sent_per_step, 'eval_loss': loss}
          for s, loss in zip(range(6, steps + 1, 6), losses)]
  d = os.path.join(out, 'final', name, f'seed{seed}')
  _rows(d, rows)
  for k, net in enumerate(networks, 1):
    _rows(os.path.join(d, 'retimed', net),
          [{**r, 'sim_seconds': r['step'] * seconds_per_step * k} for r in rows])
  return d


def _group(name, losses, curves, sent=0.0, received=0.0):
  return study.Group(name, dict(zip((1, 2), losses)), {}, None, sent, received, 0.0, curves)


def test_a_warm_start_is_counted_from_its_source_runs_step_0(tmp_path):
  out = str(tmp_path)
  _run(out, 'ddp', 1, 12, 100.0, 1.0, [3.0, 2.5])      # seed 2's DDP run is gone
  assert cf.warm_names(FINALS) == ['warm']
  assert cf.warm_source(FINALS[3], 1, out) == (os.path.join(out, 'final', 'ddp', 'seed1'), 6)
  assert cf.warm_source(FINALS[1], 1, out) is None
  g = {'warm': _group('warm', [2.4, 2.45], [[(6 * TOKENS, 2.45)], [(6 * TOKENS, 2.5)]],
                      sent=50.0, received=60.0),
       'dn': _group('dn', [2.5, 2.5], [[(12 * TOKENS, 2.5)]] * 2, sent=10.0)}
  moved = cf.offset_warm_starts(g, out, FINALS, BUDGET)
  # DDP had trained 6 steps' tokens and sent 600 bytes (1,200 received) by step 6.
  assert moved['warm'].curves == [[(12 * TOKENS, 2.45)], [(12 * TOKENS, 2.5)]]
  assert (moved['warm'].bytes_sent, moved['warm'].bytes_received) == (650.0, 1260.0)
  assert moved['dn'] is g['dn'] and g['warm'].curves[0] == [(6 * TOKENS, 2.45)]
  assert cf.tokens_label(['ddp', 'warm'], ['warm']).startswith('tokens (warm starts')
  assert cf.tokens_label(['ddp'], ['warm']) == 'tokens'
  assert 'warm starts from DDP' in ''.join(cf.caption(['ddp', 'warm'], ['warm']))
  assert cf.caption(['ddp'], ['warm']) == []


def test_loss_against_simulated_time_per_network_and_the_time_to_target(tmp_path):
  out, nets = str(tmp_path), ('slow', 'fast')
  for seed in (1, 2):
    _run(out, 'ddp', seed, 12, 100.0, 2.0, [3.0, 2.0], nets)     # 2 s per step on slow
    _run(out, 'dn', seed, 12, 10.0, 1.0, [3.0, 2.2 + 0.1 * seed], nets)
    _run(out, 'warm', seed, 6, 10.0, 1.0, [2.1], nets)          # 6 steps after DDP's 6
  names = cf.time_names(FINALS, METHODS)
  assert names == ['ddp', 'dn', 'sp', 'warm', 'dn_e3m0']        # no H = 1, no H series
  curves = cf.time_curves(out, FINALS, BUDGET, names, 'slow')
  assert set(curves) == {'ddp', 'dn', 'warm'}                   # sp, dn_e3m0 not re-timed
  assert [x for p in curves['dn'][0] for x in p] == pytest.approx([6.0, 3.0, 12.0, 2.3])
  # The warm start's own 6 steps at 1 s, after DDP's 6 steps at 2 s on the same network.
  assert curves['warm'] == [[(12.0 + 6.0, 2.1)]] * 2
  assert cf.time_curves(out, FINALS, BUDGET, ['warm'], 'fast')['warm'][0] == [(36.0, 2.1)]
  t = cf.timing({n: cf.time_curves(out, FINALS, BUDGET, names, n) for n in nets})
  assert t.target == pytest.approx(2.4)                         # dn seed 2's last eval
  # DDP crosses 2.4 at 60% of the way from 3.0 to 2.0 (steps 6 -> 12, 2 s per step).
  assert t.to_target['slow']['ddp'] == pytest.approx(12 + 0.6 * 12)
  assert t.to_target['slow']['warm'] == 18.0 and t.total['fast']['ddp'] == 48.0
  assert t.never['slow'] == {'ddp': 0, 'dn': 0, 'warm': 0}
  labels = {'slow': 'slow', 'fast': 'fast'}
  g = {'dn': _group('dn', [2.3, 2.4], [])}
  table = cf.time_table(t, labels, g)
  assert table[0].startswith('| final | final eval loss | slow: to 2.400 / whole run')
  assert '| warm | — | 18 s / 18 s | 36 s / 36 s |' in table
  assert table[3].startswith('| dn | 2.3500 ± 0.0707 | **12 s** / 12 s |')   # the fastest


def test_the_pareto_front_is_over_the_finals_at_the_pages_token_budget():
  full = [[(12 * TOKENS, 2.0)]] * 2
  g = {'ddp': _group('ddp', [2.0, 2.02], full, 1000.0, 1000.0),
       'dn': _group('dn', [2.1, 2.1], full, 100.0, 100.0),
       'sp': _group('sp', [2.3, 2.2], full, 10.0, 200.0),
       'dn_h5': _group('dn_h5', [2.2, 2.2], full, 300.0, 300.0),       # dominated by dn
       'warm': _group('warm', [1.5, 1.5], [[(24 * TOKENS, 1.5)]] * 2, 50.0, 50.0),
       'h1': _group('h1', [2.5, 2.5], full, 0.0, 0.0)}                # sends nothing
  pts = cf.points(g, FINALS, METHODS)
  by = {p.name: p for p in pts}
  assert [p.name for p in pts] == ['ddp', 'dn', 'sp', 'warm', 'dn_h5', 'h1']
  assert (by['sp'].family, by['ddp'].family, by['warm'].family) == ('sparseloco', 'ddp',
                                                                     'diloco')
  assert (by['sp'].loss, by['sp'].low, by['sp'].high) == pytest.approx((2.25, 2.2, 2.3))
  assert not by['warm'].eligible and not by['h1'].eligible      # more tokens; no bytes
  front = cf.fronts(pts)
  assert [p.name for p in front['sent']] == ['sp', 'dn', 'ddp']
  assert [p.name for p in front['received']] == ['dn', 'ddp']   # sp receives 200 B
  rows = cf.front_table(front, {}, {})
  assert rows[2].startswith('| sp | sent | 10 B | 200 B | 2.2500 |')
  assert rows[3].startswith('| dn | sent and received | 100 B | 100 B | 2.1000 |')


def test_the_section_draws_its_figures_and_says_what_is_missing(tmp_path):
  out, figures = str(tmp_path / 'out'), str(tmp_path / 'figures')
  nets = {'gbit1_100ms': claims.NETWORKS['gbit1_100ms']}
  full = [[(6 * TOKENS, 3.0), (12 * TOKENS, 2.0)]] * 2
  g = {'ddp': _group('ddp', [2.0, 2.1], full, 1200.0, 1200.0),
       'dn': _group('dn', [2.1, 2.2], full, 120.0, 120.0)}
  lines = '\n'.join(cf.section(out, g, FINALS, METHODS, BUDGET, nets, figures, 'f'))
  assert 'No final is re-timed on these networks yet' in lines
  assert '![loss against bytes](f/pareto_bytes.png)' in lines
  assert '| gbit1_100ms | 1 Gbit/s | 100 ms | 0.1 s | — |' in lines
  assert 'ddp sends 100 B per worker per step' in lines
  for seed in (1, 2):
    _run(out, 'ddp', seed, 12, 100.0, 1.5, [3.0, 2.0], nets)
    _run(out, 'dn', seed, 12, 10.0, 0.2, [3.0, 2.2], nets)
  lines = '\n'.join(cf.section(out, g, FINALS, METHODS, BUDGET, nets, figures, 'f'))
  assert '| gbit1_100ms | 1 Gbit/s | 100 ms | 0.1 s | 1.500 s |' in lines
  assert '![loss against simulated time](f/sim_time.png)' in lines
  assert '| dn | 2.1500 ± 0.0707 | **' in lines
  # The front's members with their whole run on each network (dn: 12 steps x 0.2 s).
  assert '| dn | sent and received | 120 B | 120 B | 2.1500 | 2 s | ' in lines
  for name in cf.FIGURES.values():
    assert os.path.getsize(os.path.join(figures, name)) > 1000, name


def test_the_pages_networks_are_valid_network_keys():
  for name, keys in claims.NETWORKS.items():
    section = retime.network_section(keys)
    assert section['profile'] == 'homogeneous', name
    assert 0.01 <= section['latency'] <= 0.1, name
    assert section['step_seconds'] == claims.SLOW_LINKS['network.step_seconds']
  assert [cf.network_label(k) for k in claims.NETWORKS.values()] == [
      '1 Gbit/s, 100 ms', '10 Gbit/s, 30 ms', '100 Gbit/s, 10 ms']
  # The page's own methods: each method's final, the codec variants and the warm starts
  # are drawn against time; none at one step per communication.
  scale = claims.SCALES['quick']
  names = cf.time_names(claims.finals(scale), claims.methods(scale))
  h1 = {m.name for m in claims.methods(scale) if m.h1}
  assert 'ddp' == names[0] and set(cf.warm_names(claims.finals(scale))) <= set(names)
  assert not set(names) & h1
