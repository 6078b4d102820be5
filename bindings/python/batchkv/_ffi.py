"""batchkv._ffi - the raw ctypes declarations of include/batchkv.h.

Hand-kept mirror of the header: one ctypes Structure per public struct (same
name, same fields in order), the enum values and status codes as integers, and
FUNCTIONS, the restype and argtypes of every BKV_API function. Nothing here is
Pythonic; the package (batchkv/__init__.py and friends) builds on it.
bindings/tools/check_bindings.py fails when this file and the header disagree
(a function or field added, removed or retyped), and tests/test_layout.py
compares every size and offset with the C compiler's.

Opaque handles (bkv_pool *, bkv_sched *, bkv_cost_calib *, bkv_vllm_encoder *)
are c_void_p.
Enum-typed fields and parameters are c_int (the C enum's size on every ABI the
library builds for).
"""
import ctypes
import ctypes.util
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_int,  # noqa: F401
                    c_int32, c_int64, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)

BKV_OK = 0
BKV_EINVAL = -1
BKV_ENOMEM = -2
BKV_ENOSPC = -3
BKV_E2BIG = -4
BKV_EAGAIN = -5
BKV_ENOENT = -6
BKV_EHOST = -7
BKV_ESTATE = -8
BKV_VERSION_MAJOR = 0
BKV_VERSION_MINOR = 1
BKV_VERSION_PATCH = 0
BKV_MAX_TOKEN_SLOTS = 2147483648
BKV_MAX_GROUPS = 8
BKV_COST_CALIB_FEATURES = 9
BKV_COST_CALIB_MIN_OBS = 16
BKV_TOKEN_FAIL = -1
BKV_VERSION_STRING = "0.1.0"
BKV_COPY_DEVICE = 0
BKV_COPY_SWAP_OUT = 1
BKV_COPY_SWAP_IN = 2
BKV_BLOCK_FREE = 0
BKV_BLOCK_PINNED = 1
BKV_BLOCK_CACHED = 2
BKV_GROUP_FULL = 0
BKV_GROUP_WINDOW = 1
BKV_GROUP_CHUNKED = 2
BKV_GROUP_STATE = 3
BKV_CALL_MIXED = 0
BKV_CALL_PREFILL = 1
BKV_CALL_DECODE = 2
BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16 = 0
BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16 = 1
BKV_ROOFLINE_A100_80GB_OPT_13B_FP16 = 2
BKV_ROOFLINE_PRESET_COUNT = 3
BKV_FINISH_LENGTH = 0
BKV_FINISH_STOP = 1
BKV_FINISH_ABORT = 2
BKV_FINISH_ERROR = 3
BKV_POLICY_CONTINUOUS = 0
BKV_POLICY_STATIC = 1
BKV_PREEMPT_AUTO = 0
BKV_PREEMPT_RECOMPUTE = 1
BKV_PREEMPT_SWAP = 2
BKV_RELEASE_REFUSE = 0
BKV_RELEASE_RECOMPUTE = 1
BKV_RELEASE_SWAP = 2
BKV_EVICT_LRU = 0
BKV_EVICT_VALUE = 1
BKV_EVICT_SEGMENTED = 2
BKV_VICTIM_RECENT = 0
BKV_VICTIM_COST = 1
BKV_RESERVE_PROMPT = 0
BKV_RESERVE_OUTPUT = 1
BKV_BATCH_FLAT = 0
BKV_BATCH_PERSISTENT = 1
BKV_SPEC_DRAFT_NGRAM = 0
BKV_SPEC_DRAFT_HOST = 1
BKV_SPEC_K_AUTO = 0
BKV_SPEC_K_FIXED = 1
BKV_SPEC_MAX_K = 16
BKV_MAX_ADAPTERS = 1024
BKV_CONNECTOR_LATER = -2147483648  # bkv_connector.lookup: ask again later
BKV_MAX_ENCODER_INPUTS = 64
BKV_TOKEN_PENDING_ROWS = 1 << 18
BKV_OVERLAP_MAX_DEPTH = 8
BKV_TABLE_OPENED = 0x1
BKV_TABLE_CLOSED = 0x2
BKV_EVENT_STORED = 0
BKV_EVENT_REMOVED = 1
BKV_EVENT_CLEARED = 2
BKV_MEDIUM_DEVICE = 0
BKV_MEDIUM_HOST = 1
BKV_MEDIUM_EXTERNAL = 2
BKV_VLLM_WIRE_MAP = 0
BKV_VLLM_WIRE_ARRAY = 1
BKV_VLLM_WIRE_ARRAY_V0 = 2
BKV_VLLM_HASH_NATIVE = 0
BKV_VLLM_HASH_SHA256_CBOR = 1
BKV_VLLM_HASH_SHA256 = 2
BKV_VLLM_DIGEST_BYTES = 32


