"""The sync plan: fragments of a param tree, their offsets, the slot table, its checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loco import model as model_lib
from loco.core import sync_plan
from loco.errors import ConfigError
from tests.test_streaming import _blocks_tree


def test_block_index_reads_key_paths():
  cfg = model_lib.model_config('nano')
  params = jax.eval_shape(lambda k: model_lib.init_params(cfg, k)[1], jax.random.PRNGKey(0))
  frag = sync_plan.assign_fragments(params)
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for (path, _), f in zip(leaves, frag.leaf_fragment):
    name = jax.tree_util.keystr(path)
    want = 0 if 'blocks' not in name else 1 + sync_plan.block_index(path)
    assert f == want, name
  assert frag.blocks == ((), (0,), (1,)) and frag.non_block == 0
  tree = {'layers_3': {'w': 0}, 'h': {'2': {'w': 0}}, 'head': 0}
  got = [sync_plan.block_index(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  assert got == [2, None, 3]              # sorted keys: h, head, layers_3


def test_strided_sequential_own_first():
  tree = _blocks_tree(num_blocks=6)
  strided = sync_plan.assign_fragments(tree, 3)
  assert strided.blocks == ((), (0, 3), (1, 4), (2, 5))
  sequential = sync_plan.assign_fragments(tree, fragment_pattern='sequential',
                                          layers_per_fragment=2)
  assert sequential.blocks == ((), (0, 1), (2, 3), (4, 5))
  first = sync_plan.assign_fragments(tree, 3, non_block='first')
  assert first.blocks == ((0, 3), (1, 4), (2, 5)) and first.non_block == 0
  assert sync_plan.fragment_sizes(tree, first) == [8 + 4 + 2 * 15, 30, 30]
  no_blocks = sync_plan.assign_fragments({'w': jnp.ones(3), 'b': jnp.ones(2)})
  assert no_blocks.num_fragments == 1 and no_blocks.leaf_fragment == (0, 0)
  assert sync_plan.sync_offsets(3, 10) == (0, 3, 6)
  assert sync_plan.sync_offsets(5, 100) == (0, 20, 40, 60, 80)


def test_slot_table_of_four_fragments_by_hand():
  """H 8, four one-leaf fragments at offsets 0, 2, 4, 6; results arrive tau 1 later."""
  plan = sync_plan.SyncPlan(8, lambda params: sync_plan.Fragments((2, 0, 3, 1), (0, 2, 4, 6)))
  schedule = plan.schedule([0.0] * 4, delay=1)
  assert schedule.members == ((1,), (3,), (0,), (2,))
  np.testing.assert_array_equal(schedule.slots, [0, -1, 1, -1, 2, -1, 3, -1])
  steps = jnp.arange(1, 17)
  syncing = [int(schedule.syncing(s)[0]) for s in steps]
  arriving = [int(schedule.arriving(s)) for s in steps]
  assert syncing == [-1, 1, -1, 2, -1, 3, -1, 0] * 2
  assert arriving == [-1, -1, 1, -1, 2, -1, 3, -1, 0, -1, 1, -1, 2, -1, 3, -1]
  assert schedule.syncing(jnp.asarray(2))[1] is None        # every worker syncs


def test_streaming_plan_staggers_the_blocks_and_puts_the_rest_last():
  # Non-block fragment 0 at the end of the round, blocks 0 and 1 at H/3 and 2H/3.
  schedule = sync_plan.streaming(6, 2).schedule(_blocks_tree(num_blocks=2))
  assert schedule.offsets == (0, 2, 4)
  np.testing.assert_array_equal(schedule.slots, [0, -1, 1, -1, 2, -1])
  one = sync_plan.every(5).schedule({'w': jnp.ones(2), 'b': jnp.ones(1)})
  assert one.members == ((0, 1),) and one.offsets == (0,)
  np.testing.assert_array_equal(one.slots, [0, -1, -1, -1, -1])


def test_a_step_context_overrides_a_one_fragment_plan():
  schedule = sync_plan.every(4).schedule({'w': jnp.ones(2)})
  index, who = schedule.syncing(jnp.asarray(1), jnp.asarray(True))
  assert int(index) == 0 and who is None
  mask = np.array([True, False, False])
  index, who = schedule.syncing(jnp.asarray(1), mask)
  assert int(index) == 0
  np.testing.assert_array_equal(who, mask)
  index, _ = schedule.syncing(jnp.asarray(4), np.zeros(3, bool))
  assert int(index) == -1
  fragmented = sync_plan.streaming(6, 2).schedule(_blocks_tree(num_blocks=2))
  with pytest.raises(ConfigError, match='Participation.sync'):
    fragmented.syncing(jnp.asarray(1), jnp.asarray(True))
  delayed = sync_plan.every(4).schedule({'w': jnp.ones(2)}, delay=1)
  with pytest.raises(ConfigError, match='Participation.sync'):
    delayed.syncing(jnp.asarray(1), jnp.asarray(True))


def test_bad_plans():
  with pytest.raises(ConfigError, match='sync_every'):
    sync_plan.every(0)
  with pytest.raises(ConfigError, match='overlap_steps=2 must be < 2'):
    sync_plan.check_schedule((0, 2, 4, 6), 8, 2)
  with pytest.raises(ConfigError, match='distinct steps'):
    sync_plan.check_schedule((0, 0), 8, 0)
  with pytest.raises(ConfigError, match='distinct steps'):
    sync_plan.check_schedule((0, 8), 8, 0)
  with pytest.raises(ConfigError, match='overlap_steps=4 must be < 4'):
    sync_plan.every(4).schedule({'w': jnp.ones(2)}, delay=4)
