"""The generated reference pages of the site, written before Sphinx reads the sources.

  reference/config.md     every config key: type, default, range, meaning
                          (`loco.configs.reference`)
  reference/api.md        the stable surface, `loco.__all__`, through autosummary (the
                          lazy names are resolved first, so autodoc sees real objects)
  reference/commands.md   every command's flags, as its own parser prints them (--help)

Nothing here is hand-kept: a key, a name or a flag changes the page at the next build.
The pages are build outputs (.gitignore); a page is rewritten only when its text changes.
"""

import concurrent.futures
import os
import subprocess
import sys
import types

# (title, console script or None, argv after `python`); a command with sub-commands lists
# each. The commands of `launch/` run from a checkout.
COMMANDS = [
    ('loco.main', 'loco-train', ['-c', 'import absl.flags, loco.run.flags; '
                                 'print(absl.flags.FLAGS.module_help("loco.run.flags"))']),
    ('loco.sweep', 'loco-sweep', ['-m', 'loco.sweep', '--help']),
    ('loco.report', 'loco-report', ['-m', 'loco.report', '--help']),
    ('loco.compare', 'loco-compare', ['-m', 'loco.compare', '--help']),
    ('loco.retime', 'loco-retime', ['-m', 'loco.retime', '--help']),
    ('loco.evaluate', 'loco-evaluate', ['-m', 'loco.evaluate', '--help']),
    ('loco.data.prepare c4', 'loco-prepare c4', ['-m', 'loco.data.prepare', 'c4', '--help']),
    ('loco.data.prepare tokenizer', 'loco-prepare tokenizer',
     ['-m', 'loco.data.prepare', 'tokenizer', '--help']),
    ('loco.data.tokenizers train', 'loco-tokenizer train',
     ['-m', 'loco.data.tokenizers', 'train', '--help']),
    ('loco.overlap_model', 'loco-utilization', ['-m', 'loco.overlap_model', '--help']),
    ('loco.batched', None, ['-m', 'loco.batched', '--help']),
    ('launch.claims', None, ['-m', 'launch.claims', '--help']),
    ('launch.scaling', None, ['-m', 'launch.scaling', '--help']),
    ('launch.gpu_study', None, ['-m', 'launch.gpu_study', '--help']),
    ('launch.batch_shapes', None, ['-m', 'launch.batch_shapes', '--help']),
    ('loco/colab.py', None, ['loco/colab.py', '--help']),
]

API_GROUPS = [
    ('The contract', ['Algorithm', 'LocoState', 'StepContext', 'StepInfo', 'Participation',
                      'local_updates', 'sync_plan', 'merge']),
    ('Algorithms', ['REGISTRY', 'make_algorithm', 'register_algorithm', 'AlgorithmSpec',
                    'comm', 'compress', 'topology', 'optim']),
    ('The model', ['ModelConfig', 'model_config', 'init_params', 'loss_fn']),
    ('Data', ['DataConfig', 'make_train_iterator', 'make_eval_windows']),
    ('Runs', ['train', 'evaluate_run', 'read_run']),
    ('Measurement', ['stats', 'study', 'overlap_model']),
]


# loco objects outside `loco.__all__` that its signatures and docstrings name.
REFERRED = [
    'loco.wire.Wire',
    'loco.comm.drift.Drift',
    'loco.core.engine.AsyncReplay',
    'loco.algorithms.spec.Key',
    'loco.data.pipeline.TrainIterator',
    'loco.data.pipeline.EvalWindows',
    'loco.files.runs.Run',
    'loco.lab.sweep.Run',
    'loco.errors',
]


def _write(path: str, text: str) -> None:
  if os.path.exists(path):
    with open(path) as f:
      if f.read() == text:
        return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def config_page() -> str:
  from loco.configs import reference  # pylint: disable=g-import-not-at-top
  return '\n'.join([
      '# Config keys', '',
      'Every key loco reads, generated from its declaration: the comment of the key in '
      '`loco/configs/default.py`, its value rule in `loco.configs.CONSTRAINTS`, and for '
      '`algorithm.*` the `Key` of the algorithm specs (`loco/algorithms/spec.py` and each '
      "algorithm's file). Set any key with `--config.KEY=VALUE` ({doc}`/reference/commands`);"
      ' a misspelled key or a value out of range stops a run with one line naming it.', '',
      'A default of `None` means "the model preset\'s value", "the algorithm\'s default" '
      'or "off", as the key says.', '',
      reference.markdown()])


