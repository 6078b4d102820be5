//! Safe Rust bindings of libbatchkv, the LLM serving scheduler and
//! block-paged KV cache manager (`include/batchkv.h`).
//!
//! * [`Pool`] owns a `bkv_pool`: sequences, fork and copy-on-write, the
//!   prefix cache, swap, copy lists, stats, KV events, export/import.
//!   Mutating calls take `&mut self`, so a block table or copy list borrowed
//!   from the pool (`&[i32]`, `&[Copy]`) cannot outlive the next change: the
//!   header's "valid until the pool next changes", checked by the compiler.
//! * [`Scheduler<'pool, H>`] owns a `bkv_sched` over a pool it borrows
//!   mutably for `'pool` (the header: "used by no one else while the
//!   scheduler runs") and a host `H: Host` whose methods are the callbacks.
//! * [`KvConnector`], implemented by the host and plugged in with
//!   [`Scheduler::with_connector`], loads prompt blocks from an external
//!   store and saves computed ones to it; [`XferDone`] completes its
//!   transfers from any thread.
//! * [`VllmEncoder`] turns a pool's KV events into the msgpack batches a
//!   vLLM replica publishes (for vLLM-event routers such as llm-d, Dynamo).
//! * [`Batch<'a>`] is what `Host::forward` receives: the library's arrays as
//!   slices borrowed for the duration of the call (the trait method's
//!   anonymous lifetime means they cannot be kept).
//!   [`Batch::groups`] gives each KV group's part of it ([`BatchGroup`]): its
//!   slot mapping and the blocks each row reads in it, borrowed the same way.
//!
//! # Threads (the header's rules, in types)
//! * `Pool: Send`, not `Sync`: one thread at a time.
//! * `Scheduler: Send + Sync` when `H: Send`. [`Scheduler::submit`],
//!   [`Scheduler::abort`], [`Scheduler::pending`] and
//!   [`Scheduler::xfer_done`] take `&self` and may run on any thread while
//!   another steps (`std::thread::scope` shares it); an [`XferDone`] handle
//!   is `Send + Sync + 'static` and may outlive the scheduler.
//!   [`Scheduler::step`] also takes `&self`, but only one step runs at a time:
//!   a second concurrent call (or one from a callback) gets
//!   `Err(Error::State)`; the stats, check, metrics and pool calls are guarded
//!   the same way, so they never run during a step.
//!
//! # The rules, checked by the compiler
//! Each `compile_fail` example below has a twin that compiles, so it fails
//! for the reason given, not for a typo.
//!
//! A host may copy what a batch holds, but not keep the borrowed slices:
//! ```
//! use batchkv::*;
//! struct Copies { kept: Vec<i32> }
//! impl Host for Copies {
//!     fn forward(&mut self, b: &Batch<'_>, _n: &mut [i32]) -> std::result::Result<(), HostFailed> {
//!         self.kept = b.token_ids().to_vec();
//!         Ok(())
//!     }
//! }
//! ```
//! ```compile_fail
//! use batchkv::*;
//! struct Keeps<'a> { kept: &'a [i32] }
//! impl<'a> Host for Keeps<'a> {
//!     fn forward(&mut self, b: &Batch<'_>, _n: &mut [i32]) -> std::result::Result<(), HostFailed> {
//!         self.kept = b.token_ids(); // the batch is borrowed for this call only
//!         Ok(())
//!     }
//! }
//! ```
//! The scheduler borrows its pool mutably, so the pool is untouchable while
//! it lives, and usable again after:
//! ```
//! use batchkv::*;
//! struct H;
//! impl Host for H {
//!     fn forward(&mut self, _: &Batch<'_>, _: &mut [i32]) -> std::result::Result<(), HostFailed> { Ok(()) }
//! }
//! let mut pool = Pool::new(&PoolConfig { device_blocks: 8, ..Default::default() }).unwrap();
//! let s = Scheduler::new(&mut pool, H, &SchedConfig::default(), None).unwrap();
//! s.pending();
//! drop(s);
//! pool.open().unwrap();
//! ```
//! ```compile_fail
//! use batchkv::*;
//! struct H;
//! impl Host for H {
//!     fn forward(&mut self, _: &Batch<'_>, _: &mut [i32]) -> std::result::Result<(), HostFailed> { Ok(()) }
//! }
//! let mut pool = Pool::new(&PoolConfig { device_blocks: 8, ..Default::default() }).unwrap();
//! let s = Scheduler::new(&mut pool, H, &SchedConfig::default(), None).unwrap();
//! pool.open().unwrap(); // the scheduler still borrows the pool
//! s.pending();
//! ```
//! A pool is `Send` but not `Sync`:
//! ```
//! fn send<T: Send>() {}
//! send::<batchkv::Pool>();
//! ```
//! ```compile_fail
//! fn sync<T: Sync>() {}
//! sync::<batchkv::Pool>();
//! ```
//!
//! # Failures
//! Every fallible call returns [`Result`], with one [`Error`] variant per
//! status code. A host callback that returns `Err(HostFailed)` or panics fails
//! the call: the step is rolled back (`BKV_EHOST`) and `step` returns
//! `Err(Error::Host)`, or resumes the panic on the caller's thread after the
//! library has rolled back (a panic never unwinds through C).

pub mod sys;

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::slice;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

pub use sys::bkv_chunk_shape as ChunkShape;
pub use sys::bkv_cost_calib_confidence as CalibConfidence;
pub use sys::bkv_copy as Copy;
pub use sys::bkv_kv_event as KvEvent;
pub use sys::bkv_kv_group as KvGroup;
pub use sys::bkv_model_shape as ModelShape;
pub use sys::bkv_pool_config as PoolConfig;
pub use sys::bkv_pool_memory as PoolMemory;
pub use sys::bkv_pool_stats as PoolStats;
pub use sys::bkv_sched_config as SchedConfig;
pub use sys::bkv_sched_stats as SchedStats;
pub use sys::bkv_seq_info as SeqInfo;
pub use sys::bkv_step_info as StepInfo;

/// Functions of the header the safe layer does not wrap, with the reason.
/// The drift guard reads this table (and fails on an entry that is wrapped
/// after all).
pub const UNBOUND: &[(&str, &str)] = &[];

/// Struct fields no test reaches through the safe layer, with the reason.
/// The drift guard reads this table.
pub const FIELDS_UNREACHED: &[(&str, &str)] = &[
    ("bkv_allocator", "the allocator hook is not in the safe layer: Pool and Scheduler pass NULL (libc's allocator)"),
];

// ------------------------------------------------------------------ errors --

/// What kind of failure: one variant per `bkv_status` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// `BKV_EINVAL`: an argument or config field out of range (misuse).
    InvalidArgument,
    /// `BKV_ENOMEM`: the allocator failed.
    OutOfMemory,
    /// `BKV_ENOSPC`: not enough free KV blocks (normal: reclaim or preempt).
    NoSpace,
    /// `BKV_E2BIG`: it can never fit, or a caller array is too small.
    TooBig,
    /// `BKV_EAGAIN`: a limit (max_seqs, max_queue) was reached; retry later.
    TryAgain,
    /// `BKV_ENOENT`: no such sequence or request.
    NotFound,
    /// `BKV_EHOST`: a host compute callback failed; the step was rolled back.
    Host,
    /// `BKV_ESTATE`: not allowed now (swapped, stepping, from a callback).
    State,
    /// A negative status this version does not know.
    Unknown(i32),
}

/// A failed call: its [`ErrorKind`] and, for a refused config or request,
/// the library's `bkv_last_error` message naming the field and the rule
/// ([`Error::detail`]). `Display` gives the `bkv_strerror` text, then the
/// message when there is one ("invalid argument:
/// bkv_pool_config.block_tokens = 24: must be a power of two in 1..65536").
/// Errors compare by kind only, so `err == Error::InvalidArgument` holds
/// whatever the message; `match err.kind()` to branch on the kind.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    detail: Option<Box<str>>,
}

#[allow(non_upper_case_globals)]
impl Error {
    /// `BKV_EINVAL` (no message).
    pub const InvalidArgument: Error = Error::of(ErrorKind::InvalidArgument);
    /// `BKV_ENOMEM`.
    pub const OutOfMemory: Error = Error::of(ErrorKind::OutOfMemory);
    /// `BKV_ENOSPC`.
    pub const NoSpace: Error = Error::of(ErrorKind::NoSpace);
    /// `BKV_E2BIG` (no message).
    pub const TooBig: Error = Error::of(ErrorKind::TooBig);
    /// `BKV_EAGAIN`.
    pub const TryAgain: Error = Error::of(ErrorKind::TryAgain);
    /// `BKV_ENOENT`.
    pub const NotFound: Error = Error::of(ErrorKind::NotFound);
    /// `BKV_EHOST`.
    pub const Host: Error = Error::of(ErrorKind::Host);
    /// `BKV_ESTATE`.
    pub const State: Error = Error::of(ErrorKind::State);

    /// The error of a kind, with no message.
    pub const fn of(kind: ErrorKind) -> Error {
        Error { kind, detail: None }
    }

    /// The error of a negative status; `None` for `BKV_OK` and positive values.
    pub fn from_status(status: c_int) -> Option<Error> {
        Some(Error::of(match status {
            s if s >= 0 => return None,
            sys::BKV_EINVAL => ErrorKind::InvalidArgument,
            sys::BKV_ENOMEM => ErrorKind::OutOfMemory,
            sys::BKV_ENOSPC => ErrorKind::NoSpace,
            sys::BKV_E2BIG => ErrorKind::TooBig,
            sys::BKV_EAGAIN => ErrorKind::TryAgain,
            sys::BKV_ENOENT => ErrorKind::NotFound,
            sys::BKV_EHOST => ErrorKind::Host,
            sys::BKV_ESTATE => ErrorKind::State,
            s => ErrorKind::Unknown(s),
        }))
    }

    /// `BKV_EINVAL` with a message of the safe layer's own.
    fn refused(detail: &str) -> Error {
        Error { kind: ErrorKind::InvalidArgument, detail: Some(detail.into()) }
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The library's message naming the refused field and the rule, when
    /// the failed call left one (`bkv_last_error`).
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// The `bkv_status` code.
    pub fn status(&self) -> c_int {
        match self.kind {
            ErrorKind::InvalidArgument => sys::BKV_EINVAL,
            ErrorKind::OutOfMemory => sys::BKV_ENOMEM,
            ErrorKind::NoSpace => sys::BKV_ENOSPC,
            ErrorKind::TooBig => sys::BKV_E2BIG,
            ErrorKind::TryAgain => sys::BKV_EAGAIN,
            ErrorKind::NotFound => sys::BKV_ENOENT,
            ErrorKind::Host => sys::BKV_EHOST,
            ErrorKind::State => sys::BKV_ESTATE,
            ErrorKind::Unknown(s) => s,
        }
    }
}

impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.kind == other.kind
    }
}

impl Eq for Error {}