class bkv_allocator(Structure):
    _fields_ = [
        ('alloc', CFUNCTYPE(c_void_p, c_void_p, c_size_t)),
        ('realloc', CFUNCTYPE(c_void_p, c_void_p, c_void_p, c_size_t, c_size_t)),
        ('free', CFUNCTYPE(None, c_void_p, c_void_p, c_size_t)),
        ('ud', c_void_p),
    ]


class bkv_model_shape(Structure):
    _fields_ = [
        ('layers', c_uint32),
        ('kv_heads', c_uint32),
        ('head_dim', c_uint32),
        ('dtype_bytes', c_uint32),
    ]


class bkv_kv_group(Structure):
    _fields_ = [
        ('kind', c_uint32),
        ('layers', c_uint32),
        ('span', c_uint32),
        ('reserved', c_uint32),
        ('bytes', c_uint64),
    ]


class bkv_pool_config(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('block_tokens', c_uint32),
        ('device_blocks', c_uint32),
        ('host_blocks', c_uint32),
        ('max_seqs', c_uint32),
        ('watermark_blocks', c_uint32),
        ('prefix_cache', c_int),
        ('hash_seed', c_uint64),
        ('event_capacity', c_uint32),
        ('pin_permille', c_uint32),
        ('host_cache', c_uint32),
        ('reserved', c_uint32),
        ('n_groups', c_uint32),
        ('state_units', c_uint32),
        ('groups', POINTER(bkv_kv_group)),
        ('state_share', c_uint32),
        ('state_pad', c_uint32),
    ]


class bkv_pool_stats(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('block_tokens', c_uint32),
        ('device_blocks', c_uint32),
        ('host_blocks', c_uint32),
        ('nr_free', c_uint32),
        ('nr_used', c_uint32),
        ('nr_cached', c_uint32),
        ('nr_indexed', c_uint32),
        ('host_free', c_uint32),
        ('host_used', c_uint32),
        ('nr_seqs', c_uint32),
        ('nr_swapped', c_uint32),
        ('tokens', c_uint64),
        ('waste_slots', c_uint64),
        ('hit_tokens', c_uint64),
        ('miss_tokens', c_uint64),
        ('evictions', c_uint64),
        ('cow_copies', c_uint64),
        ('swap_out_blocks', c_uint64),
        ('swap_in_blocks', c_uint64),
        ('events', c_uint64),
        ('events_dropped', c_uint64),
        ('dup_blocks', c_uint64),
        ('state_units', c_uint32),
        ('state_free', c_uint32),
        ('state_checkpoints', c_uint32),
        ('state_frames', c_uint32),
        ('state_hits', c_uint64),
        ('state_evictions', c_uint64),
        ('host_cached', c_uint32),
        ('host_demoting', c_uint32),
        ('host_demoted', c_uint64),
        ('host_kept', c_uint64),
        ('host_skipped', c_uint64),
        ('host_hit_blocks', c_uint64),
        ('host_evictions', c_uint64),
        ('n_groups', c_uint32),
        ('group_used', c_uint32 * 8),
        ('group_cached', c_uint32 * 8),
    ]


class bkv_pool_memory(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('block_bytes', c_uint32),
        ('seq_slot_bytes', c_uint32),
        ('index_slots', c_uint32),
        ('index_used', c_uint32),
        ('reserved', c_uint32),
        ('blocks', c_uint64),
        ('device_tokens', c_uint64),
        ('index', c_uint64),
        ('txn_queue', c_uint64),
        ('txn_owners', c_uint64),
        ('check_scratch', c_uint64),
        ('host', c_uint64),
        ('seq_slots', c_uint64),
        ('block_tables', c_uint64),
        ('copy_lists', c_uint64),
        ('event_ring', c_uint64),
        ('total', c_uint64),
    ]


class bkv_block_info(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('state', c_int),
        ('ref_count', c_uint32),
        ('fill', c_uint32),
        ('indexed', c_int),
        ('copy_pending', c_int),
        ('kids', c_uint32),
        ('parent', c_int32),
        ('key', c_uint64),
        ('hash', c_uint64),
        ('tokens', POINTER(c_int32)),
    ]


