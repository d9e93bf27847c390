"""Evaluation: one implementation for the training loop and for finished runs.

  python -m loco.evaluate RUN [RUN ...] [--batches=512] [--batch_size=16] [--split=SPLIT]

The windows (`loco.data.make_eval_windows`) are drawn across the whole split, one per
equal stratum of its documents in a fixed shuffled order, and each window's loss is kept
with its document. The eval loss is the mean over windows; its standard error is
clustered by document (`stats.clustered_mean`), since windows of one document move
together. The training loop (`make_evaluator`) scores the mean of the workers' models
every `eval.every` steps; this command scores the mean model of a run's latest
checkpoint on as many windows as asked and writes RUN/evals/SPLIT_BATCHESxBATCH_SIZE.json:

  {step, diverged (diverged.json's {step, message} if the run diverged, else null),
   split, batches, batch_size, loss, se (clustered by document), se_iid (over
   windows), documents (touched), split_documents, per_batch, window_losses, window_docs}

Runs of the same data and seq_len are scored on the same windows, so two of them compare
by the paired difference of their per-window losses (`stats.paired_clustered`), whose
standard error is far below either run's own.
"""

from __future__ import annotations

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

from loco.run import checkpoint as checkpoint_lib
from loco import cli
from loco import data as data_lib
from loco import model as model_lib
from loco.files import runs as runs_lib
from loco import stats
from loco.files import workdir as workdir_lib
from loco.errors import LocoError, WorkdirError

EVALS = runs_lib.EVALS


def window_losses(model_cfg, graphdef, params, tokens_NxBxLp1: jax.Array) -> jax.Array:
  """Mean cross-entropy of each window, float32 [N, B] (one batch at a time)."""
  return jax.lax.map(
      lambda b: jnp.mean(model_lib.token_losses(model_cfg, graphdef, params, b), axis=-1),
      tokens_NxBxLp1)


def summarize(losses_NxB, docs_NxB) -> dict[str, float]:
  """`eval_loss` (the mean over windows) and, with two or more documents,
  `eval_loss_se` (its standard error clustered by document)."""
  losses = np.asarray(losses_NxB, np.float64).ravel()
  docs = np.asarray(docs_NxB).ravel()
  if len(np.unique(docs)) < 2 or not np.all(np.isfinite(losses)):
    return {'eval_loss': float(losses.mean())}
  mean, se, _ = stats.clustered_mean(losses, docs)
  return {'eval_loss': float(mean), 'eval_loss_se': float(se)}


def mean_model(tree_MxP: PyTree) -> PyTree:
  """The worker-averaged model, for evaluation only (no communication is implied)."""
  return jax.tree.map(lambda x: jnp.mean(x.astype(jnp.float32), axis=0).astype(x.dtype),
                      tree_MxP)


def worker_spread(tree_MxP: PyTree) -> jax.Array:
  """RMS distance of the workers' params to their mean, relative to the mean's norm."""
  mean = mean_model(tree_MxP)
  dist2 = sum(jnp.sum((x - m[None]) ** 2) for x, m in
              zip(jax.tree.leaves(tree_MxP), jax.tree.leaves(mean)))
  norm2 = sum(jnp.sum(m ** 2) for m in jax.tree.leaves(mean))
  num = jax.tree.leaves(tree_MxP)[0].shape[0]
  return jnp.sqrt(dist2 / num) / jnp.maximum(jnp.sqrt(norm2), 1e-12)


def make_evaluator(model_cfg, graphdef, per_worker: bool):
  """The in-loop eval: `evaluate(params_MxP, windows) -> {name: float}`.

  Scores the worker-averaged model on `windows` (`data.EvalWindows`): `eval_loss`,
  `eval_loss_se` (clustered by document), `worker_spread`, and with `per_worker` the
  mean of each worker's own eval loss (`eval_loss_workers`).
  """
  @jax.jit
  def scores(params_MxP, tokens):
    out = {'window_losses': window_losses(model_cfg, graphdef,
                                          mean_model(params_MxP), tokens),
           'worker_spread': worker_spread(params_MxP)}
    if per_worker:
      out['eval_loss_workers'] = jnp.mean(jax.vmap(
          lambda p: jnp.mean(window_losses(model_cfg, graphdef, p, tokens)))(params_MxP))
    return out

  def evaluate(params_MxP, windows: data_lib.EvalWindows) -> dict[str, float]:
    out = jax.device_get(scores(params_MxP, windows.tokens))
    result = summarize(out.pop('window_losses'), windows.docs)
    result.update({k: float(v) for k, v in out.items()})
    return result

  return evaluate


def _name(split: str, batches: int, batch_size: int) -> str:
  safe = ''.join(ch if ch.isalnum() or ch in '_-' else '_' for ch in split)
  return f'{safe}_{batches}x{batch_size}.json'


def result_path(workdir: str, split: str, batches: int, batch_size: int) -> str:
  return os.path.join(workdir, EVALS, _name(split, batches, batch_size))


@functools.lru_cache(maxsize=8)
def _scorer(model_cfg: model_lib.ModelConfig):
  graphdef = jax.eval_shape(functools.partial(model_lib.init_params, model_cfg),
                            jax.random.key(0))[0]
  return jax.jit(functools.partial(window_losses, model_cfg, graphdef))


@functools.lru_cache(maxsize=8)
def _windows(data_json: str, split: str, seq_len: int, batches: int, batch_size: int):
  data = data_lib.DataConfig(**json.loads(data_json))
  return data_lib.make_eval_windows(data, batch_size=batch_size, seq_len=seq_len,
                                    num_batches=batches, split=split)


