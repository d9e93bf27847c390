"""The config boundary: a ConfigDict becomes typed settings (`Experiment`), checked once.

The only module that reads a ConfigDict (DESIGN §3): `parse_config` converts it into
dataclasses with one clear error per bad value, `build_algorithm` makes the algorithm
from them and `build_timeline` the run's simulated clock, `write_config_json` records
the run's config, model size and data fingerprint in its workdir, and `print_summary`
prints the end-of-run lines.
"""

import dataclasses
from typing import Any

import jax
import ml_collections

from loco import algorithms
from loco.comm import axis
from loco import configs
from loco import data as data_lib
from loco import model as model_lib
from loco.sim import network as network_lib
from loco.algorithms import optim
from loco.run import placement as placement_lib
from loco.sim import timeline as timeline_lib
from loco.files import workdir as workdir_lib
from loco.core.engine import Algorithm
from loco.errors import ConfigError
from loco.files.metrics import SinkConfig


INNER_STATES = ('fresh', 'carried')


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The loop's own settings, typed (see loco/configs/default.py for their meaning)."""
  seed: int
  num_workers: int
  steps: int
  batch_per_worker: int
  seq_len: int
  log_every: int
  eval_every: int
  eval_batches: int
  eval_batch_size: int
  eval_per_worker: bool
  checkpoint_every: int
  checkpoint_keep: int
  mesh_workers: int
  mesh_fsdp: int
  mesh_slices: int
  grad_mode: str
  progress: bool
  init_from: str = ''
  init_inner_state: str = 'fresh'
  diagnostics: bool = True

  def __post_init__(self):
    for key in ('num_workers', 'steps', 'batch_per_worker', 'seq_len', 'log_every',
                'eval_batches', 'eval_batch_size', 'mesh_workers', 'mesh_fsdp',
                'mesh_slices'):
      if getattr(self, key) < 1:
        raise ConfigError(f'{_config_key(key)} must be >= 1, got {getattr(self, key)}.')
    if self.init_inner_state not in INNER_STATES:
      raise ConfigError(f'init_inner_state must be one of {INNER_STATES}, got '
                        f'{self.init_inner_state!r}.')
    if self.init_inner_state != 'fresh' and not self.init_from:
      raise ConfigError(f'init_inner_state={self.init_inner_state} carries the inner state '
                        'of a warm start; it needs init_from (the run or checkpoint to '
                        'start from).')
    if self.grad_mode not in axis.GRAD_MODES:
      raise ConfigError(f'grad_mode must be one of {axis.GRAD_MODES}, got '
                        f'{self.grad_mode!r}.')


def _config_key(field: str) -> str:
  for prefix in ('eval', 'checkpoint', 'mesh'):
    if field.startswith(prefix + '_'):
      return f'{prefix}.{field[len(prefix) + 1:]}'
  return field


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything `run` builds from a config: typed settings, model, data, algorithm."""
  run: RunConfig
  model: model_lib.ModelConfig
  data: data_lib.DataConfig
  inner: optim.InnerConfig
  algorithm_name: str
  algorithm_kwargs: dict[str, Any]
  network: network_lib.NetworkConfig | None = None
  sinks: SinkConfig = SinkConfig()
  model_preset: str = ''


def _set(d) -> dict[str, Any]:
  return {k: v for k, v in d.items() if v is not None}


def parse_config(config: ml_collections.ConfigDict) -> Experiment:
  """Converts a ConfigDict into typed settings, with one clear error per bad value."""
  configs.validate(config)   # every key, type and range: the schema and algorithm specs
  c = config
  run = RunConfig(
      seed=c.seed, num_workers=c.num_workers, steps=c.steps,
      batch_per_worker=c.batch_per_worker, seq_len=c.seq_len, log_every=c.log_every,
      eval_every=c.eval.every, eval_batches=c.eval.batches,
      eval_batch_size=c.eval.batch_size, eval_per_worker=c.eval.per_worker,
      checkpoint_every=c.checkpoint.every, checkpoint_keep=c.checkpoint.keep,
      mesh_workers=c.mesh.workers, mesh_fsdp=c.mesh.fsdp,
      mesh_slices=c.mesh.slices, grad_mode=c.grad_mode,
      progress=c.progress, init_from=c.init_from, init_inner_state=c.init_inner_state,
      diagnostics=c.metrics.diagnostics)
  data = data_lib.DataConfig(**c.data)
  model_overrides = _set(c.model)
  preset = model_overrides.pop('preset')
  if 'vocab_size' not in model_overrides:
    model_overrides['vocab_size'] = data_lib.make_tokenizer(data).vocab_size
  model = model_lib.model_config(preset, **model_overrides)
  if run.seq_len > model.max_seq_len:
    raise ConfigError(f'seq_len={run.seq_len} is above the model\'s max_seq_len='
                      f'{model.max_seq_len}.')
  algorithm_kwargs = _set(c.algorithm)
  name = algorithm_kwargs.pop('name')
  inner_kwargs = _set(c.optimizer)
  inner_kwargs.setdefault('decay_steps', max(1, run.steps - c.optimizer.warmup_steps))
  inner_kwargs.setdefault('name', algorithms.spec_of(name).inner)
  inner = optim.InnerConfig(**inner_kwargs)
  network = network_lib.parse_network(c.network.to_dict())
  return Experiment(run, model, data, inner, name, algorithm_kwargs, network,
                    SinkConfig(**{k: v for k, v in _set(c.metrics).items()
                                  if k != 'diagnostics'}), preset)


def build_algorithm(exp: Experiment, mesh=None) -> Algorithm:
  """The run's algorithm; with snapshots for the overlapped asynchronous replay."""
  inner = optim.inner_optimizer(exp.inner)
  return for_network(exp, algorithms.make(exp.algorithm_name, inner, mesh=mesh,
                                          diagnostics=exp.run.diagnostics,
                                          **exp.algorithm_kwargs))


