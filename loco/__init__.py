"""loco: communication-efficient LLM pre-training with simulated workers.

The stable surface (everything else is internal and may move):

  the contract      Algorithm, LocoState, StepContext, StepInfo, local_updates, and its
                    policies as values: the modules sync_plan and merge, and a tick's
                    Participation (who takes part in a sync, and how)
  algorithms        REGISTRY, make_algorithm, register_algorithm, AlgorithmSpec; the
                    modules comm, compress, topology, optim
  the model         ModelConfig, model_config, init_params, loss_fn
  data              DataConfig, make_train_iterator, make_eval_windows
  runs              train (train.run(config, workdir); train.run_many for runs of one
                    shape as one program), evaluate_run, read_run
  measurement       stats, study, overlap_model (compute utilization against bandwidth;
                    `utilization`, its former name, still resolves)

  import loco
  alg = loco.make_algorithm('diloco', inner, sync_every=50)
  state = alg.init(params, 8, key)
  state, info = alg.step(state, grads_MxP)

Names are imported on first use, so `import loco` stays cheap (no JAX until needed).
"""

import importlib
from typing import Any

__version__ = '0.1.0'   # the distribution loco-sim's version (pyproject.toml reads it)

# name -> (module, attribute); attribute None: the module itself.
_EXPORTS = {
    'Algorithm': ('loco.core.engine', 'Algorithm'),
    'LocoState': ('loco.core.engine', 'LocoState'),
    'StepContext': ('loco.core.engine', 'StepContext'),
    'StepInfo': ('loco.core.engine', 'StepInfo'),
    'Participation': ('loco.core.participation', 'Participation'),
    'local_updates': ('loco.core.engine', 'local_updates'),
    'sync_plan': ('loco.core.sync_plan', None),
    'merge': ('loco.core.merge', None),
    'REGISTRY': ('loco.algorithms', 'REGISTRY'),
    'make_algorithm': ('loco.algorithms', 'make'),
    'register_algorithm': ('loco.algorithms', 'register'),
    'AlgorithmSpec': ('loco.algorithms', 'AlgorithmSpec'),
    'comm': ('loco.comm', None),
    'compress': ('loco.comm.compress', None),
    'topology': ('loco.comm.topology', None),
    'optim': ('loco.algorithms.optim', None),
    'ModelConfig': ('loco.model', 'ModelConfig'),
    'model_config': ('loco.model', 'model_config'),
    'init_params': ('loco.model', 'init_params'),
    'loss_fn': ('loco.model', 'loss_fn'),
    'DataConfig': ('loco.data', 'DataConfig'),
    'make_train_iterator': ('loco.data', 'make_train_iterator'),
    'make_eval_windows': ('loco.data', 'make_eval_windows'),
    'train': ('loco.run.train', None),
    'evaluate_run': ('loco.run.evaluate', 'evaluate_run'),
    'read_run': ('loco.files.runs', 'read_run'),
    'stats': ('loco.stats', None),
    'study': ('loco.lab.study', None),
    'overlap_model': ('loco.overlap_model', None),
}
__all__ = sorted(_EXPORTS)
# Former names, still resolved but not listed: old name -> its name in _EXPORTS.
_ALIASES = {'utilization': 'overlap_model'}


def __getattr__(name: str) -> Any:
  export = _ALIASES.get(name, name)
  if export not in _EXPORTS:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  module, attribute = _EXPORTS[export]
  value = importlib.import_module(module)
  if attribute is not None:
    value = getattr(value, attribute)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(list(globals()) + __all__)