impl PartialEq<ErrorKind> for Error {
    fn eq(&self, other: &ErrorKind) -> bool {
        self.kind == *other
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(strerror(self.status()))?;
        match &self.detail {
            Some(d) => write!(f, ": {}", d),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

fn check(rc: c_int) -> Result<c_int> {
    match Error::from_status(rc) {
        Some(e) => Err(e),
        None => Ok(rc),
    }
}

/// [`check`] for the calls that name a refused field (`bkv_pool_create`,
/// `bkv_sched_create`, `bkv_submit`, `bkv_cost_calib_create`,
/// `bkv_cost_roofline_init`, `bkv_vllm_encoder_create`): right after one of
/// them, on its thread, the error carries `bkv_last_error`'s message.
fn check_named(rc: c_int) -> Result<c_int> {
    check(rc).map_err(|mut e| {
        let d = last_error();
        if !d.is_empty() {
            e.detail = Some(d.into());
        }
        e
    })
}

/// `bkv_strerror`: the library's message for a status code.
pub fn strerror(status: c_int) -> &'static str {
    // SAFETY: bkv_strerror returns a static NUL-terminated string, never NULL.
    unsafe { CStr::from_ptr(sys::bkv_strerror(status)) }.to_str().unwrap_or("?")
}

/// `bkv_last_error`: the calling thread's message for the last refused
/// config or request ("" when there is none); see the header for which
/// calls set and clear it.
pub fn last_error() -> String {
    // SAFETY: a thread-local NUL-terminated buffer, never NULL; copied at once.
    unsafe { CStr::from_ptr(sys::bkv_last_error()) }.to_string_lossy().into_owned()
}

/// `bkv_version`: the version string the library was built with.
pub fn version() -> &'static str {
    // SAFETY: a static string.
    unsafe { CStr::from_ptr(sys::bkv_version()) }.to_str().unwrap_or("?")
}

/// `bkv_kv_bytes_per_token`: bytes of KV one token occupies (0 on bad input).
pub fn kv_bytes_per_token(shape: &ModelShape) -> u64 {
    unsafe { sys::bkv_kv_bytes_per_token(shape) }
}

/// `bkv_blocks_for_bytes`: whole blocks that fit in a byte budget.
pub fn blocks_for_bytes(budget: u64, shape: &ModelShape, block_tokens: u32) -> u32 {
    unsafe { sys::bkv_blocks_for_bytes(budget, shape, block_tokens) }
}

impl KvGroup {
    /// A full-attention group: `layers` layers of `bytes` KV bytes per token.
    pub fn full(layers: u32, bytes: u64) -> KvGroup {
        KvGroup { kind: sys::BKV_GROUP_FULL as u32, layers, span: 0, reserved: 0, bytes }
    }
    /// A sliding-window group of `window` tokens.
    pub fn window(layers: u32, window: u32, bytes: u64) -> KvGroup {
        KvGroup { kind: sys::BKV_GROUP_WINDOW as u32, layers, span: window, reserved: 0, bytes }
    }
    /// A chunked local-attention group of `chunk` tokens.
    pub fn chunked(layers: u32, chunk: u32, bytes: u64) -> KvGroup {
        KvGroup { kind: sys::BKV_GROUP_CHUNKED as u32, layers, span: chunk, reserved: 0, bytes }
    }
    /// A recurrent-state group: `bytes` of state per sequence per layer,
    /// checkpoints every `interval` tokens (0: none).
    pub fn state(layers: u32, interval: u32, bytes: u64) -> KvGroup {
        KvGroup { kind: sys::BKV_GROUP_STATE as u32, layers, span: interval, reserved: 0, bytes }
    }
}

/// `bkv_kv_group_page_bytes`: one block of an attention group, one unit of a
/// state group (0 on bad input).
pub fn kv_group_page_bytes(group: &KvGroup, block_tokens: u32) -> u64 {
    unsafe { sys::bkv_kv_group_page_bytes(group, block_tokens) }
}

/// `bkv_kv_frame_bytes`: one frame of a pool with these groups (0 on bad
/// input).
pub fn kv_frame_bytes(groups: &[KvGroup], block_tokens: u32) -> u64 {
    unsafe { sys::bkv_kv_frame_bytes(groups.as_ptr(), group_count(groups), block_tokens) }
}

/// `bkv_kv_state_frames`: frames one state unit takes (0 without a state
/// group or on bad input).
pub fn kv_state_frames(groups: &[KvGroup], block_tokens: u32) -> u32 {
    unsafe { sys::bkv_kv_state_frames(groups.as_ptr(), group_count(groups), block_tokens) }
}

/// `bkv_kv_group_blocks_held`: blocks a sequence of `tokens` tokens holds in
/// the group while the next token is computed (0 for state or bad input).
pub fn kv_group_blocks_held(group: &KvGroup, block_tokens: u32, tokens: u64) -> u64 {
    unsafe { sys::bkv_kv_group_blocks_held(group, block_tokens, tokens) }
}

/// `bkv_kv_seq_bytes`: bytes a sequence of `tokens` tokens holds, token-exact
/// with `block_tokens` 0 (0 on bad input).
pub fn kv_seq_bytes(groups: &[KvGroup], block_tokens: u32, tokens: u64) -> u64 {
    unsafe { sys::bkv_kv_seq_bytes(groups.as_ptr(), group_count(groups), block_tokens, tokens) }
}

/// `bkv_frames_for_bytes`: frames of a pool with these groups that fit in a
/// byte budget (0 on bad input).
pub fn frames_for_bytes(budget: u64, groups: &[KvGroup], block_tokens: u32) -> u32 {
    unsafe { sys::bkv_frames_for_bytes(budget, groups.as_ptr(), group_count(groups), block_tokens) }
}

/// A slice's length as the C count; a slice too long for any pool counts as
/// `u32::MAX`, which every sizing function refuses.
fn group_count(groups: &[KvGroup]) -> u32 {
    u32::try_from(groups.len()).unwrap_or(u32::MAX)
}

/// `bkv_block_hashes`: the chained hashes of the full blocks of `tokens`, as
/// a pool with this seed and block size gives them in its KV events.
pub fn block_hashes(hash_seed: u64, key: u64, block_tokens: u32, tokens: &[i32]) -> Vec<u64> {
    if block_tokens == 0 {
        return Vec::new();
    }
    let mut out = vec![0u64; tokens.len() / block_tokens as usize];
    let n = unsafe {
        sys::bkv_block_hashes(hash_seed, key, block_tokens, tokens.as_ptr(),
                              tokens.len() as u32, out.as_mut_ptr())
    };
    out.truncate(n as usize);
    out
}

/// `bkv_adapter_cache_key`: the prefix-cache key a request's blocks are
/// cached under: `cache_key` when `adapter` is 0, else a 64-bit mix of both
/// that is never 0. Pass it to [`Pool::open_keyed`] or [`Pool::pin_prefix`]
/// to reach a request's blocks.
pub fn adapter_cache_key(cache_key: u64, adapter: u32) -> u64 {
    unsafe { sys::bkv_adapter_cache_key(cache_key, adapter) }
}

/// `bkv_encoder_token`: the token id the library puts at position `i` of an
/// encoder input's span: at most -2^23 (below `BKV_TOKEN_FAIL` and every
/// overlap placeholder), a function of `(cache_id, i)` alone. A batch's
/// `token_ids` carry it at the positions of a request's inputs, whatever
/// the submitted prompt held there.
pub fn encoder_token(cache_id: u64, i: u32) -> i32 {
    unsafe { sys::bkv_encoder_token(cache_id, i) }
}

/// `BKV_OVERLAP_MAX_DEPTH`: the deepest overlapped scheduling
/// (`SchedConfig::overlap`).
pub const OVERLAP_MAX_DEPTH: u32 = sys::BKV_OVERLAP_MAX_DEPTH;

/// `BKV_TOKEN_PENDING_AT`: the placeholder a launched batch's `token_ids`
/// carry for the token that the step launched `back` launches before (1:
/// the previous launch, at most `SchedConfig::overlap`) samples for its row
/// `i`.
pub const fn token_pending_at(back: u32, i: u32) -> i32 {
    -2 - ((back.wrapping_sub(1) << 18) | i) as i32
}

/// `BKV_TOKEN_IS_PENDING`: whether token id `t` is a placeholder.
pub const fn token_is_pending(t: i32) -> bool {
    t <= -2 && t > -2 - OVERLAP_MAX_DEPTH as i32 * sys::BKV_TOKEN_PENDING_ROWS
}

/// `BKV_TOKEN_PENDING_BACK`: how many launches back a placeholder's step is.
pub const fn token_pending_back(t: i32) -> u32 {
    ((-2 - t as i64) as u32 >> 18) + 1
}

/// `BKV_TOKEN_PENDING_ROW`: the row a placeholder names in its step.
pub const fn token_pending_row(t: i32) -> u32 {
    (-2 - t as i64) as u32 & (sys::BKV_TOKEN_PENDING_ROWS as u32 - 1)
}

/// Replace each placeholder in `ids` by the token it stands for, as the
/// device does before computing a launched step: `recent[back - 1]` holds
/// the sampled tokens of the step launched `back` launches before it
/// (`recent[0]` the previous launch's). Returns how many were replaced;
/// `Err(InvalidArgument)` (and `ids` unchanged) when one names a step
/// `recent` does not hold or a row beyond its tokens.
pub fn resolve_placeholders(ids: &mut [i32], recent: &[&[i32]]) -> Result<usize> {
    let lookup = |t: i32| {
        let (back, row) = (token_pending_back(t) as usize, token_pending_row(t) as usize);
        recent.get(back - 1).and_then(|s| s.get(row)).copied()
    };
    let mut n = 0;
    for &t in ids.iter() {
        if token_is_pending(t) {
            lookup(t).ok_or(Error::InvalidArgument)?;
            n += 1;
        }
    }
    for t in ids.iter_mut() {
        if token_is_pending(*t) {
            *t = lookup(*t).unwrap_or(*t);
        }
    }
    Ok(n)
}

// ---------------------------------------------------------------- configs --

impl Default for PoolConfig {
    /// `bkv_pool_config_init`'s defaults (device_blocks 0 must still be set).
    fn default() -> Self {
        let mut c = unsafe { std::mem::zeroed::<PoolConfig>() };
        unsafe { sys::bkv_pool_config_init(&mut c) };
        c
    }
}

impl Default for SchedConfig {
    /// `bkv_sched_config_init`'s defaults (the cost model is the library's).
    fn default() -> Self {
        let mut c = unsafe { std::mem::zeroed::<SchedConfig>() };
        unsafe { sys::bkv_sched_config_init(&mut c) };
        c
    }
}

fn zeroed<T>() -> T {
    // SAFETY: used for the header's plain-data structs only (integers,
    // doubles, nullable pointers and Option<fn>: all-zero is valid).
    unsafe { std::mem::zeroed() }
}

// ------------------------------------------------------------------ pool --

/// Which copy list (`bkv_copy_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// device -> device (copy-on-write)
    Device = 0,
    /// device -> host
    SwapOut = 1,
    /// host -> device
    SwapIn = 2,
}

/// What a device block holds (`bkv_block_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// on the free list, no content
    Free = 0,
    /// referenced by a sequence's table, or a pending device copy's source
    Pinned = 1,
    /// unreferenced, kept in the prefix cache (on the LRU)
    Cached = 2,
}

/// One device block (`bkv_block_info`); `tokens` is borrowed until the pool
/// changes. Field meanings as in batchkv.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo<'a> {
    pub state: BlockState,
    pub ref_count: u32,
    pub fill: u32,
    pub indexed: bool,
    pub copy_pending: bool,
    pub kids: u32,
    pub parent: i32,
    pub key: u64,
    pub hash: u64,
    pub tokens: &'a [i32],
}

/// An exported sequence (`bkv_seq_image`) as owned data. A pool with KV
/// groups adds `n_groups`, `group_blocks` (each attention group after the
/// first's blocks, `blocks.len()` entries per group, -1 where it released
/// one), `state_frame` and `state_frames` (its STATE group's live unit, -1
/// and 0 without one) and `group_layout` (the groups' checksum, 0 for a
/// plain pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqImage {
    pub block_tokens: u32,
    pub len: u32,
    pub key: u64,
    pub hash_seed: u64,
    pub blocks: Vec<i32>,
    pub hashes: Vec<u64>,
    pub tokens: Vec<i32>,
    pub n_groups: u32,
    pub group_blocks: Vec<i32>,
    pub state_frame: i32,
    pub state_frames: u32,
    pub group_layout: u64,
}

/// Attention groups after the first in an image's group list.
fn image_lanes(n_groups: u32, state_frames: u32) -> usize {
    n_groups.saturating_sub(1 + (state_frames > 0) as u32) as usize
}

/// A block-paged KV pool (`bkv_pool`). `Send`: it may move between threads;
/// not `Sync`: one thread uses it at a time.
pub struct Pool {
    raw: NonNull<sys::bkv_pool>,
    id: u64, // unique for the process's life: what a VllmEncoder checks
}

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

// SAFETY: the header: "a pool belongs to one thread at a time".
unsafe impl Send for Pool {}

impl Pool {
    /// `bkv_pool_create` with `cfg` (copied). `Err(InvalidArgument)` for a
    /// field out of range, or for `cfg.groups` / `cfg.n_groups` set (a raw
    /// pointer: give the groups to [`Pool::with_groups`]), `Err(OutOfMemory)`.
    pub fn new(cfg: &PoolConfig) -> Result<Pool> {
        if cfg.n_groups != 0 || !cfg.groups.is_null() {
            return Err(Error::refused("bkv_pool_config.groups: give the groups to Pool::with_groups"));
        }
        Self::create(cfg, &[])
    }

    /// `bkv_pool_create` for a hybrid model: `cfg` with `groups` as its KV
    /// groups (both copied; `cfg.groups` and `cfg.n_groups` are ignored).
    /// Errors as [`Pool::new`].
    pub fn with_groups(cfg: &PoolConfig, groups: &[KvGroup]) -> Result<Pool> {
        Self::create(cfg, groups)
    }