class bkv_copy(Structure):
    _fields_ = [
        ('src', c_int32),
        ('dst', c_int32),
    ]


class bkv_seq_info(Structure):
    _fields_ = [
        ('len', c_uint32),
        ('n_blocks', c_uint32),
        ('swapped', c_int),
        ('key', c_uint64),
    ]


class bkv_chunk_shape(Structure):
    _fields_ = [
        ('len', c_uint32),
        ('start', c_uint32),
    ]


class bkv_step_shape(Structure):
    _fields_ = [
        ('kind', c_int),
        ('decode_rows', c_uint32),
        ('decode_context', c_uint64),
        ('n_chunks', c_uint32),
        ('chunks', POINTER(bkv_chunk_shape)),
        ('padded_rows', c_uint32),
        ('n_groups', c_uint32),
        ('group_decode_context', POINTER(c_uint64)),
        ('decode_drafts', c_uint32),
    ]


class bkv_cost_model(Structure):
    _fields_ = [
        ('step_us', CFUNCTYPE(c_double, c_void_p, POINTER(bkv_step_shape))),
        ('observe', CFUNCTYPE(None, c_void_p, POINTER(bkv_step_shape), c_double)),
        ('ctx', c_void_p),
    ]


class bkv_cost_poly(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('a', c_double),
        ('b', c_double),
        ('c', c_double),
        ('kappa', c_double),
        ('rows_ref', c_double),
        ('packed', c_int),
        ('d0', c_double),
        ('d1', c_double),
        ('d2', c_double),
        ('reserved', c_uint32 * 4),
    ]


class bkv_cost_roofline(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('name', c_char_p),
        ('peak_flops', c_double),
        ('mem_bw', c_double),
        ('model_bytes', c_double),
        ('active_params', c_double),
        ('kv_bytes_per_token', c_double),
        ('attn_flops_per_pair', c_double),
        ('flops_eff', c_double),
        ('mem_eff', c_double),
        ('overhead_us', c_double),
        ('reserved', c_uint32 * 4),
        ('n_groups', c_uint32),
        ('groups', POINTER(bkv_kv_group)),
    ]


class bkv_cost_calib_confidence(Structure):
    _fields_ = [
        ('size', c_size_t),
        ('n_eff', c_double),
        ('scale_fit', c_double),
        ('scale_base', c_double),
        ('level', c_double),
        ('trusted', c_int),
        ('uses_fit', c_int),
    ]


class bkv_table_delta(Structure):
    _fields_ = [
        ('slot', c_uint32),
        ('start', c_uint32),
        ('n', c_uint32),
        ('len', c_uint32),
        ('flags', c_uint32),
    ]


class bkv_batch_group(Structure):
    _fields_ = [
        ('kind', c_uint32),
        ('span', c_uint32),
        ('slot_mapping', POINTER(c_int32)),
        ('kv_indptr', POINTER(c_int32)),
        ('kv_indices', POINTER(c_int32)),
        ('kv_first_block', POINTER(c_int32)),
        ('row_tables', POINTER(POINTER(c_int32))),
        ('row_table_len', POINTER(c_uint32)),
        ('state_in', POINTER(c_int32)),
        ('state_out', POINTER(c_int32)),
        ('state_frames', c_uint32),
        ('state_out_spec', POINTER(c_int32)),
    ]


class bkv_encode(Structure):
    _fields_ = [
        ('cache_id', c_uint64),
        ('req', c_uint64),
        ('user', c_void_p),
        ('input', c_uint32),
        ('len', c_uint32),
    ]


