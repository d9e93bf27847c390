"""What every comparison sweep shares: equal tokens for all runs.

8 workers x 4 sequences x 128 tokens per step, 300 inner steps (1.23M tokens), eval and
checkpoint every 150 steps, a metrics line every 10. Imported by the specs in this
directory as `launch.sweeps.common` (run loco.sweep from the repository root).
"""

from loco.lab.sweep import Run

STEPS = 300
COMMON = {'num_workers': 8, 'batch_per_worker': 4, 'seq_len': 128, 'eval.every': 150,
          'eval.batches': 8, 'checkpoint.every': 150, 'log_every': 10, 'progress': False}


def suite(rows: list[tuple[str, str, dict]]) -> list[Run]:
  """Runs from (name, config, overrides) rows, each with COMMON and STEPS first."""
  return [Run(name, config, {**COMMON, 'steps': STEPS, **overrides})
          for name, config, overrides in rows]
