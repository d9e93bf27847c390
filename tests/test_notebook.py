"""The quickstart notebook runs top to bottom in a fresh kernel (slow: about 2 minutes)."""

import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
  nbformat = pytest.importorskip('nbformat')
  nbclient = pytest.importorskip('nbclient')
  monkeypatch.setenv('LOCO_QUICK', '1')
  monkeypatch.setenv('LOCO_REPO', REPO)
  monkeypatch.setenv('LOCO_DATA_DIR', str(tmp_path / 'tfds'))
  notebook = nbformat.read(os.path.join(REPO, 'notebooks', 'quickstart.ipynb'), as_version=4)
  nbclient.NotebookClient(notebook, timeout=900, kernel_name='python3',
                          resources={'metadata': {'path': str(tmp_path)}}).execute()
  outputs = '\n'.join(o.get('text', '') for cell in notebook.cells if cell.cell_type == 'code'
                      for o in cell.get('outputs', []))
  for name in ('gasloc', 'diloco', 'topk_diloco'):
    assert f'{name}: eval loss' in outputs
    assert os.path.exists(tmp_path / 'runs' / 'quickstart' / name / 'metrics.jsonl')
  plots = tmp_path / 'runs' / 'quickstart' / 'plots'
  assert (plots / 'eval_loss_vs_sim_seconds.png').exists()
  assert (plots / 'eval_loss_vs_bytes_sent.png').exists()