class bkv_batch(Structure):
    _fields_ = [
        ('kind', c_int),
        ('n_rows', c_uint32),
        ('n_decode_rows', c_uint32),
        ('n_tokens', c_uint32),
        ('block_tokens', c_uint32),
        ('token_ids', POINTER(c_int32)),
        ('positions', POINTER(c_int32)),
        ('qo_indptr', POINTER(c_int32)),
        ('kv_indptr', POINTER(c_int32)),
        ('kv_indices', POINTER(c_int32)),
        ('kv_last_page_len', POINTER(c_int32)),
        ('slot_mapping', POINTER(c_int32)),
        ('row_sample', POINTER(c_uint8)),
        ('row_req', POINTER(c_uint64)),
        ('row_branch', POINTER(c_uint32)),
        ('row_user', POINTER(c_void_p)),
        ('n_copies', c_uint32),
        ('copies', POINTER(bkv_copy)),
        ('n_swap_out', c_uint32),
        ('swap_out', POINTER(bkv_copy)),
        ('n_swap_in', c_uint32),
        ('swap_in', POINTER(bkv_copy)),
        ('layout', c_int),
        ('n_row_slots', c_uint32),
        ('row_slot', POINTER(c_uint32)),
        ('row_tables', POINTER(POINTER(c_int32))),
        ('row_table_len', POINTER(c_uint32)),
        ('n_table_deltas', c_uint32),
        ('table_deltas', POINTER(bkv_table_delta)),
        ('delta_blocks', POINTER(c_int32)),
        ('n_groups', c_uint32),
        ('groups', POINTER(bkv_batch_group)),
        ('n_spec_rows', c_uint32),
        ('row_drafts', POINTER(c_uint32)),
        ('spec_tokens', POINTER(c_int32)),
        ('n_accepted', POINTER(c_int32)),
        ('row_adapter', POINTER(c_uint32)),
        ('n_adapters', c_uint32),
        ('adapters', POINTER(c_uint32)),
        ('n_encode', c_uint32),
        ('encode', POINTER(bkv_encode)),
        ('n_encoder_free', c_uint32),
        ('encoder_free', POINTER(c_uint64)),
    ]


class bkv_host_ops(Structure):
    _fields_ = [
        ('forward', CFUNCTYPE(c_int, c_void_p, POINTER(bkv_batch), POINTER(c_int32))),
        ('prefill', CFUNCTYPE(c_int, c_void_p, POINTER(bkv_batch), POINTER(c_int32))),
        ('decode', CFUNCTYPE(c_int, c_void_p, POINTER(bkv_batch), POINTER(c_int32))),
        ('on_token', CFUNCTYPE(None, c_void_p, c_uint64, c_uint32, c_int32, c_void_p)),
        ('on_finish', CFUNCTYPE(None, c_void_p, c_uint64, c_int, c_void_p)),
        ('now_us', CFUNCTYPE(c_uint64, c_void_p)),
        ('draft', CFUNCTYPE(c_int, c_void_p, c_uint64, c_uint32, POINTER(c_int32), c_uint32,
                            POINTER(c_int32), c_uint32, c_void_p)),
        ('launch', CFUNCTYPE(c_int, c_void_p, POINTER(bkv_batch), POINTER(c_int32))),
    ]


class bkv_kv_xfer_block(Structure):
    _fields_ = [
        ('hash', c_uint64),
        ('index', c_uint32),
        ('group', c_uint32),
        ('block', c_int32),
        ('frames', c_uint32),
    ]


class bkv_connector(Structure):
    _fields_ = [
        ('lookup', CFUNCTYPE(c_int, c_void_p, c_uint64, POINTER(c_uint64), c_uint32)),
        ('load', CFUNCTYPE(c_int, c_void_p, c_uint64, c_uint64, POINTER(bkv_kv_xfer_block),
                           c_uint32)),
        ('save', CFUNCTYPE(c_int, c_void_p, c_uint64, POINTER(bkv_kv_xfer_block), c_uint32)),
        ('preempted', CFUNCTYPE(None, c_void_p, c_uint64)),
        ('user', c_void_p),
        ('save_blocks', c_uint32),
        ('max_saves', c_uint32),
        ('contains', CFUNCTYPE(c_int, c_void_p, c_uint64)),
    ]


class bkv_sched_config(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('policy', c_int),
        ('max_running', c_uint32),
        ('admit_group', c_uint32),
        ('max_wait_us', c_uint64),
        ('chunked_prefill', c_int),
        ('token_budget', c_uint32),
        ('max_queue', c_uint32),
        ('preempt', c_int),
        ('host_link_bytes_per_us', c_double),
        ('kv_bytes_per_token', c_uint64),
        ('tpot_target_us', c_uint32),
        ('cost', bkv_cost_model),
        ('max_bypass_us', c_uint64),
        ('batch_layout', c_int),
        ('ttft_target_us', c_uint32),
        ('spec_max_k', c_uint32),
        ('spec_k_mode', c_int),
        ('spec_drafts', c_int),
        ('overlap', c_uint32),
        ('evict', c_int),
        ('victim', c_int),
        ('admit_reserve', c_int),
        ('retention', c_uint32),
        ('copy_overlap', c_uint32),
        ('prefill_first', c_uint32),
        ('max_adapters', c_uint32),
        ('pad0', c_uint32),
        ('adapter_wait_us', c_uint64),
        ('encoder_cache', c_uint32),
        ('encoder_budget', c_uint32),
        ('pad1', c_uint32),
        ('connector', POINTER(bkv_connector)),
    ]