    fn create(cfg: &PoolConfig, groups: &[KvGroup]) -> Result<Pool> {
        let mut c = *cfg;
        c.size = std::mem::size_of::<PoolConfig>() as u32;
        c.n_groups = group_count(groups);
        c.groups = if groups.is_empty() { ptr::null() } else { groups.as_ptr() };
        let mut p = ptr::null_mut();
        check_named(unsafe { sys::bkv_pool_create(&c, ptr::null(), &mut p) })?;
        Ok(Pool { raw: NonNull::new(p).ok_or(Error::OutOfMemory)?,
                  id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed) })
    }

    /// The raw handle, for calls this crate does not wrap.
    pub fn as_ptr(&self) -> *mut sys::bkv_pool {
        self.raw.as_ptr()
    }

    /// `bkv_seq_open`: a new empty sequence.
    pub fn open(&mut self) -> Result<u32> {
        let mut s = 0;
        check(unsafe { sys::bkv_seq_open(self.as_ptr(), &mut s) })?;
        Ok(s)
    }

    /// `bkv_seq_open_keyed`: a new sequence whose blocks are cached under `key`.
    pub fn open_keyed(&mut self, key: u64) -> Result<u32> {
        let mut s = 0;
        check(unsafe { sys::bkv_seq_open_keyed(self.as_ptr(), key, &mut s) })?;
        Ok(s)
    }

    /// `bkv_seq_append`: returns the leading tokens that were prefix hits.
    pub fn append(&mut self, seq: u32, tokens: &[i32]) -> Result<u32> {
        let mut hit = 0;
        check(unsafe {
            sys::bkv_seq_append(self.as_ptr(), seq, tokens.as_ptr(), tokens.len() as u32, &mut hit)
        })?;
        Ok(hit)
    }

    /// `bkv_seq_blocks_needed`.
    pub fn blocks_needed(&self, seq: u32, n: u32) -> Result<u64> {
        let r = unsafe { sys::bkv_seq_blocks_needed(self.as_ptr(), seq, n) };
        if r < 0 {
            Err(Error::from_status(r as c_int).unwrap_or(Error::of(ErrorKind::Unknown(r as i32))))
        } else {
            Ok(r as u64)
        }
    }

    /// `bkv_seq_truncate`.
    pub fn truncate(&mut self, seq: u32, new_len: u32) -> Result<()> {
        check(unsafe { sys::bkv_seq_truncate(self.as_ptr(), seq, new_len) }).map(|_| ())
    }

    /// `bkv_seq_fork`: a child sharing every block of `parent`.
    pub fn fork(&mut self, parent: u32) -> Result<u32> {
        let mut c = 0;
        check(unsafe { sys::bkv_seq_fork(self.as_ptr(), parent, &mut c) })?;
        Ok(c)
    }

    /// `bkv_seq_close`: full cached blocks stay in the prefix cache.
    pub fn close_seq(&mut self, seq: u32) -> Result<()> {
        check(unsafe { sys::bkv_seq_close(self.as_ptr(), seq) }).map(|_| ())
    }

    /// `bkv_seq_drop`: an aborted sequence's blocks leave the cache.
    pub fn drop_seq(&mut self, seq: u32) -> Result<()> {
        check(unsafe { sys::bkv_seq_drop(self.as_ptr(), seq) }).map(|_| ())
    }

    /// `bkv_seq_blocks`: the block table, borrowed until the pool changes.
    pub fn blocks(&self, seq: u32) -> Result<&[i32]> {
        let mut n = 0;
        let p = unsafe { sys::bkv_seq_blocks(self.as_ptr(), seq, &mut n) };
        if p.is_null() {
            return Err(Error::NotFound);
        }
        Ok(unsafe { raw_slice(p, n as usize) })
    }

    /// `bkv_seq_group_blocks`: the block table of one KV group (group 0's is
    /// [`Pool::blocks`]), borrowed until the pool changes. As long as group
    /// 0's; entries a sliding-window or chunked group released are -1. A
    /// pool without groups has group 0 only. `Err(NotFound)` for an unknown
    /// sequence or group.
    pub fn group_blocks(&self, seq: u32, group: u32) -> Result<&[i32]> {
        let mut n = 0;
        let p = unsafe { sys::bkv_seq_group_blocks(self.as_ptr(), seq, group, &mut n) };
        if p.is_null() {
            return Err(Error::NotFound);
        }
        Ok(unsafe { raw_slice(p, n as usize) })
    }

    /// `bkv_seq_state_frames`: the sequence's recurrent-state units, for a
    /// pool whose last group is STATE, as `(in, out)`, each a unit's first
    /// frame (a unit is [`kv_state_frames`] consecutive frames). After an
    /// append, `in` is the state before the appended tokens (-1: the zero
    /// state) and `out` is where the state after them goes (-1: nothing
    /// appended since the state was committed); the next append makes `out`
    /// the sequence's state. `Err(InvalidArgument)` without a STATE group,
    /// `Err(NotFound)` for an unknown sequence.
    pub fn state_frames(&self, seq: u32) -> Result<(i32, i32)> {
        let (mut i, mut o) = (0i32, 0i32);
        check(unsafe { sys::bkv_seq_state_frames(self.as_ptr(), seq, &mut i, &mut o) })?;
        Ok((i, o))
    }

    /// `bkv_seq_info_get`.
    pub fn info(&self, seq: u32) -> Result<SeqInfo> {
        let mut i = zeroed::<SeqInfo>();
        check(unsafe { sys::bkv_seq_info_get(self.as_ptr(), seq, &mut i) })?;
        Ok(i)
    }

    /// `bkv_seq_swap_out`.
    pub fn swap_out(&mut self, seq: u32) -> Result<()> {
        check(unsafe { sys::bkv_seq_swap_out(self.as_ptr(), seq) }).map(|_| ())
    }

    /// `bkv_seq_swap_in`.
    pub fn swap_in(&mut self, seq: u32) -> Result<()> {
        check(unsafe { sys::bkv_seq_swap_in(self.as_ptr(), seq) }).map(|_| ())
    }

    /// `bkv_pool_pending_copies`: pending copies of one kind, borrowed until the pool
    /// changes.
    pub fn copies(&self, kind: CopyKind) -> &[Copy] {
        let mut out = ptr::null();
        let n = unsafe { sys::bkv_pool_pending_copies(self.as_ptr(), kind as c_int, &mut out) };
        unsafe { raw_slice(out, n as usize) }
    }

    /// `bkv_pool_clear_copies`: forget copies of one kind once performed.
    pub fn clear_copies(&mut self, kind: CopyKind) {
        unsafe { sys::bkv_pool_clear_copies(self.as_ptr(), kind as c_int) }
    }

    /// `bkv_pool_available`: free plus reclaimable device blocks.
    pub fn available(&self) -> u32 {
        unsafe { sys::bkv_pool_available(self.as_ptr()) }
    }

    /// `bkv_pool_can_admit`.
    pub fn can_admit(&self, n_tokens: u32) -> bool {
        unsafe { sys::bkv_pool_can_admit(self.as_ptr(), n_tokens) != 0 }
    }

    /// `bkv_pool_pin_prefix`: pin the cached leading full blocks of
    /// `tokens` under `key`; returns (pin, pinned tokens).
    pub fn pin_prefix(&mut self, key: u64, tokens: &[i32]) -> Result<(u32, u32)> {
        let (mut pin, mut got) = (0u32, 0u32);
        check(unsafe {
            sys::bkv_pool_pin_prefix(self.as_ptr(), key, tokens.as_ptr(), tokens.len() as u32,
                                     &mut pin, &mut got)
        })?;
        Ok((pin, got))
    }

    /// `bkv_pool_unpin`: end a pin; its blocks go back to the cache.
    pub fn unpin(&mut self, pin: u32) -> Result<()> {
        check(unsafe { sys::bkv_pool_unpin(self.as_ptr(), pin) }).map(|_| ())
    }

    /// `bkv_pool_reset_cache`.
    pub fn reset_cache(&mut self) -> Result<()> {
        check(unsafe { sys::bkv_pool_reset_cache(self.as_ptr()) }).map(|_| ())
    }

    /// `bkv_pool_stats_get`.
    pub fn stats(&self) -> PoolStats {
        pool_stats(self.as_ptr())
    }

    /// `bkv_pool_memory_get`: the bytes the pool holds, by structure.
    pub fn memory(&self) -> PoolMemory {
        let mut m = zeroed::<PoolMemory>();
        m.size = std::mem::size_of::<PoolMemory>() as u32;
        // cannot fail: the pool and the struct are valid
        unsafe { sys::bkv_pool_memory_get(self.as_ptr(), &mut m) };
        m
    }

    /// `bkv_block_info_get`: one device block (`InvalidArgument` for an id
    /// out of range).
    pub fn block(&self, block: i32) -> Result<BlockInfo<'_>> {
        let mut i = zeroed::<sys::bkv_block_info>();
        i.size = std::mem::size_of::<sys::bkv_block_info>() as u32;
        check(unsafe { sys::bkv_block_info_get(self.as_ptr(), block, &mut i) })?;
        Ok(BlockInfo {
            state: match i.state {
                sys::BKV_BLOCK_PINNED => BlockState::Pinned,
                sys::BKV_BLOCK_CACHED => BlockState::Cached,
                _ => BlockState::Free,
            },
            ref_count: i.ref_count,
            fill: i.fill,
            indexed: i.indexed != 0,
            copy_pending: i.copy_pending != 0,
            kids: i.kids,
            parent: i.parent,
            key: i.key,
            hash: i.hash,
            tokens: unsafe { raw_slice(i.tokens, i.fill as usize) },
        })
    }

    /// `bkv_pool_check`: 0 when consistent, else the invariant's number.
    pub fn check(&self) -> i32 {
        unsafe { sys::bkv_pool_check(self.as_ptr()) }
    }

    /// `bkv_pool_drain_events`: drain up to `max` KV events, oldest first.
    pub fn events(&mut self, max: u32) -> Vec<KvEvent> {
        pool_events(self.as_ptr(), max)
    }

    /// `bkv_seq_export`: a device-resident sequence as owned data.
    pub fn export(&self, seq: u32) -> Result<SeqImage> {
        let mut img = zeroed::<sys::bkv_seq_image>();
        img.size = std::mem::size_of::<sys::bkv_seq_image>() as u32;
        let rc = unsafe { sys::bkv_seq_export(self.as_ptr(), seq, &mut img) };
        if rc != sys::BKV_E2BIG {
            check(rc)?;
        }
        let mut blocks = vec![0i32; img.n_blocks as usize];
        let mut hashes = vec![0u64; img.n_blocks as usize];
        let mut tokens = vec![0i32; img.len as usize];
        img.blocks = blocks.as_mut_ptr();
        img.hashes = hashes.as_mut_ptr();
        img.tokens = tokens.as_mut_ptr();
        img.cap_blocks = blocks.len() as u32;
        img.cap_tokens = tokens.len() as u32;
        let mut group_blocks =
            vec![-1i32; image_lanes(img.n_groups, img.state_frames) * blocks.len()];
        if !group_blocks.is_empty() {
            img.group_blocks = group_blocks.as_mut_ptr();
        }
        check(unsafe { sys::bkv_seq_export(self.as_ptr(), seq, &mut img) })?;
        Ok(SeqImage { block_tokens: img.block_tokens, len: img.len, key: img.key,
                      hash_seed: img.hash_seed, blocks, hashes, tokens,
                      n_groups: img.n_groups, group_blocks, state_frame: img.state_frame,
                      state_frames: img.state_frames, group_layout: img.group_layout })
    }

    /// `bkv_seq_import`: returns the new sequence and the KV transfers
    /// (source pool's block -> this pool's block) the host must make.
    pub fn import(&mut self, image: &SeqImage) -> Result<(u32, Vec<Copy>)> {
        let mut img = zeroed::<sys::bkv_seq_image>();
        img.size = std::mem::size_of::<sys::bkv_seq_image>() as u32;
        img.block_tokens = image.block_tokens;
        img.len = image.len;
        img.n_blocks = image.blocks.len() as u32;
        img.key = image.key;
        img.hash_seed = image.hash_seed;
        // the library only reads these arrays (the struct's pointers are *mut
        // because export writes through the same struct)
        img.blocks = image.blocks.as_ptr() as *mut i32;
        img.hashes = image.hashes.as_ptr() as *mut u64;
        img.tokens = image.tokens.as_ptr() as *mut i32;
        img.cap_blocks = image.blocks.len().min(image.hashes.len()) as u32;
        img.cap_tokens = image.tokens.len() as u32;
        img.n_groups = image.n_groups;
        img.state_frames = image.state_frames;
        img.state_frame = image.state_frame;
        img.group_layout = image.group_layout;
        let lanes = image_lanes(image.n_groups, image.state_frames);
        if lanes > 0 {
            if image.group_blocks.len() != lanes * image.blocks.len() {
                return Err(Error::InvalidArgument);
            }
            img.group_blocks = image.group_blocks.as_ptr() as *mut i32;
        }
        let want = image.blocks.len() * (1 + lanes) + image.state_frames as usize;
        let mut transfers = vec![Copy { src: 0, dst: 0 }; want.max(1)];
        let (mut seq, mut n) = (0u32, 0u32);
        check(unsafe {
            sys::bkv_seq_import(self.as_ptr(), &img, &mut seq, transfers.as_mut_ptr(), &mut n)
        })?;
        transfers.truncate(n as usize);
        Ok((seq, transfers))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        unsafe { sys::bkv_pool_destroy(self.as_ptr()) }
    }
}

fn pool_stats(p: *const sys::bkv_pool) -> PoolStats {
    let mut s = zeroed::<PoolStats>();
    s.size = std::mem::size_of::<PoolStats>() as u32;
    unsafe { sys::bkv_pool_stats_get(p, &mut s) };
    s
}

fn pool_events(p: *mut sys::bkv_pool, max: u32) -> Vec<KvEvent> {
    let mut v = vec![zeroed::<KvEvent>(); max as usize];
    let n = unsafe { sys::bkv_pool_drain_events(p, v.as_mut_ptr(), max) };
    v.truncate(n as usize);
    v
}

/// A slice over a library array; empty for a NULL pointer or n == 0.
unsafe fn raw_slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        slice::from_raw_parts(p, n)
    }
}

// ------------------------------------------------------------ vLLM events --

/// How a KVEventBatch and its events are laid out (`bkv_vllm_wire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VllmWire {
    /// Current vLLM: each struct a map keyed by field name, events tagged by
    /// a first "type" entry, defaults omitted.
    Map = 0,
    /// `array_like` vLLM (what llm-d's and Dynamo's decoders read).
    Array = 1,
    /// The first `array_like` vLLM (no medium, no lora_name; ints only).
    ArrayV0 = 2,
}

/// Which block hash the events carry (`bkv_vllm_hash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VllmHash {
    /// The pool's own 64-bit chained hash, as an int.
    Native = 0,
    /// vLLM's "sha256_cbor".
    Sha256Cbor = 1,
    /// vLLM's "sha256" (pickle protocol 5).
    Sha256 = 2,
}

/// Bytes in a vLLM block digest (`BKV_VLLM_DIGEST_BYTES`).
pub const VLLM_DIGEST_BYTES: usize = sys::BKV_VLLM_DIGEST_BYTES;

/// `bkv_vllm_config` as owned data; `Default` is `bkv_vllm_config_init`'s.
/// The key-naming callback is not a field: see [`VllmEncoder::with_key_name`].
/// A string with a NUL byte is refused (`Err(InvalidArgument)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VllmConfig {
    /// Default `Map`.
    pub wire: VllmWire,
    /// Default `Sha256Cbor`.
    pub hash: VllmHash,
    /// A digest goes out as the int of its last 8 bytes (true, the default)
    /// or as the 32 bytes. `Native` and `ArrayV0` always send ints.
    pub int_hashes: bool,
    /// The replicas' PYTHONHASHSEED (at most 255 bytes). Default "0".
    pub hash_seed: String,
    /// BlockStored/BlockRemoved.medium; `None` sends nil. Default "GPU".
    pub medium: Option<String>,
    /// KVEventBatch.data_parallel_rank; -1 (the default) omits it.
    pub data_parallel_rank: i32,
    /// Map layout: every event's group_idx; -1 (the default) omits it.
    pub group_idx: i32,
    /// Map layout: BlockStored.kv_cache_spec_kind; `None` (default) omits it.
    pub spec_kind: Option<String>,
    /// Map layout: kv_cache_spec_sliding_window; 0 (default) omits it.
    pub sliding_window: u32,
    /// Map layout: send BlockStored.extra_keys. Default false.
    pub extra_keys: bool,
    /// The medium named for host-cache blocks (`bkv_vllm_config.host_medium`).
    pub host_medium: Option<String>,
}

unsafe fn opt_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        Some(CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}

impl Default for VllmConfig {
    fn default() -> Self {
        let mut c = zeroed::<sys::bkv_vllm_config>();
        unsafe { sys::bkv_vllm_config_init(&mut c) };
        VllmConfig {
            wire: match c.wire {
                1 => VllmWire::Array,
                2 => VllmWire::ArrayV0,
                _ => VllmWire::Map,
            },
            hash: match c.hash {
                0 => VllmHash::Native,
                2 => VllmHash::Sha256,
                _ => VllmHash::Sha256Cbor,
            },
            int_hashes: c.int_hashes != 0,
            // SAFETY: init points these at static strings or NULL
            hash_seed: unsafe { opt_string(c.hash_seed) }.unwrap_or_default(),
            medium: unsafe { opt_string(c.medium) },
            data_parallel_rank: c.data_parallel_rank,
            group_idx: c.group_idx,
            spec_kind: unsafe { opt_string(c.spec_kind) },
            sliding_window: c.sliding_window,
            extra_keys: c.extra_keys != 0,
            host_medium: unsafe { opt_string(c.host_medium) },
        }
    }
}

/// A raw config and the C strings it points into.
struct RawVllmConfig {
    raw: sys::bkv_vllm_config,
    _strings: (CString, Option<CString>, Option<CString>, Option<CString>),
}

fn c_string(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::InvalidArgument)
}

