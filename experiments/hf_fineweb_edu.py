"""DiLoCo on FineWeb-Edu from the Hugging Face Hub: 60M model, 4 workers, H = 100.

Needs a network (once, while the corpus is prepared), the Hugging Face extra and a
tokenizer: any tokenizer.json of the `tokenizers` library, e.g. GPT-2's (vocab 50,257;
its <|endoftext|> ends each document; the model's vocabulary follows the tokenizer's):
  pip install -e '.[hf]'
  hf download openai-community/gpt2 tokenizer.json --local-dir ~/tokenizers/gpt2
  python -m loco.main --config=experiments/hf_fineweb_edu.py --workdir=runs/hf_fineweb_edu \
    --config.data.hf_tokenizer=~/tokenizers/gpt2/tokenizer.json

The first run streams the first 300,000 rows of `HuggingFaceFW/fineweb-edu`
(configuration sample-10BT, column 'text'; about 1.4 GB of text, 300M GPT-2 tokens)
into a loco corpus in data.data_dir ($LOCO_DATA_DIR or ~/.cache/loco/tfds), carving
5% of the rows out for validation by content hash (loco/data/hf.py); later runs and
resumes read that copy and need no network. The same config trains on a local dataset
with --config.data.hf_dataset=PATH (a save_to_disk folder or a folder of parquet /
jsonl files; --config.data.hf_config= for none).

Expected: accelerator-scale, not measured (loco's machines have no network to fetch
FineWeb-Edu): 2,000 steps of 4 x 32 x 1024 tokens, 262M tokens, about one pass over
the rows read; eval_loss in nats per GPT-2 token.
"""

from loco.configs import default


def get_config():
  c = default.get_config()
  c.num_workers = 4
  c.steps = 2000
  c.batch_per_worker = 32
  c.seq_len = 1024
  c.model.preset = '60m'           # vocab_size: the tokenizer's
  c.data.source = 'hf'
  c.data.hf_dataset = 'HuggingFaceFW/fineweb-edu'
  c.data.hf_config = 'sample-10BT'
  c.data.hf_streaming = True       # read only the rows taken, not the 28 GB sample
  c.data.hf_max_docs = 300_000
  c.data.text_key = 'text'
  c.data.tokenizer = 'hf'          # data.hf_tokenizer: the user's tokenizer.json
  c.optimizer.lr = 4e-4
  c.optimizer.warmup_steps = 200
  c.algorithm.name = 'diloco'
  c.algorithm.sync_every = 100
  c.algorithm.outer_optimizer = 'nesterov'
  c.algorithm.outer_lr = 0.7
  c.algorithm.outer_momentum = 0.9
  c.eval.every = 200
  c.eval.batches = 20
  c.eval.batch_size = 32
  c.log_every = 50
  c.checkpoint.every = 200
  return c