def mean_params(workdir: str, model_cfg: model_lib.ModelConfig) -> tuple[int, Any]:
  """(step, the mean of the workers' params) of the run's latest checkpoint."""
  where, saved = checkpoint_lib.read_named_state(workdir, what=workdir)
  like = jax.eval_shape(functools.partial(model_lib.init_params, model_cfg),
                        jax.random.key(0))[1]
  try:
    leaves = checkpoint_lib.worker_means(saved['params'], like, 'params')
  except (KeyError, ValueError) as e:
    raise WorkdirError(f'the checkpoint at {where} has no {e.args[0]} of this model: its '
                       'model differs from its config.json.') from None
  return int(os.path.basename(where)), jax.tree.unflatten(jax.tree.structure(like), leaves)


# Batches scored per compiled call: Ctrl-C and SIGTERM are handled between calls (a
# signal waits until XLA returns), so a long evaluation stops within one chunk.
CHUNK_BATCHES = 16


def _score_in_chunks(scorer, params, tokens_NxBxLp1: np.ndarray) -> np.ndarray:
  """`scorer(params, tokens)` over the batches, CHUNK_BATCHES at a time (the last chunk
  padded with copies of its first batch, so one program serves every chunk)."""
  n = tokens_NxBxLp1.shape[0]
  size = min(n, CHUNK_BATCHES)
  out = []
  for start in range(0, n, size):
    chunk = tokens_NxBxLp1[start:start + size]
    real = chunk.shape[0]
    if real < size:
      chunk = np.concatenate([chunk, np.repeat(chunk[:1], size - real, axis=0)])
    out.append(np.asarray(scorer(params, jnp.asarray(chunk)), np.float64)[:real])
  return np.concatenate(out)


def _stored_run(workdir: str) -> tuple[dict[str, Any], model_lib.ModelConfig]:
  if not os.path.isdir(workdir):
    raise WorkdirError(f'{workdir} is not a directory.')
  stored = runs_lib.read_config(workdir)   # a damaged config.json: one line naming it
  if stored is None:
    raise WorkdirError(f'{workdir} is not a loco run (no readable config.json).')
  config = stored['config']
  try:
    model = {k: v for k, v in stored['model'].items()
             if k not in ('param_count', 'flops_per_token')}
    model_cfg = model_lib.ModelConfig(**model)
    config['data'], config['seq_len']   # pylint: disable=pointless-statement
  except (TypeError, KeyError, ValueError, AttributeError):
    raise WorkdirError(f'{os.path.join(workdir, runs_lib.CONFIG)} is not a loco run\'s '
                       'config.json (no model, data or seq_len).') from None
  return config, model_cfg


def evaluate_run(workdir: str, batches: int = 512, batch_size: int = 16,
                 split: str | None = None) -> dict[str, Any]:
  """Scores the run's latest checkpoint (see the module doc); writes and returns it."""
  if batches < 1 or batch_size < 1:
    raise LocoError(f'batches ({batches}) and batch_size ({batch_size}) must be at least 1.')
  config, model_cfg = _stored_run(workdir)
  split = split or config['data']['eval_split']
  step, params = mean_params(workdir, model_cfg)
  windows = _windows(json.dumps(config['data'], sort_keys=True), split, config['seq_len'],
                     batches, batch_size)
  losses = _score_in_chunks(_scorer(model_cfg), params, windows.tokens)
  if not np.all(np.isfinite(losses)):
    raise LocoError(f'the model of {workdir} at step {step} scores a non-finite loss on '
                    f'{split}: it diverged.')
  summary = summarize(losses, windows.docs)
  flat = losses.ravel()
  # A run that diverged keeps its last good checkpoint: scored, and said to be that.
  diverged = runs_lib.read_diverged(workdir)
  result = dict(step=step, diverged=diverged, split=split, batches=batches,
                batch_size=batch_size,
                loss=summary['eval_loss'], se=summary.get('eval_loss_se'),
                se_iid=(float(flat.std(ddof=1) / math.sqrt(flat.size)) if flat.size > 1
                        else None),
                documents=int(len(np.unique(windows.docs))),
                split_documents=windows.split_documents,
                per_batch=losses.mean(axis=1).tolist(),
                window_losses=losses.tolist(), window_docs=windows.docs.tolist())
  path = result_path(workdir, split, batches, batch_size)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  workdir_lib.write_json(path, result)
  return result


def _describe(run: str, r: dict[str, Any]) -> str:
  se = 'n/a (one document)' if r['se'] is None else f'{r["se"]:.4f}'
  what = (f'step {r["step"]}' if not r.get('diverged') else
          f'step {r["step"]}, its last good checkpoint (the run diverged at step '
          f'{r["diverged"]["step"]}: not a finished run)')
  return (f'{run}: {what}, eval loss {r["loss"]:.4f} ± {se} (SE clustered by '
          f'document; {r["batches"]} batches of {r["batch_size"]} windows from '
          f'{r["documents"]} of {r["split_documents"]} documents of {r["split"]})')


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog='python -m loco.evaluate', description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('runs', nargs='+')
  parser.add_argument('--batches', type=cli.positive_int, default=512)
  parser.add_argument('--batch_size', type=cli.positive_int, default=16)
  parser.add_argument('--split', default=None)
  args = parser.parse_args(argv)

  def body() -> int:
    for run in args.runs:
      print(_describe(run, evaluate_run(run, args.batches, args.batch_size, args.split)),
            flush=True)
    return 0

  return cli.run('loco.evaluate', body)


if __name__ == '__main__':
  cli.exit(main())