impl VllmConfig {
    fn to_raw(&self) -> Result<RawVllmConfig> {
        let seed = c_string(&self.hash_seed)?;
        let medium = match &self.medium {
            Some(m) => Some(c_string(m)?),
            None => None,
        };
        let kind = match &self.spec_kind {
            Some(k) => Some(c_string(k)?),
            None => None,
        };
        let host_medium = match &self.host_medium {
            Some(m) => Some(c_string(m)?),
            None => None,
        };
        let mut c = zeroed::<sys::bkv_vllm_config>();
        unsafe { sys::bkv_vllm_config_init(&mut c) };
        c.host_medium = host_medium.as_ref().map_or(ptr::null(), |m| m.as_ptr());
        c.wire = self.wire as u32;
        c.hash = self.hash as u32;
        c.int_hashes = self.int_hashes as u32;
        c.hash_seed = seed.as_ptr();
        c.medium = medium.as_ref().map_or(ptr::null(), |m| m.as_ptr());
        c.data_parallel_rank = self.data_parallel_rank;
        c.group_idx = self.group_idx;
        c.spec_kind = kind.as_ref().map_or(ptr::null(), |k| k.as_ptr());
        c.sliding_window = self.sliding_window;
        c.extra_keys = self.extra_keys as u32;
        // the CStrings' buffers are on the heap: moving them keeps the pointers
        Ok(RawVllmConfig { raw: c, _strings: (seed, medium, kind, host_medium) })
    }
}

/// What a key-naming closure left behind for `encode` to report.
enum KeyNameFailure {
    Nul,
    Panic(Box<dyn Any + Send + 'static>),
}

/// The state `bkv_vllm_key_name_fn` is handed (`key_name_ud`).
struct KeyNames {
    f: Box<dyn FnMut(u64) -> Option<String> + Send>,
    names: Vec<CString>, // this encode's names: valid until it returns
    failed: Option<KeyNameFailure>,
}

unsafe extern "C" fn key_name_cb(ud: *mut c_void, key: u64) -> *const c_char {
    // SAFETY: ud is the encoder's Box<KeyNames>, used only inside its encode
    // (&mut self), on that thread.
    let k = &mut *(ud as *mut KeyNames);
    if k.failed.is_some() {
        return ptr::null();
    }
    let f = &mut k.f;
    match panic::catch_unwind(AssertUnwindSafe(|| f(key))) {
        Ok(None) => ptr::null(),
        Ok(Some(name)) => match CString::new(name) {
            Ok(c) => {
                let p = c.as_ptr();
                k.names.push(c);
                p
            }
            Err(_) => {
                k.failed = Some(KeyNameFailure::Nul);
                ptr::null()
            }
        },
        Err(p) => {
            k.failed = Some(KeyNameFailure::Panic(p));
            ptr::null()
        }
    }
}

/// A vLLM KV-event encoder (`bkv_vllm_encoder`) over one [`Pool`]: it
/// drains the pool's events and writes the msgpack KVEventBatch a vLLM
/// replica writes for the same blocks (docs/scaling.md).
///
/// Thread rules (the header's): the encoder belongs to its pool's thread
/// and runs between pool calls. It is `Send` (it moves with its pool), not
/// `Sync`; [`encode`](VllmEncoder::encode) takes the pool `&mut`, so no
/// other pool call runs meanwhile, and [`Scheduler::vllm_encode`] does the
/// same between steps for a pool a scheduler borrows.
///
/// The encoder does not borrow its pool (the pool must stay mutable between
/// encodes). What keeps that safe: `encode` refuses any pool but the very
/// `Pool` it was made for (`Err(InvalidArgument)`; pools are told apart by a
/// process-unique id, not by address, so a new pool at a freed one's address
/// is refused too), so a dropped pool is never read through it; and its
/// `Drop` (`bkv_vllm_encoder_destroy`) frees only the encoder's own memory
/// (lib/events/encoder.c), so dropping it after its pool is harmless. Drop it
/// first all the same, as the header asks.
///
/// ```
/// use batchkv::*;
/// let mut pool = Pool::new(&PoolConfig { device_blocks: 8, block_tokens: 4,
///                                        event_capacity: 64, ..Default::default() }).unwrap();
/// let mut enc = VllmEncoder::new(&pool, &VllmConfig { wire: VllmWire::Array,
///                                                     ..Default::default() }).unwrap();
/// let s = pool.open().unwrap();
/// pool.append(s, &[1, 2, 3, 4, 5]).unwrap();
/// let payload = enc.encode(&mut pool, 0.0).unwrap();
/// assert!(!payload.is_empty()); // one BlockStored: publish it over ZeroMQ
/// ```
pub struct VllmEncoder {
    raw: NonNull<sys::bkv_vllm_encoder>,
    pool_id: u64,
    names: Option<Box<KeyNames>>,
    last_events: u32,
}

// SAFETY: the encoder is used only through &mut self (or under a
// scheduler's exclusive flag) by one thread at a time; the key-naming
// closure is Send.
unsafe impl Send for VllmEncoder {}

impl VllmEncoder {
    /// `bkv_vllm_encoder_create` for `pool` (which must have events on:
    /// `event_capacity > 0`). `Err(InvalidArgument)` for a pool without
    /// events, a field out of range, a hash_seed over 255 bytes or a string
    /// with a NUL byte; `Err(OutOfMemory)`.
    pub fn new(pool: &Pool, cfg: &VllmConfig) -> Result<VllmEncoder> {
        Self::create(pool, cfg, None)
    }

    /// As [`new`](VllmEncoder::new), with `key_name` naming the pool's
    /// prefix-cache keys for vLLM (the LoRA adapter name of BlockStored and
    /// of the block hash's extra keys; `None`: no name). It is called from
    /// inside `encode`, on that thread, only for nonzero keys. A name with a
    /// NUL byte makes that `encode` return `Err(InvalidArgument)`; a panic is
    /// caught at the C boundary and resumed when `bkv_vllm_encoder_drain` returns.
    /// Either way that batch is lost.
    pub fn with_key_name<F>(pool: &Pool, cfg: &VllmConfig, key_name: F) -> Result<VllmEncoder>
    where
        F: FnMut(u64) -> Option<String> + Send + 'static,
    {
        Self::create(pool, cfg, Some(Box::new(KeyNames { f: Box::new(key_name), names: Vec::new(),
                                                         failed: None })))
    }

    fn create(pool: &Pool, cfg: &VllmConfig, mut names: Option<Box<KeyNames>>)
              -> Result<VllmEncoder> {
        let mut c = cfg.to_raw()?;
        if let Some(k) = names.as_mut() {
            c.raw.key_name = Some(key_name_cb);
            c.raw.key_name_ud = &mut **k as *mut KeyNames as *mut c_void;
        }
        let mut e = ptr::null_mut();
        check_named(unsafe { sys::bkv_vllm_encoder_create(&c.raw, pool.as_ptr(), ptr::null(), &mut e) })?;
        Ok(VllmEncoder { raw: NonNull::new(e).ok_or(Error::OutOfMemory)?, pool_id: pool.id,
                         names, last_events: 0 })
    }

    /// `bkv_vllm_encoder_drain`: drain every pending event of `pool` and encode
    /// them as one KVEventBatch at time `ts` (seconds; vLLM sends
    /// time.time()). The payload of one ZeroMQ message, borrowed until the
    /// next call; empty when there was nothing to send.
    /// `Err(InvalidArgument)` for another pool; `Err(OutOfMemory)` (the
    /// drained events are lost and the next batch resynchronises).
    pub fn encode(&mut self, pool: &mut Pool, ts: f64) -> Result<&[u8]> {
        if pool.id != self.pool_id {
            return Err(Error::InvalidArgument);
        }
        self.encode_raw(pool.as_ptr(), ts)
    }

    fn encode_raw(&mut self, pool: *mut sys::bkv_pool, ts: f64) -> Result<&[u8]> {
        if let Some(k) = self.names.as_mut() {
            k.names.clear();
            k.failed = None;
        }
        let mut msg = ptr::null();
        let mut len = 0usize;
        let rc = unsafe { sys::bkv_vllm_encoder_drain(self.raw.as_ptr(), pool, ts, &mut msg, &mut len) };
        if let Some(k) = self.names.as_mut() {
            k.names.clear();
            match k.failed.take() {
                Some(KeyNameFailure::Panic(p)) => panic::resume_unwind(p),
                Some(KeyNameFailure::Nul) => return Err(Error::InvalidArgument),
                None => {}
            }
        }
        self.last_events = check(rc)? as u32;
        // SAFETY: the payload is the encoder's, valid until its next call,
        // which needs &mut self
        Ok(unsafe { raw_slice(msg, len) })
    }

    /// vLLM events in the last batch `encode` returned.
    pub fn last_event_count(&self) -> u32 {
        self.last_events
    }

    /// `bkv_vllm_encoder_resyncs`: resynchronisations written so far (ring
    /// overflows, buffer failures).
    pub fn resyncs(&self) -> u64 {
        unsafe { sys::bkv_vllm_encoder_resyncs(self.raw.as_ptr()) }
    }
}

impl Drop for VllmEncoder {
    fn drop(&mut self) {
        unsafe { sys::bkv_vllm_encoder_destroy(self.raw.as_ptr()) }
    }
}

/// `bkv_vllm_block_hashes`: vLLM's digests of the full blocks of `tokens`
/// (what a replica with `cfg.hash`, `cfg.hash_seed` and this block size
/// computes, and what an encoder with the same config publishes under key 0
/// or a key named `lora_name`). `lora_name` is every block's extra key.
/// `Err(InvalidArgument)` for a `Native` hash, `block_tokens == 0`, a bad
/// hash_seed.
pub fn vllm_block_hashes(cfg: &VllmConfig, lora_name: Option<&str>, block_tokens: u32,
                         tokens: &[i32]) -> Result<Vec<[u8; VLLM_DIGEST_BYTES]>> {
    vllm_block_hashes_salted(cfg, lora_name, None, block_tokens, tokens)
}

/// `bkv_vllm_block_hashes_salted`: `vllm_block_hashes` with vLLM's
/// `cache_salt` in the first block's extra keys (an encoder publishes a key
/// without a name under its decimal digits as the salt).
pub fn vllm_block_hashes_salted(cfg: &VllmConfig, lora_name: Option<&str>,
                                cache_salt: Option<&str>, block_tokens: u32,
                                tokens: &[i32]) -> Result<Vec<[u8; VLLM_DIGEST_BYTES]>> {
    if block_tokens == 0 || cfg.hash == VllmHash::Native || tokens.len() > u32::MAX as usize {
        return Err(Error::InvalidArgument);
    }
    let c = cfg.to_raw()?;
    let lora = match lora_name {
        Some(l) => Some(c_string(l)?),
        None => None,
    };
    let salt = match cache_salt {
        Some(s) => Some(c_string(s)?),
        None => None,
    };
    let want = tokens.len() / block_tokens as usize;
    let mut out = vec![[0u8; VLLM_DIGEST_BYTES]; want];
    if want == 0 {
        return Ok(out);
    }
    let lora_p = lora.as_ref().map_or(ptr::null(), |l| l.as_ptr());
    let n = unsafe {
        match salt {
            Some(ref s) => sys::bkv_vllm_block_hashes_salted(
                &c.raw, lora_p, s.as_ptr(), block_tokens, tokens.as_ptr(), tokens.len() as u32,
                out.as_mut_ptr() as *mut u8),
            None => sys::bkv_vllm_block_hashes(&c.raw, lora_p, block_tokens, tokens.as_ptr(),
                                               tokens.len() as u32, out.as_mut_ptr() as *mut u8),
        }
    };
    if n as usize != want {
        return Err(Error::InvalidArgument);
    }
    Ok(out)
}

/// `bkv_vllm_hash_int`: the int a digest is sent as (its last 8 bytes,
/// big-endian).
pub fn vllm_hash_int(digest: &[u8; VLLM_DIGEST_BYTES]) -> u64 {
    unsafe { sys::bkv_vllm_hash_int(digest.as_ptr()) }
}

// ----------------------------------------------------------- cost models --

/// Which host call (`bkv_call_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Mixed = 0,
    Prefill = 1,
    Decode = 2,
}

/// One host call to price (`bkv_step_shape`).
#[derive(Debug, Clone, Copy)]
pub struct StepShape<'a> {
    pub kind: CallKind,
    pub decode_rows: u32,
    pub decode_context: u64,
    pub chunks: &'a [ChunkShape],
    pub padded_rows: u32,
    /// Per KV group, the context its decode rows read; empty for a model
    /// with one full-attention group.
    pub group_decode_context: &'a [u64],
}

impl<'a> StepShape<'a> {
    fn raw(&self) -> sys::bkv_step_shape {
        sys::bkv_step_shape {
            kind: self.kind as c_int,
            decode_rows: self.decode_rows,
            decode_context: self.decode_context,
            n_chunks: self.chunks.len() as u32,
            chunks: self.chunks.as_ptr(),
            padded_rows: self.padded_rows.max(self.decode_rows),
            n_groups: self.group_decode_context.len() as u32,
            group_decode_context: if self.group_decode_context.is_empty() {
                ptr::null()
            } else {
                self.group_decode_context.as_ptr()
            },
            decode_drafts: 0, // speculative decoding is not bound in the safe layer
        }
    }
}

/// A cost model a scheduler can use. The scheduler borrows it mutably for
/// its whole life (`'pool`), so no one else reads or changes it meanwhile.
pub trait CostModel {
    /// The `bkv_cost_model` whose ctx points into `self`.
    fn raw_model(&mut self) -> sys::bkv_cost_model;
}

/// Seed 000's polynomial (`bkv_cost_poly`); the fields are public through
/// [`PolyCost::params`].
pub struct PolyCost {
    raw: Box<sys::bkv_cost_poly>,
}

impl PolyCost {
    /// `bkv_cost_poly_init`'s coefficients.
    pub fn new() -> PolyCost {
        let mut raw = Box::new(zeroed::<sys::bkv_cost_poly>());
        unsafe { sys::bkv_cost_poly_init(&mut *raw) };
        PolyCost { raw }
    }
    /// The coefficients, to read or change.
    pub fn params(&mut self) -> &mut sys::bkv_cost_poly {
        &mut self.raw
    }
    /// `bkv_cost_poly_step_us`.
    pub fn step_us(&self, shape: &StepShape<'_>) -> f64 {
        let s = shape.raw();
        unsafe { sys::bkv_cost_poly_step_us(&*self.raw, &s) }
    }
}

impl Default for PolyCost {
    fn default() -> Self {
        PolyCost::new()
    }
}

impl CostModel for PolyCost {
    fn raw_model(&mut self) -> sys::bkv_cost_model {
        unsafe { sys::bkv_cost_poly_model(&mut *self.raw) }
    }
}

/// Seed 004's roofline (`bkv_cost_roofline`) from a preset; a hybrid model's
/// KV groups through [`RooflineCost::set_groups`].
pub struct RooflineCost {
    raw: Box<sys::bkv_cost_roofline>,
    groups: Vec<KvGroup>, // what raw.groups points at (empty: none)
}