class bkv_retention_range(Structure):
    _fields_ = [
        ('token_start', c_uint32),
        ('token_end', c_uint32),
        ('priority', c_uint32),
        ('pad', c_uint32),
        ('duration_us', c_uint64),
    ]


class bkv_encoder_input(Structure):
    _fields_ = [
        ('cache_id', c_uint64),
        ('token_start', c_uint32),
        ('token_len', c_uint32),
        ('cost', c_uint32),
        ('pad', c_uint32),
    ]


class bkv_request(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('prompt', POINTER(c_int32)),
        ('prompt_len', c_uint32),
        ('max_new_tokens', c_uint32),
        ('stop_tokens', POINTER(c_int32)),
        ('n_stop', c_uint32),
        ('priority', c_int32),
        ('cache_key', c_uint64),
        ('n', c_uint32),
        ('predicted_output', c_uint32),
        ('user', c_void_p),
        ('retention', POINTER(bkv_retention_range)),
        ('n_retention', c_uint32),
        ('adapter', c_uint32),
        ('n_inputs', c_uint32),
        ('inputs', POINTER(bkv_encoder_input)),
    ]


class bkv_step_info(Structure):
    _fields_ = [
        ('rows', c_uint32),
        ('prefill_tokens', c_uint32),
        ('decode_tokens', c_uint32),
        ('hit_tokens', c_uint32),
        ('prefill_calls', c_uint32),
        ('decode_calls', c_uint32),
        ('admitted', c_uint32),
        ('finished', c_uint32),
        ('preempted', c_uint32),
        ('running', c_uint32),
        ('waiting', c_uint32),
        ('predicted_us', c_double),
        ('measured_us', c_double),
    ]


class bkv_step_outputs(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('n_tokens', c_uint32),
        ('token_req', POINTER(c_uint64)),
        ('token_branch', POINTER(c_uint32)),
        ('token_ids', POINTER(c_int32)),
        ('n_finished', c_uint32),
        ('finished_req', POINTER(c_uint64)),
        ('finished_reason', POINTER(c_int32)),
    ]


class bkv_sched_stats(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('waiting', c_uint32),
        ('running', c_uint32),
        ('swapped', c_uint32),
        ('steps', c_uint64),
        ('failed_steps', c_uint64),
        ('submitted', c_uint64),
        ('finished', c_uint64),
        ('aborted', c_uint64),
        ('prefill_tokens', c_uint64),
        ('decode_tokens', c_uint64),
        ('hit_tokens', c_uint64),
        ('preemptions', c_uint64),
        ('swaps', c_uint64),
        ('prefill_calls', c_uint64),
        ('decode_calls', c_uint64),
        ('busy_us', c_double),
        ('unadmittable', c_uint64),
        ('spec_rows', c_uint64),
        ('spec_drafted', c_uint64),
        ('spec_accepted', c_uint64),
        ('overlap_steps', c_uint64),
        ('overlap_syncs', c_uint64),
        ('overlap_wasted_tokens', c_uint64),
        ('spec_skipped_rows', c_uint64),
        ('overlap_spec_waits', c_uint64),
        ('overlap_spec_undrafted', c_uint64),
        ('overlap_spec_idle', c_uint64),
        ('adapter_passes', c_uint64),
        ('encoder_lookups', c_uint64),
        ('encoder_hits', c_uint64),
        ('encoder_runs', c_uint64),
        ('encoder_evictions', c_uint64),
        ('kv_waiting', c_uint32),
        ('kv_save_held', c_uint32),
        ('kv_lookups', c_uint64),
        ('kv_lookup_errors', c_uint64),
        ('kv_loads', c_uint64),
        ('kv_load_tokens', c_uint64),
        ('kv_load_failed', c_uint64),
        ('kv_saved', c_uint64),
        ('kv_save_failed', c_uint64),
    ]


class bkv_kv_event(Structure):
    _fields_ = [
        ('seq', c_uint64),
        ('hash', c_uint64),
        ('parent_hash', c_uint64),
        ('key', c_uint64),
        ('kind', c_uint32),
        ('token_count', c_uint32),
        ('block', c_int32),
        ('has_parent', c_uint32),
        ('medium', c_uint32),
        ('reserved', c_uint32),
    ]


