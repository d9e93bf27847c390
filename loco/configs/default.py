"""The default config: every key loco reads, defined once, with a comment.

Experiment files import it (`from loco.configs import default`), override keys and
return it. Keys set to a placeholder (None) mean "the default of the model preset / the
algorithm's paper".
"""

from ml_collections import config_dict
from ml_collections.config_dict import placeholder

from loco import algorithms


def get_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.seed = 0                        # seeds params, data order and algorithm randomness
  c.num_workers = 4                 # M, simulated workers (the leading "workers" axis)
  c.steps = 1000                    # inner steps per worker
  c.batch_per_worker = 16           # sequences per worker per inner step
  c.seq_len = 128                   # tokens per sequence (<= model.max_seq_len)
  c.init_from = ''                  # warm start: a run's workdir (its latest checkpoint) or a
                                    # checkpoints/<step> folder; '' = from scratch
  c.init_inner_state = 'fresh'      # warm start: fresh | carried (the source's inner state,
                                    # averaged over its workers)

  c.model = config_dict.ConfigDict()
  c.model.preset = 'tiny'           # nano | micro | tiny | 60m | 150m | 400m | 1b (loco/model.py)
  c.model.vocab_size = placeholder(int)   # None: the tokenizer's vocabulary size
  c.model.d_model = placeholder(int)      # None fields below: the preset's value
  c.model.num_layers = placeholder(int)   # transformer blocks
  c.model.num_heads = placeholder(int)    # attention heads (d_model divisible by it)
  c.model.d_ff = placeholder(int)         # hidden width of each MLP
  c.model.max_seq_len = placeholder(int)  # longest sequence the model takes (>= seq_len)
  c.model.mlp = placeholder(str)          # gelu | swiglu
  c.model.qk_norm = placeholder(bool)     # normalize queries and keys before attention
  c.model.z_loss = placeholder(float)     # weight of the squared log-partition term of the loss
  c.model.tie_embeddings = placeholder(bool)  # the output head reuses the input embedding
  c.model.dtype = placeholder(str)        # float32 | bfloat16 compute dtype

  c.data = config_dict.ConfigDict()
  c.data.source = 'stdlib'          # stdlib (embedded, no download) | text | tfds | hf
  c.data.tfds_name = ''             # e.g. 'loco_c4/en:1.0.0' (C4, python -m loco.data.prepare c4)
  c.data.data_dir = ''              # '' -> $LOCO_DATA_DIR or ~/.cache/loco/tfds
  c.data.text_glob = ''             # files to train on when source == 'text'
  c.data.text_key = 'text'          # the text feature of a TFDS dataset, column of an HF one
  c.data.train_split = 'train'      # the split the workers train on
  c.data.eval_split = 'validation'  # the split evaluations read
  c.data.tokenizer = 'bytes'        # bytes | sentencepiece | hf (pip install -e '.[hf]')
  c.data.sp_model = ''              # SentencePiece .model path (tokenizer == sentencepiece)
  c.data.hf_tokenizer = ''          # tokenizer == hf: a tokenizer.json (the tokenizers library's)
                                    # or a folder holding one; its vocabulary sets the model's
  # source == hf (pip install -e '.[hf]'; loco/data/hf.py): the rows are prepared once into
  # a loco corpus in data_dir (train / validation splits, as for text files), then read
  # like one; data.train_split / eval_split name those prepared splits.
  c.data.hf_dataset = ''            # a Hub name ('HuggingFaceFW/fineweb-edu': downloaded) or a
                                    # local path: a save_to_disk folder, or a folder of files
  c.data.hf_config = ''             # the dataset's configuration ('sample-10BT'); '' none
  c.data.hf_train_split = 'train'   # the HF split the training documents come from
  c.data.hf_eval_split = ''         # the HF split held out for evaluation; '' carves
                                    # hf_eval_fraction of hf_train_split's rows (by content hash)
  c.data.hf_eval_fraction = 0.05    # the carved share, when hf_eval_split is ''
  c.data.hf_max_docs = 0            # rows read from each HF split, the first in stored order;
                                    # 0: all (a Hub dataset may be terabytes: set it)
  c.data.hf_streaming = False       # stream a Hub dataset's rows instead of downloading it whole
  c.data.sharding = 'iid'           # iid | noniid: how documents are split across workers
  c.data.noniid_by = 'file'         # file | cluster (non-iid split rule; cluster reads <= 200k docs)
  c.data.read_threads = 2           # reader threads per worker for a TFDS source
  c.data.sampling = 'windows'       # windows: every row of a batch an independent window of
                                    # the worker's share, each read once per epoch (the papers'
                                    # loaders) | stream: consecutive windows of one token
                                    # stream per worker (loco's old layout; loco/data/sampling.py)
  c.data.window_pool_tokens = 2**25  # windows: a worker's windows are permuted within pools
                                    # of this many tokens (uint16 in memory); a local corpus's
                                    # share up to this is one pool per epoch

  c.optimizer = config_dict.ConfigDict()  # the inner optimizer, shared by all algorithms
  c.optimizer.name = placeholder(str)  # adamw | muon | sgd | signsgd (loco/algorithms/optim.py);
                                    # None: the algorithm's default (its spec's `inner`)
  c.optimizer.lr = 3e-3             # peak learning rate
  c.optimizer.warmup_steps = 50     # linear warm-up steps
  c.optimizer.decay_steps = placeholder(int)  # cosine length after warm-up; None: the rest of the run
  c.optimizer.final_lr_frac = 0.1   # cosine ends at lr * final_lr_frac
  c.optimizer.b1 = 0.9              # Adam b1; Muon's and SGD's momentum
  c.optimizer.b2 = 0.95             # Adam b2 (Muon: its Adam fallback)
  c.optimizer.eps = 1e-8            # Adam epsilon (its Muon fallback too)
  c.optimizer.weight_decay = 0.1    # decoupled weight decay on matrices
  c.optimizer.clip_norm = 1.0       # per-worker global-norm clipping; 0 disables

  # The algorithm: its name, then every registered algorithm's keys (None: the factory's
  # default). Each key's type, range and meaning is declared once, beside its factory
  # (loco/algorithms/spec.py COMMON_KEYS, or the algorithm's spec); an algorithm takes only
  # its own (`algorithms.keys_of`).
  c.algorithm = config_dict.ConfigDict()
  c.algorithm.name = 'ddp'          # see loco/algorithms/__init__.py REGISTRY
  for key, declared in algorithms.config_keys().items():
    c.algorithm[key] = placeholder(declared.kind)

  # The simulated network (loco/sim/network.py): set profile to get sim_seconds,
  # utilization and idle time; None fields take the profile's defaults.
  c.network = config_dict.ConfigDict()
  c.network.profile = placeholder(str)   # None: no clock | homogeneous | multi_region | lognormal
  #                                        | slow_links | stragglers | churn | custom
  c.network.mode = placeholder(str)      # sync | async (gasloc, noloco: replayed pairwise gossip)
  c.network.local_work = placeholder(str)  # each worker's local steps H_i per round: steps (H
  #   each, or algorithm.local_steps) | time (floor(H mean_j c_j / c_i)) | auto (max(floor(H
  #   min_j c_j / c_i), ceil(x_i / c_i)): rounds of the fastest worker's H steps, and long
  #   enough to hide the worker's exchange; c_i step seconds, x_i exchange seconds over i's
  #   median neighbour link). sync: at most H, the rest of the round idle (the clock
  #   charges it as idle); async: rounds of H_i steps between a worker's exchanges
  c.network.peer_choice = placeholder(str)  # async: ready (any waiting neighbour) | sampled (a random one, waited for)
  #   | rotation (exchange r with the partner of matching r mod k of an edge colouring:
  #   every neighbour once in every k own rounds; k = M - 1 on the complete graph, M even)
  c.network.step_seconds = placeholder(float)  # seconds per inner step; None: FLOPs / (device_flops x mfu)
  c.network.device_flops = placeholder(float)  # a worker's peak FLOP/s (100e12)
  c.network.mfu = placeholder(float)           # fraction of the peak a step reaches (0.4)
  c.network.speeds = placeholder(list)         # per-worker relative compute speeds (1: nominal)
  c.network.bandwidth = placeholder(float)     # bytes/s of every link (inside a region): 12.5e9
  c.network.latency = placeholder(float)       # seconds per hop (1e-4)
  c.network.link_efficiency = placeholder(float)  # calibration, off by default (None: 1): the
  #   fraction of every link's bandwidth a collective's payload reaches (framing, the
  #   collective library); measured by python -m loco.calibrate (docs/calibration.md)
  c.network.regions = placeholder(int)         # multi_region: regions (contiguous worker blocks)
  c.network.inter_bandwidth = placeholder(float)  # multi_region: bytes/s between regions
  c.network.inter_latency = placeholder(float)    # multi_region: seconds between regions
  c.network.sigma = placeholder(float)         # lognormal: std of log link bandwidth
  c.network.slow_workers = placeholder(int)    # slow_links: workers whose links are slow
  c.network.slow_factor = placeholder(float)   # slow_links: how many times slower
  c.network.bandwidth_matrix = placeholder(list)  # custom: [M][M] bytes/s
  c.network.latency_matrix = placeholder(list)    # custom: [M][M] seconds
  c.network.straggler_fraction = placeholder(float)  # fraction of workers computing slower
  c.network.straggler_factor = placeholder(float)    # ... this many times slower
  c.network.churn = placeholder(list)          # [[worker, leave_step, rejoin_step], ...]
  c.network.dropout = placeholder(float)       # probability a worker drops out of a round
  c.network.dropout_mode = placeholder(str)    # what an absent worker does at a sync:
  #   keep_local (default; the DiLoCo paper's dropped outer gradients: not sent, it receives
  #   the new anchor, keeps its own params and trains on) | offline (cut off: sends and
  #   receives nothing, keeps its whole state, catches up at its next sync) | discard (it
  #   adopts the others' result; its round's steps are lost)
  c.network.seed = placeholder(int)            # random links, stragglers, dropout, async peers
  c.network.overlap = placeholder(str)         # what communication overlaps. sync (the clock):
  #   none (default; a collective starts after the step's compute) | backward (it overlaps
  #   the step's backward pass per layer, as loco.overlap_model models it, arXiv 2501.18512
  #   section 3.1; tau > 0 fragments as none). async: compute (default; a worker keeps
  #   computing while its exchange is in flight and merges the partner's stale model on
  #   arrival, arXiv 2606.11081) | none (it waits for the exchange)
  c.network.overlap_buckets = placeholder(int)  # backward: pieces a collective is cut into,
  #   each paying the ring's latency (128, loco.overlap_model's K; 1: as none)

  c.eval = config_dict.ConfigDict()
  c.eval.every = 100                # steps between evaluations (multiple of log_every)
  c.eval.batches = 8                # validation batches per evaluation
  c.eval.batch_size = 16            # sequences per validation batch
  c.eval.per_worker = True          # also evaluate each worker's own params (eval_loss_workers)

  c.log_every = 10                  # steps per jitted chunk and per metrics line
  c.progress = True                 # terminal progress bar

  # Where metrics rows go besides metrics.jsonl (the record) and TensorBoard
  # (workdir/tensorboard/): loco/files/metrics.py sinks. Logging only: may change on resume.
  c.metrics = config_dict.ConfigDict()
  c.metrics.wandb_project = placeholder(str)  # W&B project; None: no W&B (pip install -e '.[wandb]')
  c.metrics.wandb_entity = placeholder(str)   # W&B team or user; None: the account's default
  c.metrics.wandb_mode = placeholder(str)     # offline (None; files in workdir/wandb/, no
                                              # network) | online | disabled (no W&B)
  c.metrics.diagnostics = True      # drift at every sync of an algorithm with rounds:
  #   pg_norm, pg_mean_norm, pg_cosine, consensus_distance in the rows (loco/comm/drift.py;
  #   the mean over the row's syncs). Off: on a mesh the program holds no all-reduce but
  #   the algorithm's own (the diagnostics reduce over the worker axis)

  c.checkpoint = config_dict.ConfigDict()
  c.checkpoint.every = 100          # steps between checkpoints (multiple of log_every); 0: only at the end
  c.checkpoint.keep = 2             # checkpoints kept

  # How per-worker gradients are computed: vmap (one batched computation), map (one
  # worker after another; cache-friendly, faster on CPU), auto (map on CPU without a mesh).
  c.grad_mode = 'auto'

  c.mesh = config_dict.ConfigDict()
  c.mesh.workers = 1                # devices the worker axis is sharded over; 1: vmap on one device
  c.mesh.fsdp = 1                   # devices each worker's state and batch are sharded over (FSDP)
  # Slices (TPU slices, GPU islands) the worker axis spans: mesh.workers is split into this
  # many groups, each inside one slice, so only worker-axis collectives cross the slow
  # network and each fsdp row stays inside a slice. Devices without a slice_index
  # (CPU, simulated) are split into equal groups in listing order.
  c.mesh.slices = 1
  return c