def _entry(value, name: str) -> str:
  """A module is listed under its own path (autodoc imports it by that path; `loco.study`
  is the module `loco.lab.study`), anything else under its `loco` name."""
  if isinstance(value, types.ModuleType):
    return value.__name__.removeprefix('loco.')
  return name


def api_page() -> str:
  import loco  # pylint: disable=g-import-not-at-top
  listed = [name for _, names in API_GROUPS for name in names]
  missing = sorted(set(loco.__all__) - set(listed))
  extra = sorted(set(listed) - set(loco.__all__))
  if missing or extra:
    raise RuntimeError(f'docs/_ext/loco_reference.py API_GROUPS is out of date with '
                       f'loco.__all__: missing {missing}, not exported {extra}')
  out = ['# API', '',
         '`import loco` names the stable surface (`loco/__init__.py`); everything else is '
         'internal and may move. The names load on first use, so `import loco` stays '
         'cheap; each entry below is the object the name resolves to, a module under '
         'its own path (`loco.study` is `loco.lab.study`).', '',
         '```{eval-rst}', '.. currentmodule:: loco', '```', '']
  for title, names in API_GROUPS:
    documented = [n for n in names if _documented(getattr(loco, n))]
    out += [f'## {title}', '', '```{eval-rst}', '.. autosummary::', '   :toctree: generated',
            '']
    out += [f'   {_entry(getattr(loco, name), name)}' for name in documented]
    out += ['```', '']
    for name in names:   # a value (a dict, ...) has no docstring of its own: say what it is
      if name not in documented:
        out += _value(name, getattr(loco, name))
  out += ['## Types the surface refers to', '',
          'Not imported by `import loco`, but named in the signatures above.', '',
          '```{eval-rst}', '.. autosummary::', '   :toctree: generated', '']
  out += [f'   {name.removeprefix("loco.")}' for name in REFERRED]
  out += ['```', '']
  return '\n'.join(out)


def _documented(value) -> bool:
  import inspect  # pylint: disable=g-import-not-at-top
  return inspect.ismodule(value) or inspect.isclass(value) or callable(value)


def _value(name: str, value) -> list[str]:
  if isinstance(value, dict):
    kind = f'dict of {len(value)}: ' + ', '.join(f'``{k}``' for k in value)
  else:
    kind = type(value).__name__
  module = value.__class__.__module__
  return ['```{eval-rst}', f'.. py:data:: {name}', '',
          f'   A {kind}.' + (f' Defined in ``{module}``.' if module != 'builtins' else ''),
          '```', '']


def _help(argv: list[str], root: str) -> str:
  env = dict(os.environ, JAX_PLATFORMS='cpu', COLUMNS='88')
  done = subprocess.run([sys.executable, *argv], cwd=root, env=env, capture_output=True,
                        text=True, timeout=300, check=False)
  if done.returncode != 0 or not done.stdout.strip():
    raise RuntimeError(f'python {" ".join(argv)} failed ({done.returncode}): '
                       f'{done.stderr.strip()[-500:]}')
  return done.stdout.rstrip()


def commands_page(root: str) -> str:
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    helps = list(pool.map(lambda c: _help(c[2], root), COMMANDS))
  out = ['# Commands', '',
         "Every command's flags, as its own parser prints them (`--help`), generated when "
         'the site is built. Each answers bad input (a wrong flag or value, a damaged run '
         'file, a missing directory, a read-only or full disk, Ctrl-C) with one line and a '
         'non-zero exit. The installed console scripts run the same `main()` as the '
         '`python -m` forms; the `launch.*` commands run from a checkout.', '',
         '`loco.main` takes `--config=FILE[:VARIANT]` and any number of '
         '`--config.KEY=VALUE` overrides, one per key of {doc}`/reference/config`.', '']
  for (title, script, _), text in zip(COMMANDS, helps):
    out.append(f'## `{title}`')
    out.append('')
    if script:
      out.append(f'Console script: `{script}`.')
      out.append('')
    out += ['```text', text, '```', '']
  return '\n'.join(out)


def write_pages(docs: str) -> None:
  """Writes the three generated pages under docs/reference/."""
  root = os.path.dirname(docs)
  _write(os.path.join(docs, 'reference', 'config.md'), config_page())
  _write(os.path.join(docs, 'reference', 'api.md'), api_page())
  _write(os.path.join(docs, 'reference', 'commands.md'), commands_page(root))


def setup(app):
  del app
  return {'parallel_read_safe': True, 'parallel_write_safe': True}