impl RooflineCost {
    /// `bkv_cost_roofline_init` with a `sys::BKV_ROOFLINE_*` preset.
    pub fn new(preset: sys::bkv_roofline_preset) -> Result<RooflineCost> {
        let mut raw = Box::new(zeroed::<sys::bkv_cost_roofline>());
        check_named(unsafe { sys::bkv_cost_roofline_init(&mut *raw, preset) })?;
        Ok(RooflineCost { raw, groups: Vec::new() })
    }
    /// The model's figures, to read or change (leave `groups` and `n_groups`
    /// to [`RooflineCost::set_groups`]).
    pub fn params(&mut self) -> &mut sys::bkv_cost_roofline {
        &mut self.raw
    }
    /// Price a hybrid model per KV group (copied; empty: all layers full
    /// attention at `kv_bytes_per_token`).
    pub fn set_groups(&mut self, groups: &[KvGroup]) {
        self.groups = groups.to_vec();
        self.raw.n_groups = group_count(&self.groups);
        self.raw.groups = if self.groups.is_empty() { ptr::null() } else { self.groups.as_ptr() };
    }
    /// The groups [`RooflineCost::set_groups`] gave.
    pub fn groups(&self) -> &[KvGroup] {
        &self.groups
    }
    /// `bkv_cost_roofline_step_us`.
    pub fn step_us(&self, shape: &StepShape<'_>) -> f64 {
        let s = shape.raw();
        unsafe { sys::bkv_cost_roofline_step_us(&*self.raw, &s) }
    }
    /// `bkv_cost_roofline_work`: (FLOPs, bytes) of one call.
    pub fn work(&self, shape: &StepShape<'_>) -> (f64, f64) {
        let s = shape.raw();
        let (mut f, mut b) = (0.0, 0.0);
        unsafe { sys::bkv_cost_roofline_work(&*self.raw, &s, &mut f, &mut b) };
        (f, b)
    }
}

impl CostModel for RooflineCost {
    fn raw_model(&mut self) -> sys::bkv_cost_model {
        unsafe { sys::bkv_cost_roofline_model(&mut *self.raw) }
    }
}

/// The calibrated model (`bkv_cost_calib`) over a base it borrows for `'b`.
pub struct CalibratedCost<'b> {
    raw: NonNull<sys::bkv_cost_calib>,
    _base: PhantomData<&'b mut ()>,
}

// SAFETY: "the model then belongs to one thread at a time".
unsafe impl<'b> Send for CalibratedCost<'b> {}

impl<'b> CalibratedCost<'b> {
    /// `bkv_cost_calib_create` over `base` (None: learn from zero).
    pub fn new(base: Option<&'b mut dyn CostModel>) -> Result<CalibratedCost<'b>> {
        let b = base.map(|m| m.raw_model());
        let mut p = ptr::null_mut();
        check_named(unsafe {
            sys::bkv_cost_calib_create(b.as_ref().map_or(ptr::null(), |m| m as *const _),
                                       ptr::null(), &mut p)
        })?;
        Ok(CalibratedCost { raw: NonNull::new(p).ok_or(Error::OutOfMemory)?, _base: PhantomData })
    }
    /// `bkv_cost_calib_set_forget` (0.9..=1).
    pub fn set_forget(&mut self, forget: f64) -> Result<()> {
        check(unsafe { sys::bkv_cost_calib_set_forget(self.raw.as_ptr(), forget) }).map(|_| ())
    }
    /// `bkv_cost_calib_step_us`.
    pub fn step_us(&mut self, shape: &StepShape<'_>) -> f64 {
        let s = shape.raw();
        unsafe { sys::bkv_cost_calib_step_us(self.raw.as_ptr(), &s) }
    }
    /// `bkv_cost_calib_observe`.
    pub fn observe(&mut self, shape: &StepShape<'_>, measured_us: f64) {
        let s = shape.raw();
        unsafe { sys::bkv_cost_calib_observe(self.raw.as_ptr(), &s, measured_us) }
    }
    /// `bkv_cost_calib_observations`.
    pub fn observations(&self, kind: CallKind) -> u64 {
        unsafe { sys::bkv_cost_calib_observations(self.raw.as_ptr(), kind as c_int) }
    }
    /// `bkv_cost_calib_coefficients_get`.
    pub fn coefficients(&self, kind: CallKind) -> [f64; sys::BKV_COST_CALIB_FEATURES] {
        let mut w = [0.0; sys::BKV_COST_CALIB_FEATURES];
        unsafe { sys::bkv_cost_calib_coefficients_get(self.raw.as_ptr(), kind as c_int, w.as_mut_ptr()) };
        w
    }
    /// `bkv_cost_calib_confidence_get`: how much a kind's fit knows and
    /// whether predictions use it.
    pub fn confidence(&self, kind: CallKind) -> CalibConfidence {
        let mut c = zeroed::<CalibConfidence>();
        c.size = std::mem::size_of::<CalibConfidence>();
        // cannot fail: the model, the kind and the struct are valid
        unsafe { sys::bkv_cost_calib_confidence_get(self.raw.as_ptr(), kind as c_int, &mut c) };
        c
    }
}

impl<'b> CostModel for CalibratedCost<'b> {
    fn raw_model(&mut self) -> sys::bkv_cost_model {
        unsafe { sys::bkv_cost_calib_model(self.raw.as_ptr()) }
    }
}

impl<'b> Drop for CalibratedCost<'b> {
    fn drop(&mut self) {
        unsafe { sys::bkv_cost_calib_destroy(self.raw.as_ptr()) }
    }
}

// ------------------------------------------------------------- the batch --

/// One host call's work (`bkv_batch`), borrowed from the library for the
/// duration of the callback. Rows `0..n_decode_rows()` decode one token
/// each; the rest are prefill chunks. Perform `swap_out`, `swap_in`, `copies`
/// in that order before computing.
pub struct Batch<'a> {
    raw: &'a sys::bkv_batch,
}

impl<'a> Batch<'a> {
    /// Wrap a raw batch (for hosts that call their own trampolines).
    ///
    /// # Safety
    /// `raw` must be a batch the library handed to a callback, still running.
    pub unsafe fn from_raw(raw: &'a sys::bkv_batch) -> Batch<'a> {
        Batch { raw }
    }
    pub fn raw(&self) -> &'a sys::bkv_batch {
        self.raw
    }
    pub fn kind(&self) -> CallKind {
        match self.raw.kind {
            sys::BKV_CALL_PREFILL => CallKind::Prefill,
            sys::BKV_CALL_DECODE => CallKind::Decode,
            _ => CallKind::Mixed,
        }
    }
    pub fn n_rows(&self) -> usize {
        self.raw.n_rows as usize
    }
    pub fn n_decode_rows(&self) -> usize {
        self.raw.n_decode_rows as usize
    }
    pub fn n_tokens(&self) -> usize {
        self.raw.n_tokens as usize
    }
    pub fn block_tokens(&self) -> u32 {
        self.raw.block_tokens
    }
    fn t<T>(&self, p: *const T, n: usize) -> &'a [T] {
        unsafe { raw_slice(p, n) }
    }
    /// `[n_tokens]` input tokens.
    pub fn token_ids(&self) -> &'a [i32] {
        self.t(self.raw.token_ids, self.n_tokens())
    }
    /// `[n_tokens]` position of each token.
    pub fn positions(&self) -> &'a [i32] {
        self.t(self.raw.positions, self.n_tokens())
    }
    /// `[n_rows + 1]`: row r's tokens are `qo_indptr[r]..qo_indptr[r + 1]`.
    pub fn qo_indptr(&self) -> &'a [i32] {
        self.t(self.raw.qo_indptr, self.n_rows() + 1)
    }
    /// `[n_rows + 1]`: row r's blocks are `kv_indices[kv_indptr[r]..kv_indptr[r + 1]]`.
    pub fn kv_indptr(&self) -> &'a [i32] {
        self.t(self.raw.kv_indptr, self.n_rows() + 1)
    }
    /// Block ids of every row, context and new tokens.
    pub fn kv_indices(&self) -> &'a [i32] {
        let n = self.kv_indptr().last().map_or(0, |&x| x as usize);
        self.t(self.raw.kv_indices, n)
    }
    /// `[n_rows]` tokens in each row's last block.
    pub fn kv_last_page_len(&self) -> &'a [i32] {
        self.t(self.raw.kv_last_page_len, self.n_rows())
    }
    /// `[n_tokens]` slot (block * block_tokens + offset) of each new token's K/V.
    pub fn slot_mapping(&self) -> &'a [i32] {
        self.t(self.raw.slot_mapping, self.n_tokens())
    }
    /// `[n_rows]` 1: write a sampled token for this row.
    pub fn row_sample(&self) -> &'a [u8] {
        self.t(self.raw.row_sample, self.n_rows())
    }
    /// `[n_rows]` request id of each row.
    pub fn row_req(&self) -> &'a [u64] {
        self.t(self.raw.row_req, self.n_rows())
    }
    /// `[n_rows]` sample index (0..n-1) of each row.
    pub fn row_branch(&self) -> &'a [u32] {
        self.t(self.raw.row_branch, self.n_rows())
    }
    /// `[n_rows]` the `user` value of each row's request ([`Request::user`]).
    pub fn row_user(&self) -> &'a [usize] {
        self.t(self.raw.row_user as *const usize, self.n_rows())
    }
    /// Speculative decoding: rows carrying drafts in this call.
    pub fn n_spec_rows(&self) -> usize {
        self.raw.n_spec_rows as usize
    }
    /// `[n_rows]` drafts in each row (a decode row with k drafts carries
    /// 1 + k tokens); empty without speculation.
    pub fn row_drafts(&self) -> &'a [u32] {
        if self.raw.row_drafts.is_null() {
            return &[];
        }
        self.t(self.raw.row_drafts, self.n_rows())
    }
    /// Writable, indexed like `token_ids` over the decode rows: the token
    /// sampled after each token of a row with drafts (`Cell`s: written
    /// through the shared batch). Empty without speculation.
    pub fn spec_tokens(&self) -> &'a [Cell<i32>] {
        let n = if self.n_decode_rows() > 0 { self.qo_indptr()[self.n_decode_rows()] as usize } else { 0 };
        // SAFETY: the library hands the array over for the call; Cell<i32>
        // has i32's layout, and nothing else in Rust refers to it.
        unsafe { raw_slice(self.raw.spec_tokens as *const Cell<i32>, n) }
    }
    /// Writable `[n_rows]`: the drafts the host accepted in each row, or -1
    /// (the default) for the library's greedy rule. Empty without speculation.
    pub fn n_accepted(&self) -> &'a [Cell<i32>] {
        unsafe { raw_slice(self.raw.n_accepted as *const Cell<i32>, self.n_rows()) }
    }
    /// Device -> device copies (copy-on-write), performed last.
    pub fn copies(&self) -> &'a [Copy] {
        self.t(self.raw.copies, self.raw.n_copies as usize)
    }
    /// Device -> host copies, performed first.
    pub fn swap_out(&self) -> &'a [Copy] {
        self.t(self.raw.swap_out, self.raw.n_swap_out as usize)
    }
    /// Host -> device copies, performed second.
    pub fn swap_in(&self) -> &'a [Copy] {
        self.t(self.raw.swap_in, self.raw.n_swap_in as usize)
    }
    /// `[n_rows]` adapters: the adapter of each row's request (0: none);
    /// empty without `SchedConfig::max_adapters`.
    pub fn row_adapter(&self) -> &'a [u32] {
        self.t(self.raw.row_adapter, self.n_rows())
    }
    /// Adapters: the call's distinct nonzero adapters, at most
    /// `SchedConfig::max_adapters`.
    pub fn n_adapters(&self) -> usize {
        self.raw.n_adapters as usize
    }
    /// `[n_adapters]` those adapters, in the order of their first row: the
    /// host has each loaded for the call.
    pub fn adapters(&self) -> &'a [u32] {
        self.t(self.raw.adapters, self.n_adapters())
    }
    /// Encoder inputs (`SchedConfig::encoder_cache`): inputs to encode in
    /// this call.
    pub fn n_encode(&self) -> usize {
        self.raw.n_encode as usize
    }
    /// `[n_encode]` the inputs to encode, after dropping `encoder_free`:
    /// input `input` of request `req`, whose `len` outputs the host caches
    /// under `cache_id`. A row reads the outputs of every input of its
    /// request whose span it covers; they are cached by then (this call or
    /// an earlier one). Empty without `encoder_cache`.
    pub fn encode(&self) -> &'a [Encode] {
        self.t(self.raw.encode, self.n_encode())
    }
    /// Cache ids whose outputs the host drops first.
    pub fn n_encoder_free(&self) -> usize {
        self.raw.n_encoder_free as usize
    }
    /// `[n_encoder_free]` those ids (ids the host does not hold are
    /// ignored: a failed call's list is sent again). Empty without
    /// `encoder_cache`.
    pub fn encoder_free(&self) -> &'a [u64] {
        self.t(self.raw.encoder_free, self.n_encoder_free())
    }
    /// The scheduler's batch layout (`sys::BKV_BATCH_FLAT` or
    /// `sys::BKV_BATCH_PERSISTENT`).
    pub fn layout(&self) -> sys::bkv_batch_layout {
        self.raw.layout
    }
    /// Persistent layout: row slots `0..n_row_slots()` exist; 0 when flat.
    pub fn n_row_slots(&self) -> usize {
        self.raw.n_row_slots as usize
    }
    /// `[n_rows]` persistent layout: each row's row slot; empty when flat.
    pub fn row_slot(&self) -> &'a [u32] {
        self.t(self.raw.row_slot, self.n_rows())
    }
    /// Persistent layout: the changes to apply, in order, to the host's
    /// copy of the row slots' tables (delta d writes the next `d.n` entries
    /// of [`Batch::delta_blocks`] at `d.start..` of slot `d.slot`'s table,
    /// which then has `d.len` entries); empty when flat.
    pub fn table_deltas(&self) -> &'a [TableDelta] {
        self.t(self.raw.table_deltas, self.raw.n_table_deltas as usize)
    }
    /// Persistent layout: the block ids the table deltas write, in order.
    pub fn delta_blocks(&self) -> &'a [i32] {
        let n = self.table_deltas().iter().map(|d| d.n as usize).sum();
        self.t(self.raw.delta_blocks, n)
    }
    /// The pool's KV groups (1 for a pool without groups).
    pub fn n_groups(&self) -> usize {
        self.raw.n_groups as usize
    }
    /// KV group `g`'s part of the call, `None` for `g >= n_groups()`. Group 0
    /// is the batch's own arrays.
    pub fn group(&self, g: usize) -> Option<BatchGroup<'a>> {
        if g >= self.n_groups() {
            return None;
        }
        let raw = if self.raw.groups.is_null() {
            // a pool without groups: group 0 is the batch's own arrays
            sys::bkv_batch_group {
                kind: sys::BKV_GROUP_FULL as u32,
                span: 0,
                slot_mapping: self.raw.slot_mapping,
                kv_indptr: self.raw.kv_indptr,
                kv_indices: self.raw.kv_indices,
                kv_first_block: ptr::null(),
                row_tables: self.raw.row_tables,
                row_table_len: self.raw.row_table_len,
                state_in: ptr::null(),
                state_out: ptr::null(),
                state_frames: 0,
                state_out_spec: ptr::null(),
            }
        } else {
            // SAFETY: the library's groups array has n_groups elements
            unsafe { *self.raw.groups.add(g) }
        };
        Some(BatchGroup { raw, batch: self.raw })
    }
    /// Every KV group's part of the call, group 0 first.
    pub fn groups(&self) -> impl Iterator<Item = BatchGroup<'a>> + 'a {
        let b = Batch { raw: self.raw };
        (0..self.n_groups()).map(move |g| b.group(g).expect("g < n_groups"))
    }
}

