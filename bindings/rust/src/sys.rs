//! Raw declarations of `include/batchkv.h`, written by hand (no bindgen, no
//! registry crate). Every name is the C name; every struct is `#[repr(C)]`
//! with the header's fields in order; enums are `c_int` with one constant per
//! value. Two tests keep this file honest: `bindings/tools/check_bindings.py`
//! (the drift guard: every function's parameter and return types, every
//! field's type) and `tests/layout.rs` (every size, alignment and offset
//! against the C compiler's, through `bindings/layout.c`).
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::os::raw::{c_char, c_int, c_void};

pub type bkv_status = c_int;
pub const BKV_OK: bkv_status = 0;
pub const BKV_EINVAL: bkv_status = -1;
pub const BKV_ENOMEM: bkv_status = -2;
pub const BKV_ENOSPC: bkv_status = -3;
pub const BKV_E2BIG: bkv_status = -4;
pub const BKV_EAGAIN: bkv_status = -5;
pub const BKV_ENOENT: bkv_status = -6;
pub const BKV_EHOST: bkv_status = -7;
pub const BKV_ESTATE: bkv_status = -8;
pub const BKV_VERSION_MAJOR: u32 = 0;
pub const BKV_VERSION_MINOR: u32 = 1;
pub const BKV_VERSION_PATCH: u32 = 0;
pub const BKV_MAX_TOKEN_SLOTS: u32 = 2147483648;
pub const BKV_MAX_GROUPS: u32 = 8;
pub const BKV_COST_CALIB_FEATURES: usize = 9;
pub const BKV_COST_CALIB_MIN_OBS: u64 = 16;
pub const BKV_TOKEN_FAIL: i32 = -1;
pub const BKV_VERSION_STRING: &str = "0.1.0";
pub const BKV_VLLM_DIGEST_BYTES: usize = 32;

/// Opaque handle.
#[repr(C)]
pub struct bkv_pool {
    _private: [u8; 0],
}
/// Opaque handle.
#[repr(C)]
pub struct bkv_cost_calib {
    _private: [u8; 0],
}
/// Opaque handle.
#[repr(C)]
pub struct bkv_sched {
    _private: [u8; 0],
}
/// Opaque handle.
#[repr(C)]
pub struct bkv_vllm_encoder {
    _private: [u8; 0],
}