class bkv_seq_image(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('block_tokens', c_uint32),
        ('len', c_uint32),
        ('n_blocks', c_uint32),
        ('key', c_uint64),
        ('hash_seed', c_uint64),
        ('blocks', POINTER(c_int32)),
        ('hashes', POINTER(c_uint64)),
        ('tokens', POINTER(c_int32)),
        ('cap_blocks', c_uint32),
        ('cap_tokens', c_uint32),
        ('n_groups', c_uint32),
        ('state_frames', c_uint32),
        ('group_blocks', POINTER(c_int32)),
        ('state_frame', c_int32),
        ('reserved', c_uint32),
        ('group_layout', c_uint64),
    ]


# typedef const char *(*bkv_vllm_key_name_fn)(void *ud, uint64_t key): the
# restype is c_void_p, not c_char_p, because ctypes cannot hand a string back
# from a Python callback without leaking it; batchkv.vllm returns the address
# of a buffer it keeps until bkv_vllm_encoder_drain returns.
bkv_vllm_key_name_fn = CFUNCTYPE(c_void_p, c_void_p, c_uint64)


class bkv_vllm_config(Structure):
    _fields_ = [
        ('size', c_uint32),
        ('wire', c_uint32),
        ('hash', c_uint32),
        ('int_hashes', c_uint32),
        ('hash_seed', c_char_p),
        ('medium', c_char_p),
        ('data_parallel_rank', c_int32),
        ('group_idx', c_int32),
        ('spec_kind', c_char_p),
        ('sliding_window', c_uint32),
        ('extra_keys', c_uint32),
        ('key_name', bkv_vllm_key_name_fn),
        ('key_name_ud', c_void_p),
        ('host_medium', c_char_p),
        ('reserved', c_uint32 * 2),
    ]