/// One KV group's part of a call (`bkv_batch_group`), borrowed like the
/// [`Batch`] it came from. Every group computes the batch's tokens at the
/// batch's positions; what differs is where its K/V lives. Slices the
/// library does not fill in the call's layout are empty.
#[derive(Clone, Copy)]
pub struct BatchGroup<'a> {
    raw: sys::bkv_batch_group,
    batch: &'a sys::bkv_batch,
}

impl<'a> BatchGroup<'a> {
    /// The group's `bkv_group_kind` (`sys::BKV_GROUP_*`).
    pub fn kind(&self) -> u32 {
        self.raw.kind
    }
    /// Its span (window or chunk, in tokens); 0 for FULL.
    pub fn span(&self) -> u32 {
        self.raw.span
    }
    fn t<T>(&self, p: *const T, n: usize) -> &'a [T] {
        unsafe { raw_slice(p, n) }
    }
    /// `[n_tokens]` where each new token's K/V is written in this group
    /// (block * block_tokens + offset).
    pub fn slot_mapping(&self) -> &'a [i32] {
        self.t(self.raw.slot_mapping, self.batch.n_tokens as usize)
    }
    /// Flat: `[n_rows + 1]`, row r's blocks in this group are
    /// `kv_indices[kv_indptr[r]..kv_indptr[r + 1]]`.
    pub fn kv_indptr(&self) -> &'a [i32] {
        if self.raw.kv_indptr.is_null() {
            return &[];
        }
        self.t(self.raw.kv_indptr, self.batch.n_rows as usize + 1)
    }
    /// Flat: each row's blocks from its first one read on (a window or
    /// chunked group lists only the blocks its row's tokens read).
    pub fn kv_indices(&self) -> &'a [i32] {
        let n = self.kv_indptr().last().map_or(0, |&x| x as usize);
        self.t(self.raw.kv_indices, n)
    }
    /// Flat: `[n_rows]` the logical index of each row's first entry in
    /// `kv_indices`. Empty for group 0 of a pool without groups, whose rows
    /// all start at block 0.
    pub fn kv_first_block(&self) -> &'a [i32] {
        self.t(self.raw.kv_first_block, self.batch.n_rows as usize)
    }
    /// Persistent: `[n_row_slots]` entries of each slot's table.
    pub fn row_table_len(&self) -> &'a [u32] {
        self.t(self.raw.row_table_len, self.batch.n_row_slots as usize)
    }
    /// Persistent: this group's table of row slot `slot`, valid for the
    /// slots of this call's rows (-1 where a window released a block); empty
    /// when flat or for a slot out of range.
    pub fn row_table(&self, slot: usize) -> &'a [i32] {
        if self.raw.row_tables.is_null() || slot >= self.batch.n_row_slots as usize {
            return &[];
        }
        let n = self.row_table_len()[slot] as usize;
        // SAFETY: row_tables has n_row_slots entries
        self.t(unsafe { *self.raw.row_tables.add(slot) }, n)
    }
    fn state(&self, p: *const i32) -> Option<&'a [i32]> {
        if self.raw.kind != sys::BKV_GROUP_STATE as u32 {
            return None;
        }
        Some(self.t(p, self.batch.n_rows as usize))
    }
    /// STATE: `[n_rows]` the first frame of the state unit each row reads
    /// its initial state from; -1 is the zero state (the row starts at
    /// position 0). `None` for an attention group.
    pub fn state_in(&self) -> Option<&'a [i32]> {
        self.state(self.raw.state_in)
    }
    /// STATE: `[n_rows]` the first frame of the unit each row writes its
    /// state after its last token to (never a unit a row of the call
    /// reads: states are written out of place). `None` for an attention
    /// group.
    pub fn state_out(&self) -> Option<&'a [i32]> {
        self.state(self.raw.state_out)
    }
    /// STATE: the consecutive frames of one unit
    /// ([`kv_state_frames`]); 0 for an attention group.
    pub fn state_frames(&self) -> u32 {
        self.raw.state_frames
    }
    /// STATE with speculation: indexed like the tokens of the decode rows,
    /// the first frame of the unit the host writes the state after each
    /// token to (a row with k drafts: its tokens 0..k; a row without: its
    /// `state_out`). The commit keeps the state after the last delivered
    /// token. `None` when the call has no draft, and for other groups.
    pub fn state_out_spec(&self) -> Option<&'a [i32]> {
        if self.raw.kind != sys::BKV_GROUP_STATE as u32 || self.raw.state_out_spec.is_null() {
            return None;
        }
        // SAFETY: qo_indptr has n_rows + 1 entries, n_decode_rows <= n_rows
        let n = unsafe { *self.batch.qo_indptr.add(self.batch.n_decode_rows as usize) };
        Some(self.t(self.raw.state_out_spec, n as usize))
    }
}

// ----------------------------------------------------------- the host ----

/// A host compute call failed (the step is rolled back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFailed;

/// Why a request ended (`bkv_finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Length,
    Stop,
    Abort,
    Error,
}

/// The host: its kernels and notifications (`bkv_host_ops`). A scheduler made
/// with [`Scheduler::new`] calls `forward` (mixed batches); one made with
/// [`Scheduler::new_split`] calls `prefill` and `decode` (which default to
/// `forward`). Every method runs on the stepping thread, inside `step`.
pub trait Host {
    /// Compute one batch; write a token into `next_tokens[r]` for every row
    /// with `batch.row_sample()[r] != 0` (`BKV_TOKEN_FAIL` fails that
    /// request). `Err` or a panic fails the call and rolls the step back.
    fn forward(&mut self, batch: &Batch<'_>, next_tokens: &mut [i32])
        -> std::result::Result<(), HostFailed>;
    /// A split host's prefill call.
    fn prefill(&mut self, batch: &Batch<'_>, next_tokens: &mut [i32])
        -> std::result::Result<(), HostFailed> {
        self.forward(batch, next_tokens)
    }
    /// A split host's decode call.
    fn decode(&mut self, batch: &Batch<'_>, next_tokens: &mut [i32])
        -> std::result::Result<(), HostFailed> {
        self.forward(batch, next_tokens)
    }
    /// false: the library calls no `on_token` (a host that reads each
    /// step's tokens from [`Scheduler::outputs`] saves a call per token).
    const HAS_ON_TOKEN: bool = true;
    /// A token reached a request's branch (`user`: [`Request::user`]).
    fn on_token(&mut self, _req: u64, _branch: u32, _token: i32, _user: usize) {}
    /// A request ended (exactly once per request).
    fn on_finish(&mut self, _req: u64, _reason: FinishReason, _user: usize) {}
    /// true: overlapped scheduling (`SchedConfig::overlap = N`, 1..
    /// [`OVERLAP_MAX_DEPTH`]): the library calls `launch`, and
    /// [`Scheduler::launch`] / [`Scheduler::complete`] drive the two-phase
    /// step, up to N steps in flight while the next is planned.
    const HAS_LAUNCH: bool = false;
    /// Enqueue the batch on the device and return at once: copy what the
    /// device reads later (the batch is borrowed for this call only); the
    /// tokens go to [`Scheduler::complete`]. Placeholders in `token_ids`
    /// ([`token_is_pending`]) stand for tokens steps still outstanding
    /// sample: [`token_pending_at`]`(back, i)` is row `i` of the step
    /// launched `back` launches before ([`resolve_placeholders`]).
    fn launch(&mut self, _batch: &Batch<'_>) -> std::result::Result<(), HostFailed> {
        Err(HostFailed)
    }
    /// true: speculative decoding's drafts come from `draft`
    /// (`SchedConfig::spec_drafts = BKV_SPEC_DRAFT_HOST`).
    const HAS_DRAFT: bool = false;
    /// Propose up to `out.len()` tokens to follow `ctx` (the branch's known
    /// tokens); returns how many it wrote (used when `HAS_DRAFT`).
    fn draft(&mut self, _req: u64, _branch: u32, _ctx: &[i32], _out: &mut [i32], _user: usize)
        -> usize {
        0
    }
    /// true: the library reads the clock from `now_us` (else its monotonic one).
    const HAS_CLOCK: bool = false;
    /// Microseconds of the host's clock (used when `HAS_CLOCK`).
    fn now_us(&mut self) -> u64 {
        0
    }
}

// ------------------------------------------------------- KV connector ----

/// One block of a connector transfer (`bkv_kv_xfer_block`): its chained
/// `hash` in its `group`, logical `index`, device `block` (a state's first
/// frame) and `frames` (1 for an attention block).
pub type XferBlock = sys::bkv_kv_xfer_block;

/// [`KvConnector::lookup`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The store holds this many of the leading hashes (more is taken as
    /// all of them).
    Blocks(u32),
    /// Cannot tell yet (`BKV_CONNECTOR_LATER`): the request waits off the
    /// queue and is asked again at a later step.
    Later,
    /// The store failed; taken as 0 (`SchedStats::kv_lookup_errors`).
    Error,
}

/// A connector transfer could not start: a load's blocks are recomputed, a
/// save's are released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XferFailed;

/// A KV connector (`bkv_connector`): an external store of KV blocks keyed by
/// their chained hashes, implemented by the host itself (the loads and
/// saves move the host's device KV), plugged in with
/// [`Scheduler::with_connector`]. Every method runs on the stepping thread
/// inside `step` (or `launch`/`complete`, `release_kv`), like the host's;
/// a panic is caught there and resumed to the caller after the call, the
/// callback counting as failed ([`Lookup::Error`], [`XferFailed`], a block
/// not held).
///
/// Each load and save gets an id (`xfer`) and completes by
/// [`XferDone::done`] (or [`Scheduler::xfer_done`]) with that id, from any
/// thread, also from inside the call that started it: `done` is the
/// scheduler's handle, clone it to complete later. The `blocks` slice is
/// borrowed for the call: copy what the transfer needs.
pub trait KvConnector {
    /// How many of the prompt's leading full blocks (`hashes`: group 0's
    /// chained hashes, the block of the last prompt token excluded) the
    /// store holds, counted from the first.
    fn lookup(&mut self, req: u64, hashes: &[u64]) -> Lookup;
    /// Start loading `blocks` of request `req` into the device blocks they
    /// name.
    fn load(&mut self, done: &XferDone, xfer: u64, req: u64, blocks: &[XferBlock])
        -> std::result::Result<(), XferFailed>;
    /// false: the connector only loads (no `save`).
    const HAS_SAVE: bool = true;
    /// Start saving `blocks` (computed, full, held by the library until the
    /// save completes) to the store.
    fn save(&mut self, _done: &XferDone, _xfer: u64, _blocks: &[XferBlock])
        -> std::result::Result<(), XferFailed> {
        Err(XferFailed)
    }
    /// true: the library calls `preempted`.
    const HAS_PREEMPTED: bool = false;
    /// Request `req` was preempted (its device KV is dropped or swapped).
    fn preempted(&mut self, _req: u64) {}
    /// true: the library calls `contains` (`bkv_connector.contains`).
    const HAS_CONTAINS: bool = false;
    /// Whether the store holds the block of chained hash `hash` (any
    /// group's). With it a pool with KV groups ends a load where every
    /// group's blocks are held; without it (`HAS_CONTAINS` false) loads end
    /// where `lookup` said and a group's missing block fails the load. A
    /// panic counts as not held.
    fn contains(&mut self, _hash: u64) -> bool {
        false
    }
    /// Most blocks in one save call (`bkv_connector.save_blocks`; 0 = 256).
    const SAVE_BLOCKS: u32 = 0;
    /// Most save transfers outstanding (`bkv_connector.max_saves`; 0 = 64).
    const MAX_SAVES: u32 = 0;
}

/// The scheduler behind an [`XferDone`]: null once it is destroyed.
struct XferLink {
    sched: RwLock<*mut sys::bkv_sched>,
}

// SAFETY: the pointer is only handed to bkv_kv_xfer_done (any thread: it
// takes the scheduler's inbox lock), under the read lock, while the
// scheduler lives; the scheduler's drop nulls it under the write lock before
// bkv_sched_destroy.
unsafe impl Send for XferLink {}
unsafe impl Sync for XferLink {}

/// Completes connector transfers (`bkv_kv_xfer_done`) from any thread: a
/// handle on a scheduler that does not keep it alive ([`Scheduler::xfer_handle`],
/// or the `done` a [`KvConnector`] callback receives). Once the scheduler is
/// dropped, `done` answers `Err(Error::State)`.
#[derive(Clone)]
pub struct XferDone {
    link: Arc<XferLink>,
}

impl fmt::Debug for XferDone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("XferDone")
    }
}

fn xfer_done_raw(s: *mut sys::bkv_sched, xfer: u64, status: i32, failed: &[u32]) -> Result<()> {
    let p = if failed.is_empty() { ptr::null() } else { failed.as_ptr() };
    check_named(unsafe { sys::bkv_kv_xfer_done(s, xfer, status, p, failed.len() as u32) })
        .map(|_| ())
}

impl XferDone {
    /// Complete transfer `xfer`: every block it named is done except the
    /// indices (into that call's blocks) in `failed`; a negative `status`
    /// fails it whole. Takes effect at the next step. `Err(NotFound)`: no
    /// transfer in flight has that id (unknown or already completed);
    /// `Err(InvalidArgument)`: an index past its blocks (nothing changes on
    /// an error); `Err(State)`: the scheduler is gone.
    pub fn done(&self, xfer: u64, status: i32, failed: &[u32]) -> Result<()> {
        let s = self.link.sched.read().unwrap_or_else(|e| e.into_inner());
        if s.is_null() {
            return Err(Error::State);
        }
        xfer_done_raw(*s, xfer, status, failed)
    }
}

