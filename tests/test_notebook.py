"""The quickstart notebook runs top to bottom in a fresh kernel, on one CPU device and on 8
simulated ones (a Colab TPU's 8 cores: a 4 x 2 workers x fsdp mesh). Slow: about 2 minutes
each."""

import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.parametrize('devices,mesh', [(1, '1 x 1'), (8, '4 x 2')])
def test_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch, devices, mesh):
  nbformat = pytest.importorskip('nbformat')
  nbclient = pytest.importorskip('nbclient')
  monkeypatch.setenv('LOCO_SMOKE', '1')
  monkeypatch.setenv('LOCO_REPO', REPO)
  monkeypatch.setenv('LOCO_DATA_DIR', str(tmp_path / 'tfds'))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  monkeypatch.setenv('XLA_FLAGS', f'--xla_force_host_platform_device_count={devices}')
  notebook = nbformat.read(os.path.join(REPO, 'notebooks', 'quickstart.ipynb'), as_version=4)
  nbclient.NotebookClient(notebook, timeout=900, kernel_name='python3',
                          resources={'metadata': {'path': str(tmp_path)}}).execute()
  outputs = '\n'.join(o.get('text', '') for cell in notebook.cells if cell.cell_type == 'code'
                      for o in cell.get('outputs', []))
  assert f'JAX: {devices} cpu device(s)' in outputs and f'mesh: {mesh} (workers x fsdp)' in outputs
  for name in ('gasloc', 'diloco', 'topk_diloco'):
    assert f'{name}: eval loss' in outputs
    assert os.path.exists(tmp_path / 'runs' / 'quickstart' / name / 'metrics.jsonl')
  plots = tmp_path / 'runs' / 'quickstart' / 'plots'
  assert (plots / 'eval_loss_vs_sim_seconds.png').exists()
  assert (plots / 'eval_loss_vs_bytes_sent.png').exists()
