"""Compression operators with exact payload accounting, and error feedback.

A `Compressor` (base.py) is an optax transformation over ONE worker's tree (it runs
inside the engine's per-worker map) mapping updates to their **decoded** compressed
value, what the receivers reconstruct; its state holds the exact payload of its last
update in bits. Its `encode` returns the whole `Message`: the decoded tree, the mask
of sent coordinates (None when all were) and the index, value and metadata bits. The
compressed collectives (`loco.comm.sparse`) take a compressor and call `encode`, so
they count the bytes that travel and know who sent which coordinate.

Bits are counted as a real encoder puts them on the wire (DESIGN §5), where each
concept codes them: values at their width, an index at the width its chunk needs,
every scale, shift and codebook entry at 32 bits; static Python ints at trace time.
The modules::

  chunking.py   tiles and chunks of the SparseLoCo reference code
  sparsify.py   topk_chunks (SparseLoCo/DeMo tiles), topk_global, random_k
  quantize.py   identity, uniform (b-bit; stochastic with a per-worker dither),
                binned (SparseLoCo's 2-bit codebook), e3m0 (4-bit float), e4m3 (8-bit)
  compose.py    then(sparsifier, quantizer); by_name('none' | '2bit' | 'int8' | ...)
  feedback.py   error_feedback(compressor, beta)
"""

from loco.comm.compress.base import Compressor, CompressState, Message
from loco.comm.compress.chunking import chunk_k, largest_divisor_at_most
from loco.comm.compress.compose import CODECS, ComposedState, by_name, then
from loco.comm.compress.feedback import ErrorFeedbackState, error_feedback
from loco.comm.compress.quantize import binned, e3m0, e4m3, identity, uniform
from loco.comm.compress.sparsify import RandomKState, Selection, random_k, topk_chunks, topk_global
