"""The documentation site: every config key documented, the generated references complete,
and the site built with warnings as errors and cross-references checked (-W -n), then
loaded in a headless browser."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import types

import pytest

import loco
from loco import configs
from loco.configs import reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, 'docs')


def _loco_reference():
  spec = importlib.util.spec_from_file_location(
      'loco_reference', os.path.join(DOCS, '_ext', 'loco_reference.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_every_config_key_has_a_doc():
  keys = reference.keys()
  assert [k.key for k in keys if not k.doc] == [], (
      'give each key a comment in loco/configs/default.py (or a Key doc in its spec)')
  assert sorted(k.key for k in keys) == sorted(configs.schema())


def test_a_keys_doc_its_continuation_lines_its_rule_and_per_algorithm_defaults():
  by_key = {k.key: k for k in reference.keys()}
  assert by_key['init_from'].doc.endswith("'' = from scratch")          # a continued comment
  assert 'rotation (exchange r with the partner' in by_key['network.peer_choice'].doc
  assert by_key['grad_mode'].doc.startswith('How per-worker gradients')  # the block above
  assert (by_key['optimizer.lr'].kind, by_key['optimizer.lr'].default,
          by_key['optimizer.lr'].rule) == ('float', '0.003', 'positive')
  sync = by_key['algorithm.sync_every']
  assert sync.rule == '>= 1' and sync.doc == 'H: inner steps per round'
  assert '500 (diloco, gasloc)' in sync.default


def test_the_config_page_escapes_what_markdown_would_read():
  page = reference.markdown()
  assert r'checkpoints/\<step\> folder' in page
  assert r'iid \| noniid' in page


def test_the_api_page_lists_every_exported_name():
  page = _loco_reference().api_page()
  for name in loco.__all__:
    value = getattr(loco, name)
    # A module is listed under its own path (`loco.study` as lab.study).
    entry = (value.__name__.removeprefix('loco.') if isinstance(value, types.ModuleType)
             else name)
    assert f'   {entry}\n' in page or f'.. py:data:: {name}' in page, name
  assert '   lab.study\n' in page and '   run.train\n' in page


def _build(out: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'sphinx', '-W', '-n', '-q', '-b', 'html',
                         '-d', os.path.join(out, '.doctrees'), DOCS, out],
                        capture_output=True, text=True, check=False, cwd=REPO)


@pytest.fixture(scope='module')
def site(tmp_path_factory) -> str:
  out = str(tmp_path_factory.mktemp('site'))
  built = _build(out)
  assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
  return out


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(site):
  with open(os.path.join(site, 'reference', 'config.html')) as f:
    config = f.read()
  assert 'algorithm.sync_every' in config and 'network.peer_choice' in config
  with open(os.path.join(site, 'reference', 'commands.html')) as f:
    commands = f.read()
  assert '--batch_runs' in commands and '--coordinator_address' in commands
  for page in ('notebooks/quickstart.html', 'claims.html', 'scaling/micro.html',
               'reference/generated/loco.StepInfo.html', 'results/index.html'):
    assert os.path.exists(os.path.join(site, page)), page


def _chromium() -> str | None:
  return next((shutil.which(n) for n in ('chromium', 'chromium-browser', 'google-chrome')
               if shutil.which(n)), None)


@pytest.mark.slow
@pytest.mark.parametrize('page', ['index.html', 'reference/config.html'])
def test_a_browser_loads_the_page_without_console_errors(site, page, tmp_path):
  browser = _chromium()
  if browser is None:
    pytest.skip('no headless Chromium (apt-get install -y chromium)')
  shot = tmp_path / 'page.png'
  out = subprocess.run([browser, '--headless=new', '--no-sandbox', '--disable-gpu',
                        '--enable-logging=stderr', '--v=0', '--window-size=1280,1600',
                        f'--user-data-dir={tmp_path / "profile"}', f'--screenshot={shot}',
                        f'file://{os.path.join(site, page)}'],
                       capture_output=True, text=True, timeout=120, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert shot.exists() and shot.stat().st_size > 20_000   # a rendered page, not a blank
  console = [line for line in out.stderr.splitlines() if ':CONSOLE' in line]
  assert console, 'the theme logs to the console when it loads: no page script ran'
  # Chromium logs every console message at INFO; an error shows in its text.
  problems = [line for line in console if 'Uncaught' in line or 'Error' in line]
  assert problems == [], problems
  # A script, style sheet or image that is not there (the log does not show those).
  with open(os.path.join(site, page)) as f:
    html = f.read()
  here = os.path.dirname(os.path.join(site, page))
  missing = [ref for ref in re.findall(r'(?:src|href)="([^"#?:]+)[^"]*"', html)
             if not ref.startswith('//') and not os.path.exists(os.path.join(here, ref))]
  assert missing == [], missing


def test_the_readme_states_the_claims_pages_verdicts():
  """README's results table copies docs/claims.md's verdicts: regenerating the page and
  forgetting the README fails here."""
  from launch import claims
  page = claims.previous_verdicts(os.path.join(REPO, claims.PAGE))
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    readme = dict((int(n), word) for n, word in re.findall(
        r'^\| (\d+) \| [^|\n]+ \| (reproduced|not reproduced|inconclusive|not run) \|',
        f.read(), re.M))
  assert len(page) == len(claims.CLAIMS) and readme == page
