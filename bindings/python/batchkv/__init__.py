"""batchkv - Python bindings of libbatchkv (ctypes over the shared library).

libbatchkv decides, for an LLM inference runtime (the host), which tokens run
in each iteration and where every sequence's KV cache lives. This package is
its whole public API in Python:

    Pool             the block-paged KV pool: sequences, fork/CoW, prefix
                     cache, swap, copy lists, stats, KV events, export/import
    KvGroup, kv_seq_bytes, frames_for_bytes, ...   KV sizing of hybrid models
    Scheduler        requests, step(), the host callbacks, stats, metrics;
                     adapter_cache_key: the pool key of an adapter's blocks;
                     encoder_token: the ids an encoder input's span holds;
                     Scheduler(connector=...) and xfer_done: a KV connector
                     (an external store loaded from and saved to);
                     batchkv.overlap (token_pending_at, resolve_placeholders,
                     ...): overlapped scheduling's placeholders by back
                     distance and row
    Batch            what a compute callback receives: zero-copy numpy views
                     of the library's arrays, VALID ONLY DURING THE CALLBACK
    BatchGroup       one KV group's part of a Batch (Batch.groups): its slot
                     mapping and the blocks each row reads in it
    PolyCost, RooflineCost, CalibratedCost   the built-in cost models
    VllmEncoder      the pool's KV events as vLLM KVEventBatch msgpack bytes
                     (what vLLM-event routers such as llm-d and Dynamo read);
                     vllm_block_hashes, vllm_hash_int: vLLM's block hashes
    BkvError and one subclass per status code (batchkv.errors)

Minimal use (examples/python/minimal.py is the complete program):

    class Host:
        def forward(self, batch, next_tokens):
            last = batch.token_ids[batch.qo_indptr[1:] - 1]
            next_tokens[:] = np.where(batch.row_sample != 0, last + 1, 0)
        def on_token(self, req, branch, token, user): print(req, token)

    pool = batchkv.Pool(device_blocks=64)
    sched = batchkv.Scheduler(pool, Host())
    sched.submit([100, 101, 102], max_new_tokens=4)
    sched.run()

The library is found at $BATCHKV_LIBRARY, where meson installed it, or on the
dynamic linker's path (see batchkv._ffi.load). Thread rules are the header's:
see batchkv.sched.
"""
from ._ffi import BKV_VERSION_STRING as __version__  # noqa: F401
from ._native import _lib
from .cost import (CalibConfidence, CalibratedCost, CallKind, PolyCost, RooflineCost,  # noqa: F401
                   RooflinePreset, StepShape)
from .errors import (ERRORS, BkvError, HostError, InvalidArgumentError,  # noqa: F401
                     NoSpaceError, NotFoundError, OutOfMemoryError, StateError, TooBigError,
                     TryAgainError, last_error, strerror)
from .pool import (BlockInfo, BlockState, CopyKind, EventKind, GroupKind, KvEvent,  # noqa: F401
                   KvGroup, ModelShape, Pool, PoolMemory, PoolStats, SeqImage, SeqInfo,
                   block_hashes, blocks_for_bytes, frames_for_bytes, kv_bytes_per_token,
                   kv_frame_bytes, kv_group_blocks_held, kv_group_page_bytes, kv_seq_bytes,
                   kv_state_frames)
from .sched import (TOKEN_FAIL, Batch, BatchGroup, BatchLayout, FinishReason,  # noqa: F401
                    Policy, Preempt, SchedStats, Scheduler, StepInfo, StepOutputs,
                    ENCODE_DTYPE, XFER_BLOCK_DTYPE, CONNECTOR_LATER, adapter_cache_key,
                    encoder_token)
from .overlap import (OVERLAP_MAX_DEPTH, resolve_placeholders, token_is_pending,  # noqa: F401
                      token_pending_at, token_pending_back, token_pending_row)
from .vllm import (VllmEncoder, VllmHash, VllmWire, vllm_block_hashes,  # noqa: F401
                   vllm_hash_int)


def version():
    """bkv_version(): the version string the loaded library was built with."""
    return _lib.bkv_version().decode()