unsafe extern "C" fn cn_lookup_cb<H: KvConnector>(h: *mut c_void, req: u64, hashes: *const u64,
                                                  n: u32) -> c_int {
    let cell = &*(h as *const HostCell<H>);
    let hashes = raw_slice(hashes, n as usize);
    guarded(cell, -1, |h| match h.lookup(req, hashes) {
        Lookup::Blocks(k) => k.min(n).min(i32::MAX as u32) as c_int,
        Lookup::Later => sys::BKV_CONNECTOR_LATER,
        Lookup::Error => -1,
    })
}

unsafe extern "C" fn cn_load_cb<H: KvConnector>(h: *mut c_void, xfer: u64, req: u64,
                                                blocks: *const XferBlock, n: u32) -> c_int {
    let cell = &*(h as *const HostCell<H>);
    let blocks = raw_slice(blocks, n as usize);
    let done = XferDone { link: cell.xfer.clone() };
    guarded(cell, -1, |h| match h.load(&done, xfer, req, blocks) {
        Ok(()) => 0,
        Err(XferFailed) => -1,
    })
}

unsafe extern "C" fn cn_save_cb<H: KvConnector>(h: *mut c_void, xfer: u64,
                                                blocks: *const XferBlock, n: u32) -> c_int {
    let cell = &*(h as *const HostCell<H>);
    let blocks = raw_slice(blocks, n as usize);
    let done = XferDone { link: cell.xfer.clone() };
    guarded(cell, -1, |h| match h.save(&done, xfer, blocks) {
        Ok(()) => 0,
        Err(XferFailed) => -1,
    })
}

unsafe extern "C" fn cn_preempted_cb<H: KvConnector>(h: *mut c_void, req: u64) {
    let cell = &*(h as *const HostCell<H>);
    guarded(cell, (), |h| h.preempted(req))
}

unsafe extern "C" fn cn_contains_cb<H: KvConnector>(h: *mut c_void, hash: u64) -> c_int {
    let cell = &*(h as *const HostCell<H>);
    guarded(cell, 0, |h| h.contains(hash) as c_int)
}

fn connector_ops<H: Host + KvConnector>() -> sys::bkv_connector {
    sys::bkv_connector {
        lookup: Some(cn_lookup_cb::<H>),
        load: Some(cn_load_cb::<H>),
        save: if H::HAS_SAVE { Some(cn_save_cb::<H>) } else { None },
        preempted: if H::HAS_PREEMPTED { Some(cn_preempted_cb::<H>) } else { None },
        user: ptr::null_mut(), // set to the host cell by create
        save_blocks: H::SAVE_BLOCKS,
        max_saves: H::MAX_SAVES,
        contains: if H::HAS_CONTAINS { Some(cn_contains_cb::<H>) } else { None },
    }
}

/// A request (`bkv_request`); the arrays are copied by `submit`.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub prompt: &'a [i32],
    pub max_new_tokens: u32,
    pub stop_tokens: &'a [i32],
    pub priority: i32,
    pub cache_key: u64,
    /// samples (forked branches), >= 1
    pub n: u32,
    pub predicted_output: u32,
    /// handed back in callbacks and `Batch::row_user` (an index, a key)
    pub user: usize,
    /// retention ranges of the prompt (`bkv_request.retention`; needs
    /// `SchedConfig::retention = 1`)
    pub retention: &'a [RetentionRange],
    /// the adapter (LoRA) its rows run with, 0 = none (`bkv_request.adapter`;
    /// nonzero needs `SchedConfig::max_adapters`); its blocks are cached
    /// under [`adapter_cache_key`]`(cache_key, adapter)`
    pub adapter: u32,
    /// encoder inputs (images, audio) of the prompt (`bkv_request.inputs`,
    /// at most `sys::BKV_MAX_ENCODER_INPUTS`; needs
    /// `SchedConfig::encoder_cache`): spans ordered and inside the prompt,
    /// holding [`encoder_token`]`(cache_id, i)` in every batch
    pub inputs: &'a [EncoderInput],
}

/// One change to a row slot's table (`bkv_table_delta`, persistent layout).
pub type TableDelta = sys::bkv_table_delta;

/// A retention range of a request's prompt (`bkv_retention_range`).
pub type RetentionRange = sys::bkv_retention_range;

/// An encoder input of a request's prompt (`bkv_encoder_input`): the
/// embeddings of positions `[token_start, token_start + token_len)`.
pub type EncoderInput = sys::bkv_encoder_input;

impl EncoderInput {
    /// An input `cache_id` (nonzero: equal ids share outputs and KV) over
    /// `token_len` positions from `token_start`; `cost` its encoder work
    /// (0 = `token_len`).
    pub fn new(cache_id: u64, token_start: u32, token_len: u32, cost: u32) -> EncoderInput {
        EncoderInput { cache_id, token_start, token_len, cost, pad: 0 }
    }
}

/// An input to encode (`bkv_encode`, [`Batch::encode`]).
pub type Encode = sys::bkv_encode;

impl<'a> Request<'a> {
    /// A request with `bkv_request_init`'s defaults (n = 1).
    pub fn new(prompt: &'a [i32], max_new_tokens: u32) -> Request<'a> {
        Request { prompt, max_new_tokens, stop_tokens: &[], priority: 0, cache_key: 0, n: 1,
                  predicted_output: 0, user: 0, retention: &[], adapter: 0, inputs: &[] }
    }
}

struct HostCell<H> {
    host: UnsafeCell<H>,
    panic: Cell<Option<Box<dyn Any + Send + 'static>>>,
    /// the last launch callback's next_tokens array and its rows (overlap)
    launched: Cell<(*mut i32, usize)>,
    /// the scheduler, for the connector's XferDone handles
    xfer: Arc<XferLink>,
}

/// Run a callback body, catching a panic into the cell (never unwinding into C).
fn guarded<H, R>(cell: &HostCell<H>, fail: R, f: impl FnOnce(&mut H) -> R) -> R {
    // SAFETY: callbacks run inside step, which holds the stepping flag: the
    // only live reference to the host.
    let h = unsafe { &mut *cell.host.get() };
    match panic::catch_unwind(AssertUnwindSafe(|| f(h))) {
        Ok(r) => r,
        Err(p) => {
            let old = cell.panic.take();
            cell.panic.set(Some(old.unwrap_or(p)));
            fail
        }
    }
}

type ComputeFn<H> = fn(&mut H, &Batch<'_>, &mut [i32]) -> std::result::Result<(), HostFailed>;

unsafe fn compute<H: Host>(host: *mut c_void, b: *const sys::bkv_batch, next: *mut i32,
                           f: ComputeFn<H>) -> c_int {
    let cell = &*(host as *const HostCell<H>);
    let b = &*b;
    let batch = Batch { raw: b };
    let nt: &mut [i32] = if next.is_null() || b.n_rows == 0 {
        &mut []
    } else {
        slice::from_raw_parts_mut(next, b.n_rows as usize)
    };
    guarded(cell, -1, |h| match f(h, &batch, nt) {
        Ok(()) => 0,
        Err(HostFailed) => -1,
    })
}

unsafe extern "C" fn launch_cb<H: Host>(h: *mut c_void, b: *const sys::bkv_batch,
                                         n: *mut i32) -> c_int {
    let cell = &*(h as *const HostCell<H>);
    let b = &*b;
    cell.launched.set((n, b.n_rows as usize));
    let batch = Batch { raw: b };
    guarded(cell, -1, |h| match h.launch(&batch) {
        Ok(()) => 0,
        Err(HostFailed) => -1,
    })
}

unsafe extern "C" fn forward_cb<H: Host>(h: *mut c_void, b: *const sys::bkv_batch,
                                          n: *mut i32) -> c_int {
    compute::<H>(h, b, n, H::forward)
}

unsafe extern "C" fn prefill_cb<H: Host>(h: *mut c_void, b: *const sys::bkv_batch,
                                          n: *mut i32) -> c_int {
    compute::<H>(h, b, n, H::prefill)
}

unsafe extern "C" fn decode_cb<H: Host>(h: *mut c_void, b: *const sys::bkv_batch,
                                         n: *mut i32) -> c_int {
    compute::<H>(h, b, n, H::decode)
}

unsafe extern "C" fn token_cb<H: Host>(h: *mut c_void, req: u64, branch: u32, token: i32,
                                        user: *mut c_void) {
    let cell = &*(h as *const HostCell<H>);
    guarded(cell, (), |h| h.on_token(req, branch, token, user as usize))
}

unsafe extern "C" fn finish_cb<H: Host>(h: *mut c_void, req: u64, why: sys::bkv_finish_reason,
                                         user: *mut c_void) {
    let cell = &*(h as *const HostCell<H>);
    let why = match why {
        sys::BKV_FINISH_LENGTH => FinishReason::Length,
        sys::BKV_FINISH_STOP => FinishReason::Stop,
        sys::BKV_FINISH_ABORT => FinishReason::Abort,
        _ => FinishReason::Error,
    };
    guarded(cell, (), |h| h.on_finish(req, why, user as usize))
}

unsafe extern "C" fn draft_cb<H: Host>(h: *mut c_void, req: u64, branch: u32, ctx: *const i32,
                                        n_ctx: u32, out: *mut i32, k: u32,
                                        user: *mut c_void) -> c_int {
    let cell = &*(h as *const HostCell<H>);
    let ctx = raw_slice(ctx, n_ctx as usize);
    let out = if out.is_null() || k == 0 { &mut [][..] } else {
        std::slice::from_raw_parts_mut(out, k as usize)
    };
    guarded(cell, 0, |h| h.draft(req, branch, ctx, out, user as usize).min(k as usize) as c_int)
}

unsafe extern "C" fn clock_cb<H: Host>(h: *mut c_void) -> u64 {
    let cell = &*(h as *const HostCell<H>);
    guarded(cell, 0, |h| h.now_us())
}

// ------------------------------------------------------------- scheduler --

/// An outstanding overlapped step ([`Scheduler::launch`]); consumed by
/// [`Scheduler::complete`].
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    n_rows: usize,
}

impl Ticket {
    /// The step's number (`bkv_step_launch`'s ticket).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Rows of the launched batch: the tokens [`Scheduler::complete`] takes.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }
}

/// What [`Scheduler::launch`] did.
#[derive(Debug)]
pub enum Launch {
    /// A step was launched: complete it with its ticket.
    Step(Ticket),
    /// Nothing to compute: complete the oldest outstanding step, then
    /// launch again.
    Nothing,
    /// The plan needs the tokens of the steps in flight (`BKV_EAGAIN`):
    /// complete every outstanding step.
    Busy,
}

/// What a step delivered (`bkv_step_outputs`): per token its request, branch
/// and id, in `on_token`'s order; per ended request its id and
/// `bkv_finish_reason`, in `on_finish`'s order. Borrowed from the scheduler
/// until the next step.
#[derive(Debug)]
pub struct StepOutputs<'s> {
    pub token_req: &'s [u64],
    pub token_branch: &'s [u32],
    pub token_ids: &'s [i32],
    pub finished_req: &'s [u64],
    pub finished_reason: &'s [i32],
}

/// A scheduler (`bkv_sched`) over a pool borrowed for `'pool`, driving a host
/// `H`. See the crate documentation for its thread rules.
pub struct Scheduler<'pool, H: Host> {
    raw: NonNull<sys::bkv_sched>,
    host: Box<HostCell<H>>,
    /// outstanding overlapped steps: ticket, its next_tokens, its rows
    /// (written under the stepping flag only)
    tickets: UnsafeCell<Vec<(u64, *mut i32, usize)>>,
    stepping: AtomicBool,
    pool: *mut sys::bkv_pool,
    pool_id: u64,
    _pool: PhantomData<&'pool mut Pool>,
}

// SAFETY: bkv_submit, bkv_abort and bkv_sched_pending may run on any thread
// concurrently with bkv_step (the header); every other call, and every use of
// the host, happens under the `stepping` flag, one thread at a time, so the
// host only needs to be Send.
unsafe impl<'pool, H: Host + Send> Send for Scheduler<'pool, H> {}
unsafe impl<'pool, H: Host + Send> Sync for Scheduler<'pool, H> {}

/// Holds the stepping flag; released on drop.
struct Exclusive<'s>(&'s AtomicBool);

impl<'s> Drop for Exclusive<'s> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<'pool, H: Host> Scheduler<'pool, H> {
    /// `bkv_sched_create` with a mixed-batch host (`Host::forward`).
    pub fn new(pool: &'pool mut Pool, host: H, cfg: &SchedConfig,
               cost: Option<&'pool mut dyn CostModel>) -> Result<Self> {
        Self::create(pool, host, cfg, cost, false, None)
    }

    /// `bkv_sched_create` with a split host (`Host::prefill`, `Host::decode`).
    pub fn new_split(pool: &'pool mut Pool, host: H, cfg: &SchedConfig,
                     cost: Option<&'pool mut dyn CostModel>) -> Result<Self> {
        Self::create(pool, host, cfg, cost, true, None)
    }

