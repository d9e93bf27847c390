"""Evaluating finished runs again: more held-out tokens, the same batches for every run.

  python -m loco.evaluate RUN [RUN ...] [--batches=512] [--batch_size=16] [--split=SPLIT]

For each run, the mean of its workers' models in its latest checkpoint is scored on
`batches` fixed eval windows of the run's seq_len from `split` (default: the run's own
eval split), and the result is written to RUN/evals/SPLIT_BATCHESxBATCH_SIZE.json:
{step, split, loss, se, per_batch}. Runs of the same data and seq_len are scored on the
same windows, so two of them compare by the paired difference of their per-batch losses
(`paired`), whose standard error is far below either run's own: the per-batch losses of
two models move together with the batch's difficulty.
"""

import argparse
import functools
import json
import math
import os
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from loco import checkpoint as checkpoint_lib
from loco import data as data_lib
from loco import model as model_lib
from loco import workdir as workdir_lib
from loco.errors import LocoError, WorkdirError

EVALS = 'evals'


def _name(split: str, batches: int, batch_size: int) -> str:
  safe = ''.join(ch if ch.isalnum() or ch in '_-' else '_' for ch in split)
  return f'{safe}_{batches}x{batch_size}.json'


def result_path(workdir: str, split: str, batches: int, batch_size: int) -> str:
  return os.path.join(workdir, EVALS, _name(split, batches, batch_size))


@functools.lru_cache(maxsize=8)
def _scorer(model_cfg: model_lib.ModelConfig):
  graphdef = jax.eval_shape(functools.partial(model_lib.init_params, model_cfg),
                            jax.random.key(0))[0]

  @jax.jit
  def per_batch(params, batches_NxBxL):
    return jax.lax.map(
        lambda b: model_lib.loss_fn(model_cfg, graphdef, params, b)[1]['ce'], batches_NxBxL)
  return per_batch


@functools.lru_cache(maxsize=8)
def _windows(data_json: str, split: str, seq_len: int, batches: int, batch_size: int):
  data = data_lib.DataConfig(**{**json.loads(data_json), 'eval_split': split})
  return data_lib.make_eval_batches(data, batch_size=batch_size, seq_len=seq_len,
                                    num_batches=batches)


def mean_params(workdir: str, model_cfg: model_lib.ModelConfig) -> tuple[int, Any]:
  """(step, the mean of the workers' params) of the run's latest checkpoint."""
  where, saved = checkpoint_lib.read_named_state(workdir)
  like = jax.eval_shape(functools.partial(model_lib.init_params, model_cfg),
                        jax.random.key(0))[1]
  try:
    leaves = checkpoint_lib.worker_means(saved['params'], like, 'params')
  except (KeyError, ValueError) as e:
    raise WorkdirError(f'the checkpoint at {where} has no {e.args[0]} of this model: its '
                       'model differs from its config.json.') from None
  return int(os.path.basename(where)), jax.tree.unflatten(jax.tree.structure(like), leaves)


def evaluate_run(workdir: str, batches: int = 512, batch_size: int = 16,
                 split: str | None = None) -> dict[str, Any]:
  """Scores the run's latest checkpoint (see the module doc); writes and returns it."""
  stored = workdir_lib.read_json(os.path.join(workdir, workdir_lib.CONFIG))
  if not isinstance(stored, dict) or 'config' not in stored:
    raise WorkdirError(f'{workdir} is not a loco run (no readable config.json).')
  config = stored['config']
  model = {k: v for k, v in stored['model'].items()
           if k not in ('param_count', 'flops_per_token')}
  model_cfg = model_lib.ModelConfig(**model)
  split = split or config['data']['eval_split']
  step, params = mean_params(workdir, model_cfg)
  windows = _windows(json.dumps(config['data'], sort_keys=True), split, config['seq_len'],
                     batches, batch_size)
  per_batch = np.asarray(_scorer(model_cfg)(params, jnp.asarray(windows)), np.float64)
  result = dict(step=step, split=split, batches=batches, batch_size=batch_size,
                loss=float(per_batch.mean()),
                se=float(per_batch.std(ddof=1) / math.sqrt(len(per_batch))),
                per_batch=per_batch.tolist())
  path = result_path(workdir, split, batches, batch_size)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  workdir_lib.write_json(path, result)
  return result


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
  """(mean of a - b, its standard error over batches) for per-batch losses of two
  models (or of two groups of models, averaged per batch) on the same batches."""
  if len(a) != len(b) or len(a) < 2:
    raise ValueError('paired needs two equal-length lists of at least two batch losses.')
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m loco.evaluate', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('runs', nargs='+')
  parser.add_argument('--batches', type=int, default=512)
  parser.add_argument('--batch_size', type=int, default=16)
  parser.add_argument('--split', default=None)
  args = parser.parse_args(argv)
  try:
    for run in args.runs:
      r = evaluate_run(run, args.batches, args.batch_size, args.split)
      print(f'{run}: step {r["step"]}, eval loss {r["loss"]:.4f} ± {r["se"]:.4f} (SE over '
            f'{args.batches} batches of {args.batch_size} on {r["split"]})')
  except LocoError as e:
    print(f'loco.evaluate: error: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