def for_network(exp: Experiment, algorithm: Algorithm) -> Algorithm:
  """The algorithm as the run's network simulates it: the overlapped asynchronous
  replay's variant (with snapshots) where the network asks for it."""
  net = exp.network
  if (net is not None and net.mode == 'async' and net.async_overlap == 'compute'
      and algorithm.replay is not None and algorithm.replay.overlapped is not None):
    algorithm = algorithm.replay.overlapped()
  return algorithm


def build_timeline(exp: Experiment, algorithm: Algorithm) -> timeline_lib.Timeline | None:
  """The run's simulated clock (None without a network config): the model's FLOPs per
  token, bytes and parameter shapes handed to `timeline.make_timeline`."""
  r = exp.run
  return timeline_lib.make_timeline(
      exp.network, num_workers=r.num_workers, steps=r.steps, algorithm=algorithm,
      name=exp.algorithm_name,
      flops_per_token=model_lib.flops_per_token(exp.model, r.seq_len),
      tokens_per_step=r.batch_per_worker * r.seq_len,
      model_bytes=4 * model_lib.param_count(exp.model),
      params=model_lib.abstract_params(exp.model))


def check_vocabulary(exp: Experiment) -> None:
  """The model's embedding table holds every token id the tokenizer can produce."""
  tokenizer_vocab = data_lib.make_tokenizer(exp.data).vocab_size
  if exp.model.vocab_size < tokenizer_vocab:
    # Token ids past the embedding table would be clipped silently by the gather.
    raise ConfigError(f'model.vocab_size={exp.model.vocab_size} is below the tokenizer\'s '
                      f'{tokenizer_vocab} tokens; leave it unset (the tokenizer\'s size) or '
                      'make it at least that.')


def write_config_json(wd: workdir_lib.Workdir, config, exp: Experiment) -> None:
  """Writes config.json: the full config, the model's size and FLOPs per token, the data's
  fingerprint (what a resume and the readers of a run check against)."""
  out = dict(config=config.to_dict(),
             model=dict(dataclasses.asdict(exp.model),
                        param_count=model_lib.param_count(exp.model),
                        flops_per_token=model_lib.flops_per_token(exp.model,
                                                                  exp.run.seq_len)),
             data_fingerprint=data_lib.dataset_fingerprint(exp.data))
  workdir_lib.write_json(wd.file(workdir_lib.CONFIG), out)


HEADER_WIDTH = 92


def header_line(key: str, text: str) -> str:
  """A line of a run's header or of its start-up phases: the key, then its text."""
  return f'  {key:<10} {text}'