    /// `bkv_sched_create` with a mixed-batch host that is also a KV
    /// connector (`bkv_sched_config.connector`; the pool needs its prefix
    /// cache, else `Err(InvalidArgument)`). `cfg.connector` is ignored by
    /// every constructor: only this one (and
    /// [`Scheduler::with_connector_split`]) sets it.
    pub fn with_connector(pool: &'pool mut Pool, host: H, cfg: &SchedConfig,
                          cost: Option<&'pool mut dyn CostModel>) -> Result<Self>
    where H: KvConnector {
        Self::create(pool, host, cfg, cost, false, Some(connector_ops::<H>()))
    }

    /// [`Scheduler::with_connector`] with a split host.
    pub fn with_connector_split(pool: &'pool mut Pool, host: H, cfg: &SchedConfig,
                                cost: Option<&'pool mut dyn CostModel>) -> Result<Self>
    where H: KvConnector {
        Self::create(pool, host, cfg, cost, true, Some(connector_ops::<H>()))
    }

    fn create(pool: &'pool mut Pool, host: H, cfg: &SchedConfig,
              cost: Option<&'pool mut dyn CostModel>, split: bool,
              mut conn: Option<sys::bkv_connector>) -> Result<Self> {
        let mut c = *cfg;
        c.size = std::mem::size_of::<SchedConfig>() as u32;
        c.connector = ptr::null();
        if let Some(m) = cost {
            c.cost = m.raw_model();
        }
        let mut ops = zeroed::<sys::bkv_host_ops>();
        if split {
            ops.prefill = Some(prefill_cb::<H>);
            ops.decode = Some(decode_cb::<H>);
        } else {
            ops.forward = Some(forward_cb::<H>);
        }
        if H::HAS_ON_TOKEN {
            ops.on_token = Some(token_cb::<H>);
        }
        ops.on_finish = Some(finish_cb::<H>);
        if H::HAS_CLOCK {
            ops.now_us = Some(clock_cb::<H>);
        }
        if H::HAS_DRAFT {
            ops.draft = Some(draft_cb::<H>);
        }
        if H::HAS_LAUNCH {
            ops.launch = Some(launch_cb::<H>);
        }
        let xfer = Arc::new(XferLink { sched: RwLock::new(ptr::null_mut()) });
        let host = Box::new(HostCell { host: UnsafeCell::new(host), panic: Cell::new(None),
                                       launched: Cell::new((ptr::null_mut(), 0)),
                                       xfer: xfer.clone() });
        let user = &*host as *const HostCell<H> as *mut c_void;
        if let Some(cn) = conn.as_mut() {
            cn.user = user;
            c.connector = cn; // copied by bkv_sched_create
        }
        let mut s = ptr::null_mut();
        check_named(unsafe {
            sys::bkv_sched_create(&c, pool.as_ptr(), &ops, user, ptr::null(), &mut s)
        })?;
        let raw = NonNull::new(s).ok_or(Error::OutOfMemory)?;
        *xfer.sched.write().unwrap_or_else(|e| e.into_inner()) = s;
        Ok(Scheduler { raw, host,
                       tickets: UnsafeCell::new(Vec::new()),
                       stepping: AtomicBool::new(false), pool: pool.as_ptr(), pool_id: pool.id,
                       _pool: PhantomData })
    }

    fn exclusive(&self) -> Result<Exclusive<'_>> {
        if self.stepping.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return Err(Error::State);
        }
        Ok(Exclusive(&self.stepping))
    }

    /// `bkv_submit` (any thread): returns the request id.
    pub fn submit(&self, req: &Request<'_>) -> Result<u64> {
        let mut q = zeroed::<sys::bkv_request>();
        unsafe { sys::bkv_request_init(&mut q) };
        q.prompt = req.prompt.as_ptr();
        q.prompt_len = req.prompt.len() as u32;
        q.max_new_tokens = req.max_new_tokens;
        q.stop_tokens = if req.stop_tokens.is_empty() { ptr::null() } else { req.stop_tokens.as_ptr() };
        q.n_stop = req.stop_tokens.len() as u32;
        q.priority = req.priority;
        q.cache_key = req.cache_key;
        q.n = req.n;
        q.predicted_output = req.predicted_output;
        q.user = req.user as *mut c_void;
        q.retention = if req.retention.is_empty() { ptr::null() } else { req.retention.as_ptr() };
        q.n_retention = req.retention.len() as u32;
        q.adapter = req.adapter;
        q.inputs = if req.inputs.is_empty() { ptr::null() } else { req.inputs.as_ptr() };
        q.n_inputs = req.inputs.len() as u32;
        let mut id = 0;
        check_named(unsafe { sys::bkv_submit(self.raw.as_ptr(), &q, &mut id) })?;
        Ok(id)
    }

    /// `bkv_abort` (any thread): the request ends with `Abort` at the next step.
    pub fn abort(&self, req_id: u64) -> Result<()> {
        check(unsafe { sys::bkv_abort(self.raw.as_ptr(), req_id) }).map(|_| ())
    }

    /// `bkv_kv_xfer_done` (any thread; also from the connector's own
    /// callbacks): complete connector transfer `xfer` (see
    /// [`XferDone::done`]).
    pub fn xfer_done(&self, xfer: u64, status: i32, failed: &[u32]) -> Result<()> {
        xfer_done_raw(self.raw.as_ptr(), xfer, status, failed)
    }

    /// A handle completing this scheduler's connector transfers from any
    /// thread, `Send + Sync + 'static`; it answers `Err(State)` once the
    /// scheduler is dropped.
    pub fn xfer_handle(&self) -> XferDone {
        XferDone { link: self.host.xfer.clone() }
    }

    /// `bkv_sched_pending` (any thread): requests not yet ended.
    pub fn pending(&self) -> u64 {
        unsafe { sys::bkv_sched_pending(self.raw.as_ptr()) }
    }

    /// `bkv_step`: one iteration. `Err(Host)` when a compute callback
    /// returned `Err` (rolled back; step again); a callback's panic is
    /// resumed here after the library finished the step. `Err(State)` while
    /// another step runs.
    pub fn step(&self) -> Result<StepInfo> {
        let _x = self.exclusive()?;
        let mut info = zeroed::<StepInfo>();
        let rc = unsafe { sys::bkv_step(self.raw.as_ptr(), &mut info) };
        if let Some(p) = self.host.panic.take() {
            drop(_x);
            panic::resume_unwind(p);
        }
        check(rc)?;
        Ok(info)
    }

    /// `bkv_step_launch` (overlapped scheduling, a host with `HAS_LAUNCH`):
    /// plan the next step while up to `SchedConfig::overlap` steps run, and
    /// hand it to `Host::launch`. [`Launch::Step`] carries its ticket, which
    /// [`Scheduler::complete`] consumes (a step cannot be completed twice);
    /// [`Launch::Nothing`]: nothing to compute (complete the oldest
    /// outstanding step, launch again); [`Launch::Busy`]: the plan needs the
    /// tokens of the steps in flight first (`BKV_EAGAIN`: complete every
    /// outstanding step). With `overlap + 1` steps outstanding complete the
    /// oldest before launching (else `Err(State)`).
    pub fn launch(&self) -> Result<Launch> {
        let _x = self.exclusive()?;
        let mut t = 0u64;
        let rc = unsafe { sys::bkv_step_launch(self.raw.as_ptr(), &mut t, ptr::null_mut()) };
        if let Some(p) = self.host.panic.take() {
            drop(_x);
            panic::resume_unwind(p);
        }
        if rc == sys::BKV_EAGAIN {
            return Ok(Launch::Busy);
        }
        check(rc)?;
        if t == 0 {
            return Ok(Launch::Nothing);
        }
        let (p, n) = self.host.launched.get();
        // SAFETY: under the stepping flag, the only access
        unsafe { (*self.tickets.get()).push((t, p, n)) };
        Ok(Launch::Step(Ticket { id: t, n_rows: n }))
    }

    /// `bkv_step_complete` of the oldest outstanding step: `Some(tokens)`
    /// (one per row of the launched batch; rows that do not sample are not
    /// read) when the device ran it, `None` when it failed (every
    /// outstanding step then fails: complete each; the last completion rolls
    /// them back, `Err(Host)`). `Err(InvalidArgument)` for a token count
    /// other than the ticket's rows (the step is then completed as failed).
    pub fn complete(&self, ticket: Ticket, tokens: Option<&[i32]>) -> Result<StepInfo> {
        let _x = self.exclusive()?;
        // SAFETY: under the stepping flag, the only access
        let tickets = unsafe { &mut *self.tickets.get() };
        let at = tickets.iter().position(|e| e.0 == ticket.id).ok_or(Error::InvalidArgument)?;
        let (_, p, n) = tickets[at];
        let mut status = if tokens.is_some() { 0 } else { -1 };
        let mut bad = false;
        if let Some(tk) = tokens {
            if tk.len() != n {
                status = -1;
                bad = true;
            } else if n > 0 {
                // SAFETY: the launch's next_tokens holds n entries until the
                // step completes, which happens only here
                unsafe { std::slice::from_raw_parts_mut(p, n) }.copy_from_slice(tk);
            }
        }
        let mut info = zeroed::<StepInfo>();
        let rc = unsafe { sys::bkv_step_complete(self.raw.as_ptr(), ticket.id, status, &mut info) };
        if rc != sys::BKV_EINVAL && rc != sys::BKV_ESTATE {
            tickets.remove(at);
        }
        if let Some(p) = self.host.panic.take() {
            drop(_x);
            panic::resume_unwind(p);
        }
        if bad {
            return Err(Error::InvalidArgument);
        }
        check(rc)?;
        Ok(info)
    }

    /// `step` until nothing is pending; returns the steps taken.
    pub fn run(&self) -> Result<u64> {
        let mut n = 0;
        while self.pending() > 0 {
            self.step()?;
            n += 1;
        }
        Ok(n)
    }

    /// `bkv_sched_stats_get` (not during a step: `Err(State)`).
    pub fn stats(&self) -> Result<SchedStats> {
        let _x = self.exclusive()?;
        let mut s = zeroed::<SchedStats>();
        s.size = std::mem::size_of::<SchedStats>() as u32;
        unsafe { sys::bkv_sched_stats_get(self.raw.as_ptr(), &mut s) };
        Ok(s)
    }

    /// `bkv_sched_kv_release`: give the device KV memory back (`mode`:
    /// `sys::BKV_RELEASE_REFUSE`, `_RECOMPUTE` or `_SWAP`; with swap, make
    /// the pool's pending swap-out copies and clear them before freeing the
    /// memory). Until [`Scheduler::resume_kv`] a step only drains.
    pub fn release_kv(&self, mode: sys::bkv_kv_release_mode) -> Result<()> {
        let _x = self.exclusive()?;
        let rc = unsafe { sys::bkv_sched_kv_release(self.raw.as_ptr(), mode) };
        if let Some(p) = self.host.panic.take() { // a connector's save it called
            drop(_x);
            panic::resume_unwind(p);
        }
        check_named(rc).map(|_| ())
    }

    /// `bkv_sched_kv_resume`: take the device KV memory again.
    pub fn resume_kv(&self) -> Result<()> {
        let _x = self.exclusive()?;
        check(unsafe { sys::bkv_sched_kv_resume(self.raw.as_ptr()) }).map(|_| ())
    }

    /// `bkv_sched_wait`: block until a request is pending (`Ok(true)`),
    /// [`Scheduler::wake`] is called or `timeout` passes (`Ok(false)`);
    /// `None`: no limit. On the stepping thread, between steps.
    pub fn wait(&self, timeout: Option<std::time::Duration>) -> Result<bool> {
        let _x = self.exclusive()?;
        let us = timeout.map_or(u64::MAX, |d| d.as_micros().min(u64::MAX as u128 - 1) as u64);
        match unsafe { sys::bkv_sched_wait(self.raw.as_ptr(), us) } {
            sys::BKV_EAGAIN => Ok(false),
            rc => check(rc).map(|_| true),
        }
    }

    /// `bkv_sched_wake` (any thread): ends a [`Scheduler::wait`] now.
    pub fn wake(&self) -> Result<()> {
        check(unsafe { sys::bkv_sched_wake(self.raw.as_ptr()) }).map(|_| ())
    }

    /// `bkv_sched_outputs_enable`: record each step's outputs as arrays
    /// (read with [`Scheduler::outputs`]); `false` stops and frees them.
    pub fn enable_outputs(&mut self, on: bool) -> Result<()> {
        let _x = self.exclusive()?;
        check(unsafe { sys::bkv_sched_outputs_enable(self.raw.as_ptr(), on as c_int) }).map(|_| ())
    }

    /// `bkv_sched_outputs_get`: what the last step delivered, as slices of
    /// the scheduler's arrays. They borrow the scheduler mutably, so no step
    /// can run while they are alive (the arrays change at the next step):
    /// misuse is a compile error. `Err(State)` when outputs are off.
    pub fn outputs(&mut self) -> Result<StepOutputs<'_>> {
        let _x = self.exclusive()?;
        let mut o = zeroed::<sys::bkv_step_outputs>();
        o.size = std::mem::size_of::<sys::bkv_step_outputs>() as u32;
        check(unsafe { sys::bkv_sched_outputs_get(self.raw.as_ptr(), &mut o) })?;
        // SAFETY: the library's arrays hold n_tokens / n_finished entries
        // and stay unchanged until the next step, which the &mut borrow of
        // the returned value rules out.
        unsafe {
            Ok(StepOutputs {
                token_req: raw_slice(o.token_req, o.n_tokens as usize),
                token_branch: raw_slice(o.token_branch, o.n_tokens as usize),
                token_ids: raw_slice(o.token_ids, o.n_tokens as usize),
                finished_req: raw_slice(o.finished_req, o.n_finished as usize),
                finished_reason: raw_slice(o.finished_reason, o.n_finished as usize),
            })
        }
    }

    /// `bkv_sched_check`: 0 when consistent.
    pub fn check(&self) -> Result<i32> {
        let _x = self.exclusive()?;
        Ok(unsafe { sys::bkv_sched_check(self.raw.as_ptr()) })
    }

    /// `bkv_sched_metrics_prometheus`: the Prometheus text.
    pub fn metrics(&self) -> Result<String> {
        let _x = self.exclusive()?;
        let n = unsafe { sys::bkv_sched_metrics_prometheus(self.raw.as_ptr(), ptr::null_mut(), 0) };
        let mut buf = vec![0u8; n + 1];
        unsafe {
            sys::bkv_sched_metrics_prometheus(self.raw.as_ptr(), buf.as_mut_ptr() as *mut _, n + 1)
        };
        buf.truncate(n);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The pool's counters, between steps.
    pub fn pool_stats(&self) -> Result<PoolStats> {
        let _x = self.exclusive()?;
        Ok(pool_stats(self.pool))
    }

    /// Drain the pool's KV events, between steps.
    pub fn pool_events(&self, max: u32) -> Result<Vec<KvEvent>> {
        let _x = self.exclusive()?;
        Ok(pool_events(self.pool, max))
    }

    /// [`VllmEncoder::encode`] on this scheduler's pool, between steps
    /// (`Err(Error::State)` during one): how a serving loop publishes after
    /// each step while the scheduler borrows the pool. `Err(InvalidArgument)`
    /// for an encoder made for another pool.
    pub fn vllm_encode<'e>(&self, enc: &'e mut VllmEncoder, ts: f64) -> Result<&'e [u8]> {
        if enc.pool_id != self.pool_id {
            return Err(Error::InvalidArgument);
        }
        let _x = self.exclusive()?;
        enc.encode_raw(self.pool, ts)
    }

    /// The host, between steps.
    pub fn host_mut(&mut self) -> &mut H {
        self.host.host.get_mut()
    }
}

impl<'pool, H: Host> Drop for Scheduler<'pool, H> {
    fn drop(&mut self) {
        // no XferDone reaches the scheduler from here on (one in a call
        // holds the read lock: this waits for it)
        *self.host.xfer.sched.write().unwrap_or_else(|e| e.into_inner()) = ptr::null_mut();
        unsafe { sys::bkv_sched_destroy(self.raw.as_ptr()) }
    }
}