FUNCTIONS = {
    'bkv_strerror': (c_char_p, [c_int]),
    'bkv_last_error': (c_char_p, []),
    'bkv_version': (c_char_p, []),
    'bkv_kv_bytes_per_token': (c_uint64, [POINTER(bkv_model_shape)]),
    'bkv_blocks_for_bytes': (c_uint32, [c_uint64, POINTER(bkv_model_shape), c_uint32]),
    'bkv_kv_group_page_bytes': (c_uint64, [POINTER(bkv_kv_group), c_uint32]),
    'bkv_kv_frame_bytes': (c_uint64, [POINTER(bkv_kv_group), c_uint32, c_uint32]),
    'bkv_kv_state_frames': (c_uint32, [POINTER(bkv_kv_group), c_uint32, c_uint32]),
    'bkv_kv_group_blocks_held': (c_uint64, [POINTER(bkv_kv_group), c_uint32, c_uint64]),
    'bkv_kv_seq_bytes': (c_uint64, [POINTER(bkv_kv_group), c_uint32, c_uint32, c_uint64]),
    'bkv_frames_for_bytes': (c_uint32, [c_uint64, POINTER(bkv_kv_group), c_uint32, c_uint32]),
    'bkv_pool_config_init': (None, [POINTER(bkv_pool_config)]),
    'bkv_pool_create': (c_int, [POINTER(bkv_pool_config), POINTER(bkv_allocator), POINTER(c_void_p)]),
    'bkv_pool_destroy': (None, [c_void_p]),
    'bkv_seq_open': (c_int, [c_void_p, POINTER(c_uint32)]),
    'bkv_seq_open_keyed': (c_int, [c_void_p, c_uint64, POINTER(c_uint32)]),
    'bkv_seq_append': (c_int, [c_void_p, c_uint32, POINTER(c_int32), c_uint32, POINTER(c_uint32)]),
    'bkv_seq_blocks_needed': (c_int64, [c_void_p, c_uint32, c_uint32]),
    'bkv_seq_truncate': (c_int, [c_void_p, c_uint32, c_uint32]),
    'bkv_seq_fork': (c_int, [c_void_p, c_uint32, POINTER(c_uint32)]),
    'bkv_seq_close': (c_int, [c_void_p, c_uint32]),
    'bkv_seq_drop': (c_int, [c_void_p, c_uint32]),
    'bkv_seq_blocks': (POINTER(c_int32), [c_void_p, c_uint32, POINTER(c_uint32)]),
    'bkv_seq_group_blocks': (POINTER(c_int32), [c_void_p, c_uint32, c_uint32, POINTER(c_uint32)]),
    'bkv_seq_state_frames': (c_int, [c_void_p, c_uint32, POINTER(c_int32), POINTER(c_int32)]),
    'bkv_seq_info_get': (c_int, [c_void_p, c_uint32, POINTER(bkv_seq_info)]),
    'bkv_seq_swap_out': (c_int, [c_void_p, c_uint32]),
    'bkv_seq_swap_in': (c_int, [c_void_p, c_uint32]),
    'bkv_pool_pending_copies': (c_uint32, [c_void_p, c_int, POINTER(POINTER(bkv_copy))]),
    'bkv_pool_clear_copies': (None, [c_void_p, c_int]),
    'bkv_pool_available': (c_uint32, [c_void_p]),
    'bkv_pool_can_admit': (c_int, [c_void_p, c_uint32]),
    'bkv_pool_reset_cache': (c_int, [c_void_p]),
    'bkv_pool_pin_prefix': (c_int, [c_void_p, c_uint64, POINTER(c_int32), c_uint32, POINTER(c_uint32), POINTER(c_uint32)]),
    'bkv_pool_unpin': (c_int, [c_void_p, c_uint32]),
    'bkv_pool_stats_get': (None, [c_void_p, POINTER(bkv_pool_stats)]),
    'bkv_pool_memory_get': (c_int, [c_void_p, POINTER(bkv_pool_memory)]),
    'bkv_block_info_get': (c_int, [c_void_p, c_int32, POINTER(bkv_block_info)]),
    'bkv_pool_check': (c_int, [c_void_p]),
    'bkv_cost_poly_init': (None, [POINTER(bkv_cost_poly)]),
    'bkv_cost_poly_step_us': (c_double, [POINTER(bkv_cost_poly), POINTER(bkv_step_shape)]),
    'bkv_cost_poly_model': (bkv_cost_model, [POINTER(bkv_cost_poly)]),
    'bkv_cost_roofline_init': (c_int, [POINTER(bkv_cost_roofline), c_int]),
    'bkv_cost_roofline_work': (None, [POINTER(bkv_cost_roofline), POINTER(bkv_step_shape), POINTER(c_double), POINTER(c_double)]),
    'bkv_cost_roofline_step_us': (c_double, [POINTER(bkv_cost_roofline), POINTER(bkv_step_shape)]),
    'bkv_cost_roofline_model': (bkv_cost_model, [POINTER(bkv_cost_roofline)]),
    'bkv_cost_calib_create': (c_int, [POINTER(bkv_cost_model), POINTER(bkv_allocator), POINTER(c_void_p)]),
    'bkv_cost_calib_destroy': (None, [c_void_p]),
    'bkv_cost_calib_set_forget': (c_int, [c_void_p, c_double]),
    'bkv_cost_calib_step_us': (c_double, [c_void_p, POINTER(bkv_step_shape)]),
    'bkv_cost_calib_observe': (None, [c_void_p, POINTER(bkv_step_shape), c_double]),
    'bkv_cost_calib_observations': (c_uint64, [c_void_p, c_int]),
    'bkv_cost_calib_coefficients_get': (c_int, [c_void_p, c_int, POINTER(c_double)]),
    'bkv_cost_calib_confidence_get': (c_int, [c_void_p, c_int, POINTER(bkv_cost_calib_confidence)]),
    'bkv_cost_calib_model': (bkv_cost_model, [c_void_p]),
    'bkv_sched_config_init': (None, [POINTER(bkv_sched_config)]),
    'bkv_request_init': (None, [POINTER(bkv_request)]),
    'bkv_encoder_token': (c_int32, [c_uint64, c_uint32]),
    'bkv_adapter_cache_key': (c_uint64, [c_uint64, c_uint32]),
    'bkv_sched_create': (c_int, [POINTER(bkv_sched_config), c_void_p, POINTER(bkv_host_ops), c_void_p, POINTER(bkv_allocator), POINTER(c_void_p)]),
    'bkv_sched_destroy': (None, [c_void_p]),
    'bkv_submit': (c_int, [c_void_p, POINTER(bkv_request), POINTER(c_uint64)]),
    'bkv_abort': (c_int, [c_void_p, c_uint64]),
    'bkv_step': (c_int, [c_void_p, POINTER(bkv_step_info)]),
    'bkv_step_launch': (c_int, [c_void_p, POINTER(c_uint64), POINTER(bkv_step_info)]),
    'bkv_step_complete': (c_int, [c_void_p, c_uint64, c_int, POINTER(bkv_step_info)]),
    'bkv_sched_pending': (c_uint64, [c_void_p]),
    'bkv_sched_stats_get': (None, [c_void_p, POINTER(bkv_sched_stats)]),
    'bkv_sched_kv_release': (c_int, [c_void_p, c_int]),
    'bkv_sched_kv_resume': (c_int, [c_void_p]),
    'bkv_sched_wait': (c_int, [c_void_p, c_uint64]),
    'bkv_sched_wake': (c_int, [c_void_p]),
    'bkv_sched_outputs_enable': (c_int, [c_void_p, c_int]),
    'bkv_sched_outputs_get': (c_int, [c_void_p, POINTER(bkv_step_outputs)]),
    'bkv_sched_check': (c_int, [c_void_p]),
    'bkv_pool_drain_events': (c_uint32, [c_void_p, POINTER(bkv_kv_event), c_uint32]),
    'bkv_block_hashes': (c_uint32, [c_uint64, c_uint64, c_uint32, POINTER(c_int32), c_uint32, POINTER(c_uint64)]),
    'bkv_seq_export': (c_int, [c_void_p, c_uint32, POINTER(bkv_seq_image)]),
    'bkv_seq_import': (c_int, [c_void_p, POINTER(bkv_seq_image), POINTER(c_uint32), POINTER(bkv_copy), POINTER(c_uint32)]),
    'bkv_kv_xfer_done': (c_int, [c_void_p, c_uint64, c_int, POINTER(c_uint32), c_uint32]),
    'bkv_sched_metrics_prometheus': (c_size_t, [c_void_p, c_char_p, c_size_t]),
    'bkv_vllm_config_init': (None, [POINTER(bkv_vllm_config)]),
    'bkv_vllm_encoder_create': (c_int, [POINTER(bkv_vllm_config), c_void_p, POINTER(bkv_allocator), POINTER(c_void_p)]),
    'bkv_vllm_encoder_destroy': (None, [c_void_p]),
    'bkv_vllm_encoder_drain': (c_int, [c_void_p, c_void_p, c_double, POINTER(POINTER(c_uint8)), POINTER(c_size_t)]),
    'bkv_vllm_encoder_resyncs': (c_uint64, [c_void_p]),
    'bkv_vllm_block_hashes': (c_uint32, [POINTER(bkv_vllm_config), c_char_p, c_uint32, POINTER(c_int32), c_uint32, POINTER(c_uint8)]),
    'bkv_vllm_block_hashes_salted': (c_uint32, [POINTER(bkv_vllm_config), c_char_p, c_char_p, c_uint32, POINTER(c_int32), c_uint32, POINTER(c_uint8)]),
    'bkv_vllm_hash_int': (c_uint64, [POINTER(c_uint8)]),
}