def header(exp: Experiment, workdir: str, start: int, total: int) -> list[str]:
  """What a run prints before its first slow phase: the algorithm and its settings,
  the workers and devices, the model's size, the tokens planned, the network and the
  workdir (a resumed run: the step it resumes from)."""
  r = exp.run
  devices = r.mesh_workers * r.mesh_fsdp
  platform = jax.devices()[0].platform
  where = (f'1 {platform} device' if devices == 1 else
           f'{devices} {platform} devices (mesh {r.mesh_workers} workers x {r.mesh_fsdp} fsdp)')
  if jax.process_count() > 1:
    where += f' in {jax.process_count()} processes'
  m = exp.model
  lines = [f'loco: {exp.algorithm_name}, {r.num_workers} workers on {where}; model '
           f'{exp.model_preset}: {model_lib.param_count(m):,} weights ({m.num_layers} '
           f'layers, d_model {m.d_model})']
  settings = algorithms.settings_of(exp.algorithm_name, exp.algorithm_kwargs)
  lines += _wrapped('algorithm', [f'{k}={v}' for k, v in settings.items() if v is not None])
  if devices > 1:
    lines += _wrapped('mesh', placement_lib.arrange(r.mesh_workers, r.mesh_fsdp,
                                                r.mesh_slices)[1].split())
  i = exp.inner
  lines += _wrapped('inner', [i.name] + [f'{k}={getattr(i, k):g}' for k in (
      'lr', 'warmup_steps', 'decay_steps', 'final_lr_frac', 'weight_decay', 'clip_norm')])
  d = exp.data
  lines.append(header_line('data', f'{d.source}{f" {d.tfds_name}" if d.source == "tfds" else ""}'
                           f', {d.tokenizer} tokenizer, {d.sharding} over workers'))
  lines.append(header_line('eval', f'{r.eval_batches} x {r.eval_batch_size} sequences of '
                           f'{d.eval_split} every {r.eval_every} steps' if r.eval_every
                           else 'none (eval.every=0)'))
  tokens = r.steps * r.num_workers * r.batch_per_worker * r.seq_len
  ticks = f' ({total} ticks of the asynchronous replay)' if total != r.steps else ''
  lines.append(header_line(
      'tokens', f'{tokens:,} planned: {r.steps} steps{ticks} x {r.num_workers} workers x '
      f'{r.batch_per_worker} sequences x {r.seq_len}'))
  lines.append(header_line('network', _network_line(exp.network)))
  if start:
    run = f'resuming from step {start} of {total}'
  elif r.init_from:
    run = f'a new run, warm-started from {r.init_from}'
  else:
    run = 'a new run'
  every = (f'checkpoint every {r.checkpoint_every} steps' if r.checkpoint_every
           else 'checkpoint at the end')
  lines.append(header_line('workdir', f'{workdir} ({run}; {every})'))
  return lines


def _wrapped(key: str, words: list[str]) -> list[str]:
  lines, line = [], ''
  for word in words:
    if line and len(header_line(key, f'{line} {word}')) > HEADER_WIDTH:
      lines.append(line)
      line = word
    else:
      line = f'{line} {word}' if line else word
  lines.append(line)
  return [header_line(key if n == 0 else '', text) for n, text in enumerate(lines)]


def _network_line(net: network_lib.NetworkConfig | None) -> str:
  if net is None:
    return 'none (no simulated clock: set network.profile to time the run)'
  defaults = {f.name: f.default for f in dataclasses.fields(net)}
  changed = [f'{k}={v}' for k, v in dataclasses.asdict(net).items()
             if k not in ('profile', 'mode') and v != defaults[k]]
  return ' '.join([f'{net.profile} ({net.mode})', *changed])


def print_summary(config, workdir: str, record: dict[str, Any]) -> None:
  """Prints the end-of-run lines: final eval loss against the unigram-entropy reference."""
  if jax.process_index() != 0:
    return
  exp = parse_config(config)
  lines = [f'workdir: {workdir}', f'steps: {record.get("step")}  tokens: {record.get("tokens")}']
  if 'eval_loss' in record:
    entropy = data_lib.unigram_entropy_nats(exp.data)
    lines.append(f'final eval_loss: {record["eval_loss"]:.4f} nats/token  '
                 f'(unigram entropy of the eval split: {entropy:.4f} nats/token)')
  lines.append(f'bytes sent per worker: {record.get("bytes_sent", 0):,.0f}  '
               f'syncs: {record.get("syncs", 0):.0f}')
  if record.get('sim_seconds'):
    lines.append(f'simulated time: {record["sim_seconds"]:,.1f} s  compute utilization: '
                 f'{record["utilization"]:.1%}  (network.profile={exp.network.profile!r})')
  print('\n'.join(lines))