pub type bkv_copy_kind = c_int;
pub const BKV_COPY_DEVICE: bkv_copy_kind = 0;
pub const BKV_COPY_SWAP_OUT: bkv_copy_kind = 1;
pub const BKV_COPY_SWAP_IN: bkv_copy_kind = 2;
pub type bkv_block_state = c_int;
pub const BKV_BLOCK_FREE: bkv_block_state = 0;
pub const BKV_BLOCK_PINNED: bkv_block_state = 1;
pub const BKV_BLOCK_CACHED: bkv_block_state = 2;
pub type bkv_group_kind = c_int;
pub const BKV_GROUP_FULL: bkv_group_kind = 0;
pub const BKV_GROUP_WINDOW: bkv_group_kind = 1;
pub const BKV_GROUP_CHUNKED: bkv_group_kind = 2;
pub const BKV_GROUP_STATE: bkv_group_kind = 3;
pub type bkv_call_kind = c_int;
pub const BKV_CALL_MIXED: bkv_call_kind = 0;
pub const BKV_CALL_PREFILL: bkv_call_kind = 1;
pub const BKV_CALL_DECODE: bkv_call_kind = 2;
pub type bkv_roofline_preset = c_int;
pub const BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16: bkv_roofline_preset = 0;
pub const BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16: bkv_roofline_preset = 1;
pub const BKV_ROOFLINE_A100_80GB_OPT_13B_FP16: bkv_roofline_preset = 2;
pub const BKV_ROOFLINE_PRESET_COUNT: bkv_roofline_preset = 3;
pub type bkv_finish_reason = c_int;
pub const BKV_FINISH_LENGTH: bkv_finish_reason = 0;
pub const BKV_FINISH_STOP: bkv_finish_reason = 1;
pub const BKV_FINISH_ABORT: bkv_finish_reason = 2;
pub const BKV_FINISH_ERROR: bkv_finish_reason = 3;
pub type bkv_policy = c_int;
pub const BKV_POLICY_CONTINUOUS: bkv_policy = 0;
pub const BKV_POLICY_STATIC: bkv_policy = 1;
pub type bkv_preempt_mode = c_int;
pub const BKV_PREEMPT_AUTO: bkv_preempt_mode = 0;
pub const BKV_PREEMPT_RECOMPUTE: bkv_preempt_mode = 1;
pub const BKV_PREEMPT_SWAP: bkv_preempt_mode = 2;
pub type bkv_kv_release_mode = c_int;
pub const BKV_RELEASE_REFUSE: bkv_kv_release_mode = 0;
pub const BKV_RELEASE_RECOMPUTE: bkv_kv_release_mode = 1;
pub const BKV_RELEASE_SWAP: bkv_kv_release_mode = 2;
pub type bkv_evict_policy = c_int;
pub const BKV_EVICT_LRU: bkv_evict_policy = 0;
pub const BKV_EVICT_VALUE: bkv_evict_policy = 1;
pub const BKV_EVICT_SEGMENTED: bkv_evict_policy = 2;
pub type bkv_victim_policy = c_int;
pub const BKV_VICTIM_RECENT: bkv_victim_policy = 0;
pub const BKV_VICTIM_COST: bkv_victim_policy = 1;
pub type bkv_admit_reserve = c_int;
pub const BKV_RESERVE_PROMPT: bkv_admit_reserve = 0;
pub const BKV_RESERVE_OUTPUT: bkv_admit_reserve = 1;
pub type bkv_batch_layout = c_int;
pub const BKV_BATCH_FLAT: bkv_batch_layout = 0;
pub const BKV_BATCH_PERSISTENT: bkv_batch_layout = 1;
pub type bkv_spec_drafts = c_int;
pub const BKV_SPEC_DRAFT_NGRAM: bkv_spec_drafts = 0;
pub const BKV_SPEC_DRAFT_HOST: bkv_spec_drafts = 1;
pub type bkv_spec_k_mode = c_int;
pub const BKV_SPEC_K_AUTO: bkv_spec_k_mode = 0;
pub const BKV_SPEC_K_FIXED: bkv_spec_k_mode = 1;
pub const BKV_SPEC_MAX_K: u32 = 16;
pub const BKV_MAX_ADAPTERS: u32 = 1024;
/// `bkv_connector.lookup`'s answer "ask again later".
pub const BKV_CONNECTOR_LATER: c_int = i32::MIN;
pub const BKV_MAX_ENCODER_INPUTS: u32 = 64;
pub const BKV_TOKEN_PENDING_ROWS: i32 = 1 << 18;
pub const BKV_OVERLAP_MAX_DEPTH: u32 = 8;
pub const BKV_TABLE_OPENED: u32 = 0x1;
pub const BKV_TABLE_CLOSED: u32 = 0x2;
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_cost_calib_confidence {
    pub size: usize,
    pub n_eff: f64,
    pub scale_fit: f64,
    pub scale_base: f64,
    pub level: f64,
    pub trusted: c_int,
    pub uses_fit: c_int,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_table_delta {
    pub slot: u32,
    pub start: u32,
    pub n: u32,
    pub len: u32,
    pub flags: u32,
}
pub type bkv_kv_event_kind = c_int;
pub const BKV_EVENT_STORED: bkv_kv_event_kind = 0;
pub const BKV_EVENT_REMOVED: bkv_kv_event_kind = 1;
pub const BKV_EVENT_CLEARED: bkv_kv_event_kind = 2;
pub type bkv_kv_medium = c_int;
pub const BKV_MEDIUM_DEVICE: bkv_kv_medium = 0;
pub const BKV_MEDIUM_HOST: bkv_kv_medium = 1;
pub const BKV_MEDIUM_EXTERNAL: bkv_kv_medium = 2;
pub type bkv_vllm_wire = c_int;
pub const BKV_VLLM_WIRE_MAP: bkv_vllm_wire = 0;
pub const BKV_VLLM_WIRE_ARRAY: bkv_vllm_wire = 1;
pub const BKV_VLLM_WIRE_ARRAY_V0: bkv_vllm_wire = 2;
pub type bkv_vllm_hash = c_int;
pub const BKV_VLLM_HASH_NATIVE: bkv_vllm_hash = 0;
pub const BKV_VLLM_HASH_SHA256_CBOR: bkv_vllm_hash = 1;
pub const BKV_VLLM_HASH_SHA256: bkv_vllm_hash = 2;
/// `bkv_vllm_key_name_fn`: names a prefix-cache key (a LoRA name) for vLLM.
pub type bkv_vllm_key_name_fn = Option<unsafe extern "C" fn(*mut c_void, u64) -> *const c_char>;
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_allocator {
    pub alloc: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>,
    pub realloc: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize, usize) -> *mut c_void>,
    pub free: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize)>,
    pub ud: *mut c_void,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_model_shape {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub dtype_bytes: u32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct bkv_kv_group {
    pub kind: u32,
    pub layers: u32,
    pub span: u32,
    pub reserved: u32,
    pub bytes: u64,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_pool_config {
    pub size: u32,
    pub block_tokens: u32,
    pub device_blocks: u32,
    pub host_blocks: u32,
    pub max_seqs: u32,
    pub watermark_blocks: u32,
    pub prefix_cache: c_int,
    pub hash_seed: u64,
    pub event_capacity: u32,
    pub pin_permille: u32,
    pub host_cache: u32,
    pub reserved: u32,
    pub n_groups: u32,
    pub state_units: u32,
    pub groups: *const bkv_kv_group,
    pub state_share: u32,
    pub state_pad: u32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_pool_stats {
    pub size: u32,
    pub block_tokens: u32,
    pub device_blocks: u32,
    pub host_blocks: u32,
    pub nr_free: u32,
    pub nr_used: u32,
    pub nr_cached: u32,
    pub nr_indexed: u32,
    pub host_free: u32,
    pub host_used: u32,
    pub nr_seqs: u32,
    pub nr_swapped: u32,
    pub tokens: u64,
    pub waste_slots: u64,
    pub hit_tokens: u64,
    pub miss_tokens: u64,
    pub evictions: u64,
    pub cow_copies: u64,
    pub swap_out_blocks: u64,
    pub swap_in_blocks: u64,
    pub events: u64,
    pub events_dropped: u64,
    pub dup_blocks: u64,
    pub state_units: u32,
    pub state_free: u32,
    pub state_checkpoints: u32,
    pub state_frames: u32,
    pub state_hits: u64,
    pub state_evictions: u64,
    pub host_cached: u32,
    pub host_demoting: u32,
    pub host_demoted: u64,
    pub host_kept: u64,
    pub host_skipped: u64,
    pub host_hit_blocks: u64,
    pub host_evictions: u64,
    pub n_groups: u32,
    pub group_used: [u32; 8],
    pub group_cached: [u32; 8],
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_pool_memory {
    pub size: u32,
    pub block_bytes: u32,
    pub seq_slot_bytes: u32,
    pub index_slots: u32,
    pub index_used: u32,
    pub reserved: u32,
    pub blocks: u64,
    pub device_tokens: u64,
    pub index: u64,
    pub txn_queue: u64,
    pub txn_owners: u64,
    pub check_scratch: u64,
    pub host: u64,
    pub seq_slots: u64,
    pub block_tables: u64,
    pub copy_lists: u64,
    pub event_ring: u64,
    pub total: u64,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_block_info {
    pub size: u32,
    pub state: bkv_block_state,
    pub ref_count: u32,
    pub fill: u32,
    pub indexed: c_int,
    pub copy_pending: c_int,
    pub kids: u32,
    pub parent: i32,
    pub key: u64,
    pub hash: u64,
    pub tokens: *const i32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_copy {
    pub src: i32,
    pub dst: i32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_seq_info {
    pub len: u32,
    pub n_blocks: u32,
    pub swapped: c_int,
    pub key: u64,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_chunk_shape {
    pub len: u32,
    pub start: u32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_step_shape {
    pub kind: bkv_call_kind,
    pub decode_rows: u32,
    pub decode_context: u64,
    pub n_chunks: u32,
    pub chunks: *const bkv_chunk_shape,
    pub padded_rows: u32,
    pub n_groups: u32,
    pub group_decode_context: *const u64,
    pub decode_drafts: u32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_cost_model {
    pub step_us: Option<unsafe extern "C" fn(*mut c_void, *const bkv_step_shape) -> f64>,
    pub observe: Option<unsafe extern "C" fn(*mut c_void, *const bkv_step_shape, f64)>,
    pub ctx: *mut c_void,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_cost_poly {
    pub size: u32,
    pub a: f64,
    pub b: f64,
    pub c: f64,
    pub kappa: f64,
    pub rows_ref: f64,
    pub packed: c_int,
    pub d0: f64,
    pub d1: f64,
    pub d2: f64,
    pub reserved: [u32; 4],
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_cost_roofline {
    pub size: u32,
    pub name: *const c_char,
    pub peak_flops: f64,
    pub mem_bw: f64,
    pub model_bytes: f64,
    pub active_params: f64,
    pub kv_bytes_per_token: f64,
    pub attn_flops_per_pair: f64,
    pub flops_eff: f64,
    pub mem_eff: f64,
    pub overhead_us: f64,
    pub reserved: [u32; 4],
    pub n_groups: u32,
    pub groups: *const bkv_kv_group,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_batch_group {
    pub kind: u32,
    pub span: u32,
    pub slot_mapping: *const i32,
    pub kv_indptr: *const i32,
    pub kv_indices: *const i32,
    pub kv_first_block: *const i32,
    pub row_tables: *const *const i32,
    pub row_table_len: *const u32,
    pub state_in: *const i32,
    pub state_out: *const i32,
    pub state_frames: u32,
    pub state_out_spec: *const i32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct bkv_encode {
    pub cache_id: u64,
    pub req: u64,
    pub user: *mut c_void,
    pub input: u32,
    pub len: u32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_batch {
    pub kind: bkv_call_kind,
    pub n_rows: u32,
    pub n_decode_rows: u32,
    pub n_tokens: u32,
    pub block_tokens: u32,
    pub token_ids: *const i32,
    pub positions: *const i32,
    pub qo_indptr: *const i32,
    pub kv_indptr: *const i32,
    pub kv_indices: *const i32,
    pub kv_last_page_len: *const i32,
    pub slot_mapping: *const i32,
    pub row_sample: *const u8,
    pub row_req: *const u64,
    pub row_branch: *const u32,
    pub row_user: *const *mut c_void,
    pub n_copies: u32,
    pub copies: *const bkv_copy,
    pub n_swap_out: u32,
    pub swap_out: *const bkv_copy,
    pub n_swap_in: u32,
    pub swap_in: *const bkv_copy,
    pub layout: bkv_batch_layout,
    pub n_row_slots: u32,
    pub row_slot: *const u32,
    pub row_tables: *const *const i32,
    pub row_table_len: *const u32,
    pub n_table_deltas: u32,
    pub table_deltas: *const bkv_table_delta,
    pub delta_blocks: *const i32,
    pub n_groups: u32,
    pub groups: *const bkv_batch_group,
    pub n_spec_rows: u32,
    pub row_drafts: *const u32,
    pub spec_tokens: *mut i32,
    pub n_accepted: *mut i32,
    pub row_adapter: *const u32,
    pub n_adapters: u32,
    pub adapters: *const u32,
    pub n_encode: u32,
    pub encode: *const bkv_encode,
    pub n_encoder_free: u32,
    pub encoder_free: *const u64,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_host_ops {
    pub forward: Option<unsafe extern "C" fn(*mut c_void, *const bkv_batch, *mut i32) -> c_int>,
    pub prefill: Option<unsafe extern "C" fn(*mut c_void, *const bkv_batch, *mut i32) -> c_int>,
    pub decode: Option<unsafe extern "C" fn(*mut c_void, *const bkv_batch, *mut i32) -> c_int>,
    pub on_token: Option<unsafe extern "C" fn(*mut c_void, u64, u32, i32, *mut c_void)>,
    pub on_finish: Option<unsafe extern "C" fn(*mut c_void, u64, bkv_finish_reason, *mut c_void)>,
    pub now_us: Option<unsafe extern "C" fn(*mut c_void) -> u64>,
    pub draft: Option<unsafe extern "C" fn(*mut c_void, u64, u32, *const i32, u32, *mut i32, u32, *mut c_void) -> i32>,
    pub launch: Option<unsafe extern "C" fn(*mut c_void, *const bkv_batch, *mut i32) -> c_int>,
}
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct bkv_kv_xfer_block {
    pub hash: u64,
    pub index: u32,
    pub group: u32,
    pub block: i32,
    pub frames: u32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_connector {
    pub lookup: Option<unsafe extern "C" fn(*mut c_void, u64, *const u64, u32) -> c_int>,
    pub load: Option<unsafe extern "C" fn(*mut c_void, u64, u64, *const bkv_kv_xfer_block, u32) -> c_int>,
    pub save: Option<unsafe extern "C" fn(*mut c_void, u64, *const bkv_kv_xfer_block, u32) -> c_int>,
    pub preempted: Option<unsafe extern "C" fn(*mut c_void, u64)>,
    pub user: *mut c_void,
    pub save_blocks: u32,
    pub max_saves: u32,
    pub contains: Option<unsafe extern "C" fn(*mut c_void, u64) -> c_int>,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_sched_config {
    pub size: u32,
    pub policy: bkv_policy,
    pub max_running: u32,
    pub admit_group: u32,
    pub max_wait_us: u64,
    pub chunked_prefill: c_int,
    pub token_budget: u32,
    pub max_queue: u32,
    pub preempt: bkv_preempt_mode,
    pub host_link_bytes_per_us: f64,
    pub kv_bytes_per_token: u64,
    pub tpot_target_us: u32,
    pub cost: bkv_cost_model,
    pub max_bypass_us: u64,
    pub batch_layout: bkv_batch_layout,
    pub ttft_target_us: u32,
    pub spec_max_k: u32,
    pub spec_k_mode: bkv_spec_k_mode,
    pub spec_drafts: bkv_spec_drafts,
    pub overlap: u32,
    pub evict: bkv_evict_policy,
    pub victim: bkv_victim_policy,
    pub admit_reserve: bkv_admit_reserve,
    pub retention: u32,
    pub copy_overlap: u32,
    pub prefill_first: u32,
    pub max_adapters: u32,
    pub pad0: u32,
    pub adapter_wait_us: u64,
    pub encoder_cache: u32,
    pub encoder_budget: u32,
    pub pad1: u32,
    pub connector: *const bkv_connector,
}
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct bkv_encoder_input {
    pub cache_id: u64,
    pub token_start: u32,
    pub token_len: u32,
    pub cost: u32,
    pub pad: u32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_request {
    pub size: u32,
    pub prompt: *const i32,
    pub prompt_len: u32,
    pub max_new_tokens: u32,
    pub stop_tokens: *const i32,
    pub n_stop: u32,
    pub priority: i32,
    pub cache_key: u64,
    pub n: u32,
    pub predicted_output: u32,
    pub user: *mut c_void,
    pub retention: *const bkv_retention_range,
    pub n_retention: u32,
    pub adapter: u32,
    pub n_inputs: u32,
    pub inputs: *const bkv_encoder_input,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_retention_range {
    pub token_start: u32,
    pub token_end: u32,
    pub priority: u32,
    pub pad: u32,
    pub duration_us: u64,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_step_info {
    pub rows: u32,
    pub prefill_tokens: u32,
    pub decode_tokens: u32,
    pub hit_tokens: u32,
    pub prefill_calls: u32,
    pub decode_calls: u32,
    pub admitted: u32,
    pub finished: u32,
    pub preempted: u32,
    pub running: u32,
    pub waiting: u32,
    pub predicted_us: f64,
    pub measured_us: f64,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_step_outputs {
    pub size: u32,
    pub n_tokens: u32,
    pub token_req: *const u64,
    pub token_branch: *const u32,
    pub token_ids: *const i32,
    pub n_finished: u32,
    pub finished_req: *const u64,
    pub finished_reason: *const i32,
}

#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_sched_stats {
    pub size: u32,
    pub waiting: u32,
    pub running: u32,
    pub swapped: u32,
    pub steps: u64,
    pub failed_steps: u64,
    pub submitted: u64,
    pub finished: u64,
    pub aborted: u64,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    pub hit_tokens: u64,
    pub preemptions: u64,
    pub swaps: u64,
    pub prefill_calls: u64,
    pub decode_calls: u64,
    pub busy_us: f64,
    pub unadmittable: u64,
    pub spec_rows: u64,
    pub spec_drafted: u64,
    pub spec_accepted: u64,
    pub overlap_steps: u64,
    pub overlap_syncs: u64,
    pub overlap_wasted_tokens: u64,
    pub spec_skipped_rows: u64,
    pub overlap_spec_waits: u64,
    pub overlap_spec_undrafted: u64,
    pub overlap_spec_idle: u64,
    pub adapter_passes: u64,
    pub encoder_lookups: u64,
    pub encoder_hits: u64,
    pub encoder_runs: u64,
    pub encoder_evictions: u64,
    pub kv_waiting: u32,
    pub kv_save_held: u32,
    pub kv_lookups: u64,
    pub kv_lookup_errors: u64,
    pub kv_loads: u64,
    pub kv_load_tokens: u64,
    pub kv_load_failed: u64,
    pub kv_saved: u64,
    pub kv_save_failed: u64,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_kv_event {
    pub seq: u64,
    pub hash: u64,
    pub parent_hash: u64,
    pub key: u64,
    pub kind: u32,
    pub token_count: u32,
    pub block: i32,
    pub has_parent: u32,
    pub medium: u32,
    pub reserved: u32,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_seq_image {
    pub size: u32,
    pub block_tokens: u32,
    pub len: u32,
    pub n_blocks: u32,
    pub key: u64,
    pub hash_seed: u64,
    pub blocks: *mut i32,
    pub hashes: *mut u64,
    pub tokens: *mut i32,
    pub cap_blocks: u32,
    pub cap_tokens: u32,
    pub n_groups: u32,
    pub state_frames: u32,
    pub group_blocks: *mut i32,
    pub state_frame: i32,
    pub reserved: u32,
    pub group_layout: u64,
}
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct bkv_vllm_config {
    pub size: u32,
    pub wire: u32,
    pub hash: u32,
    pub int_hashes: u32,
    pub hash_seed: *const c_char,
    pub medium: *const c_char,
    pub data_parallel_rank: i32,
    pub group_idx: i32,
    pub spec_kind: *const c_char,
    pub sliding_window: u32,
    pub extra_keys: u32,
    pub key_name: bkv_vllm_key_name_fn,
    pub key_name_ud: *mut c_void,
    pub host_medium: *const c_char,
    pub reserved: [u32; 2],
}
extern "C" {
    pub fn bkv_strerror(status: c_int) -> *const c_char;
    pub fn bkv_last_error() -> *const c_char;
    pub fn bkv_version() -> *const c_char;
    pub fn bkv_kv_bytes_per_token(shape: *const bkv_model_shape) -> u64;
    pub fn bkv_blocks_for_bytes(budget: u64, shape: *const bkv_model_shape, block_tokens: u32) -> u32;
    pub fn bkv_kv_group_page_bytes(g: *const bkv_kv_group, block_tokens: u32) -> u64;
    pub fn bkv_kv_frame_bytes(groups: *const bkv_kv_group, n: u32, block_tokens: u32) -> u64;
    pub fn bkv_kv_state_frames(groups: *const bkv_kv_group, n: u32, block_tokens: u32) -> u32;
    pub fn bkv_kv_group_blocks_held(g: *const bkv_kv_group, block_tokens: u32, tokens: u64) -> u64;
    pub fn bkv_kv_seq_bytes(groups: *const bkv_kv_group, n: u32, block_tokens: u32, tokens: u64) -> u64;
    pub fn bkv_frames_for_bytes(budget: u64, groups: *const bkv_kv_group, n: u32, block_tokens: u32) -> u32;
    pub fn bkv_pool_config_init(cfg: *mut bkv_pool_config);
    pub fn bkv_pool_create(cfg: *const bkv_pool_config, alloc: *const bkv_allocator, out: *mut *mut bkv_pool) -> c_int;
    pub fn bkv_pool_destroy(pool: *mut bkv_pool);
    pub fn bkv_seq_open(pool: *mut bkv_pool, seq: *mut u32) -> c_int;
    pub fn bkv_seq_open_keyed(pool: *mut bkv_pool, key: u64, seq: *mut u32) -> c_int;
    pub fn bkv_seq_append(pool: *mut bkv_pool, seq: u32, tokens: *const i32, n: u32, hit_tokens: *mut u32) -> c_int;
    pub fn bkv_seq_blocks_needed(pool: *const bkv_pool, seq: u32, n: u32) -> i64;
    pub fn bkv_seq_truncate(pool: *mut bkv_pool, seq: u32, new_len: u32) -> c_int;
    pub fn bkv_seq_fork(pool: *mut bkv_pool, parent: u32, child: *mut u32) -> c_int;
    pub fn bkv_seq_close(pool: *mut bkv_pool, seq: u32) -> c_int;
    pub fn bkv_seq_drop(pool: *mut bkv_pool, seq: u32) -> c_int;
    pub fn bkv_seq_blocks(pool: *const bkv_pool, seq: u32, n_blocks: *mut u32) -> *const i32;
    pub fn bkv_seq_group_blocks(pool: *const bkv_pool, seq: u32, group: u32, n_blocks: *mut u32) -> *const i32;
    pub fn bkv_seq_state_frames(pool: *const bkv_pool, seq: u32, r#in: *mut i32, out: *mut i32) -> c_int;
    pub fn bkv_seq_info_get(pool: *const bkv_pool, seq: u32, info: *mut bkv_seq_info) -> c_int;
    pub fn bkv_seq_swap_out(pool: *mut bkv_pool, seq: u32) -> c_int;
    pub fn bkv_seq_swap_in(pool: *mut bkv_pool, seq: u32) -> c_int;
    pub fn bkv_pool_pending_copies(pool: *const bkv_pool, kind: bkv_copy_kind, out: *mut *const bkv_copy) -> u32;
    pub fn bkv_pool_clear_copies(pool: *mut bkv_pool, kind: bkv_copy_kind);
    pub fn bkv_pool_available(pool: *const bkv_pool) -> u32;
    pub fn bkv_pool_can_admit(pool: *const bkv_pool, n_tokens: u32) -> c_int;
    pub fn bkv_pool_reset_cache(pool: *mut bkv_pool) -> c_int;
    pub fn bkv_pool_pin_prefix(pool: *mut bkv_pool, key: u64, tokens: *const i32, n: u32, pin: *mut u32, pinned: *mut u32) -> c_int;
    pub fn bkv_pool_unpin(pool: *mut bkv_pool, pin: u32) -> c_int;
    pub fn bkv_pool_stats_get(pool: *const bkv_pool, stats: *mut bkv_pool_stats);
    pub fn bkv_pool_memory_get(pool: *const bkv_pool, mem: *mut bkv_pool_memory) -> c_int;
    pub fn bkv_block_info_get(pool: *const bkv_pool, block: i32, info: *mut bkv_block_info) -> c_int;
    pub fn bkv_pool_check(pool: *const bkv_pool) -> c_int;
    pub fn bkv_cost_poly_init(poly: *mut bkv_cost_poly);
    pub fn bkv_cost_poly_step_us(poly: *const bkv_cost_poly, shape: *const bkv_step_shape) -> f64;
    pub fn bkv_cost_poly_model(poly: *mut bkv_cost_poly) -> bkv_cost_model;
    pub fn bkv_cost_roofline_init(rl: *mut bkv_cost_roofline, preset: bkv_roofline_preset) -> c_int;
    pub fn bkv_cost_roofline_work(rl: *const bkv_cost_roofline, shape: *const bkv_step_shape, flops: *mut f64, bytes: *mut f64);
    pub fn bkv_cost_roofline_step_us(rl: *const bkv_cost_roofline, shape: *const bkv_step_shape) -> f64;
    pub fn bkv_cost_roofline_model(rl: *mut bkv_cost_roofline) -> bkv_cost_model;
    pub fn bkv_cost_calib_create(base: *const bkv_cost_model, alloc: *const bkv_allocator, out: *mut *mut bkv_cost_calib) -> c_int;
    pub fn bkv_cost_calib_destroy(calib: *mut bkv_cost_calib);
    pub fn bkv_cost_calib_set_forget(calib: *mut bkv_cost_calib, forget: f64) -> c_int;
    pub fn bkv_cost_calib_step_us(calib: *mut bkv_cost_calib, shape: *const bkv_step_shape) -> f64;
    pub fn bkv_cost_calib_observe(calib: *mut bkv_cost_calib, shape: *const bkv_step_shape, measured_us: f64);
    pub fn bkv_cost_calib_observations(calib: *const bkv_cost_calib, kind: bkv_call_kind) -> u64;
    pub fn bkv_cost_calib_coefficients_get(calib: *const bkv_cost_calib, kind: bkv_call_kind, w: *mut f64) -> c_int;
    pub fn bkv_cost_calib_confidence_get(calib: *const bkv_cost_calib, kind: bkv_call_kind, out: *mut bkv_cost_calib_confidence) -> c_int;
    pub fn bkv_cost_calib_model(calib: *mut bkv_cost_calib) -> bkv_cost_model;
    pub fn bkv_sched_config_init(cfg: *mut bkv_sched_config);
    pub fn bkv_request_init(req: *mut bkv_request);
    pub fn bkv_encoder_token(cache_id: u64, i: u32) -> i32;
    pub fn bkv_adapter_cache_key(cache_key: u64, adapter: u32) -> u64;
    pub fn bkv_sched_create(cfg: *const bkv_sched_config, pool: *mut bkv_pool, ops: *const bkv_host_ops, host: *mut c_void, alloc: *const bkv_allocator, out: *mut *mut bkv_sched) -> c_int;
    pub fn bkv_sched_destroy(sched: *mut bkv_sched);
    pub fn bkv_submit(sched: *mut bkv_sched, req: *const bkv_request, req_id: *mut u64) -> c_int;
    pub fn bkv_abort(sched: *mut bkv_sched, req_id: u64) -> c_int;
    pub fn bkv_step(sched: *mut bkv_sched, info: *mut bkv_step_info) -> c_int;
    pub fn bkv_step_launch(sched: *mut bkv_sched, ticket: *mut u64, info: *mut bkv_step_info) -> c_int;
    pub fn bkv_step_complete(sched: *mut bkv_sched, ticket: u64, status: c_int, info: *mut bkv_step_info) -> c_int;
    pub fn bkv_sched_pending(sched: *mut bkv_sched) -> u64;
    pub fn bkv_sched_kv_release(sched: *mut bkv_sched, mode: bkv_kv_release_mode) -> c_int;
    pub fn bkv_sched_kv_resume(sched: *mut bkv_sched) -> c_int;
    pub fn bkv_sched_wait(sched: *mut bkv_sched, timeout_us: u64) -> c_int;
    pub fn bkv_sched_wake(sched: *mut bkv_sched) -> c_int;
    pub fn bkv_sched_outputs_enable(sched: *mut bkv_sched, on: c_int) -> c_int;
    pub fn bkv_sched_outputs_get(sched: *const bkv_sched, out: *mut bkv_step_outputs) -> c_int;
    pub fn bkv_sched_stats_get(sched: *const bkv_sched, stats: *mut bkv_sched_stats);
    pub fn bkv_sched_check(sched: *const bkv_sched) -> c_int;
    pub fn bkv_pool_drain_events(pool: *mut bkv_pool, out: *mut bkv_kv_event, max: u32) -> u32;
    pub fn bkv_block_hashes(hash_seed: u64, key: u64, block_tokens: u32, tokens: *const i32, n: u32, hashes: *mut u64) -> u32;
    pub fn bkv_seq_export(pool: *const bkv_pool, seq: u32, exp: *mut bkv_seq_image) -> c_int;
    pub fn bkv_seq_import(pool: *mut bkv_pool, exp: *const bkv_seq_image, seq: *mut u32, transfers: *mut bkv_copy, n_transfers: *mut u32) -> c_int;
    pub fn bkv_kv_xfer_done(sched: *mut bkv_sched, xfer: u64, status: c_int, failed: *const u32, n_failed: u32) -> c_int;
    pub fn bkv_sched_metrics_prometheus(sched: *const bkv_sched, buf: *mut c_char, cap: usize) -> usize;
    pub fn bkv_vllm_config_init(cfg: *mut bkv_vllm_config);
    pub fn bkv_vllm_encoder_create(cfg: *const bkv_vllm_config, pool: *const bkv_pool, alloc: *const bkv_allocator, out: *mut *mut bkv_vllm_encoder) -> c_int;
    pub fn bkv_vllm_encoder_destroy(enc: *mut bkv_vllm_encoder);
    pub fn bkv_vllm_encoder_drain(enc: *mut bkv_vllm_encoder, pool: *mut bkv_pool, ts: f64, msg: *mut *const u8, len: *mut usize) -> c_int;
    pub fn bkv_vllm_encoder_resyncs(enc: *const bkv_vllm_encoder) -> u64;
    pub fn bkv_vllm_block_hashes(cfg: *const bkv_vllm_config, lora_name: *const c_char, block_tokens: u32, tokens: *const i32, n: u32, digests: *mut u8) -> u32;
    pub fn bkv_vllm_block_hashes_salted(cfg: *const bkv_vllm_config, lora_name: *const c_char, cache_salt: *const c_char, block_tokens: u32, tokens: *const i32, n: u32, digests: *mut u8) -> u32;
    pub fn bkv_vllm_hash_int(digest: *const u8) -> u64;
}