# The callback types of bkv_host_ops and bkv_cost_model, by field name.
HOST_FN = dict(bkv_host_ops._fields_)
CONNECTOR_FN = dict(bkv_connector._fields_)
COST_FN = dict(bkv_cost_model._fields_)


def _candidates():
    env = os.environ.get("BATCHKV_LIBRARY")
    if env:
        yield env
        return
    try:
        from . import _build_config  # written by meson install
        yield _build_config.LIBRARY
    except ImportError:
        pass
    found = ctypes.util.find_library("batchkv")
    if found:
        yield found
    yield "libbatchkv.so.0"


def load():
    """Open the shared library and declare every function of FUNCTIONS on it.

    The library is looked for at $BATCHKV_LIBRARY (a path; nothing else is
    tried when it is set), then where `meson install` put it, then by the
    dynamic linker's search (ctypes.util.find_library). Raises OSError naming
    every place tried.
    """
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        for name, (restype, argtypes) in FUNCTIONS.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        return lib
    raise OSError("batchkv: cannot load libbatchkv: tried " + "; ".join(tried))

# Functions of the header the safe layer does not wrap, with the reason (the
# drift guard reads this table).
# Struct fields no test of this binding reaches, with the reason (the drift
# guard reads this table).
FIELDS_UNREACHED = {
    "bkv_allocator": "the allocator hook is not in the safe layer: a Pool or Scheduler "
                     "passes NULL (libc's allocator)",
    "bkv_step_shape.decode_drafts": "priced shapes the Python cost wrappers build carry no "
                                    "drafts; the library fills it for its own pricing",
    "bkv_vllm_config.key_name_ud": "VllmEncoder's key_name is a Python closure: the C user "
                                   "pointer is the encoder's own",
}

UNBOUND = {
}
