"""The drift guard (bindings/tools/check_bindings.py) fails on each kind of
drift it claims to catch: each test copies the header and the bindings into a
scratch tree, makes one change, and asserts the exact complaint."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FILES = ["include/batchkv.h", "bindings/layout.c", "bindings/rust/src/sys.rs",
         "bindings/rust/src/lib.rs", "bindings/tools/check_bindings.py",
         "bindings/tools/bkvheader.py"] + \
    ["bindings/python/batchkv/" + f for f in os.listdir(os.path.join(ROOT, "bindings", "python",
                                                                      "batchkv"))
     if f.endswith(".py")] + \
    [d + "/" + f for d, ext in (("bindings/python/tests", ".py"), ("bindings/rust/tests", ".rs"),
                                ("bindings/rust/examples", ".rs"), ("examples/python", ".py"))
     for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(ext)]


@pytest.fixture
def tree(tmp_path):
    for f in FILES:
        os.makedirs(os.path.dirname(tmp_path / f), exist_ok=True)
        shutil.copy(os.path.join(ROOT, f), tmp_path / f)
    return tmp_path


def edit(tree, path, old, new, count=1):
    p = tree / path
    s = p.read_text()
    assert s.count(old) >= 1, (path, old)
    p.write_text(s.replace(old, new, count))


def check(tree):
    r = subprocess.run([sys.executable, str(tree / "bindings/tools/check_bindings.py"),
                        str(tree)], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def test_the_real_tree_passes(tree):
    rc, out = check(tree)
    assert rc == 0 and "; 0 problems" in out, out


def test_a_new_header_function_is_caught_in_both_languages(tree):
    edit(tree, "include/batchkv.h", "BKV_API const char *bkv_version(void);",
         "BKV_API const char *bkv_version(void);\nBKV_API int bkv_new_call(bkv_pool *pool, "
         "uint32_t x);")
    rc, out = check(tree)
    assert rc == 1
    assert "python: bkv_new_call has no ctypes declaration" in out
    assert 'rust: bkv_new_call has no extern "C" declaration' in out


def test_a_new_struct_field_is_caught(tree):
    edit(tree, "include/batchkv.h", "\tvoid *user;                 /* handed back",
         "\tuint32_t new_field;\n\tvoid *user;                 /* handed back")
    rc, out = check(tree)
    assert rc == 1
    assert "python: bkv_request fields" in out and "rust: bkv_request fields" in out
    assert "bindings/layout.c differs" in out


def test_a_retyped_rust_parameter_is_caught(tree):
    edit(tree, "bindings/rust/src/sys.rs", "pub fn bkv_abort(sched: *mut bkv_sched, req_id: u64)",
         "pub fn bkv_abort(sched: *mut bkv_sched, req_id: u32)")
    rc, out = check(tree)
    assert rc == 1 and re.search(r"rust: bkv_abort declared .*header says", out), out


def test_a_const_pointer_declared_mut_is_caught(tree):
    edit(tree, "bindings/rust/src/sys.rs",
         "pub fn bkv_pool_pending_copies(pool: *const bkv_pool, kind: bkv_copy_kind, out: *mut *const "
         "bkv_copy)",
         "pub fn bkv_pool_pending_copies(pool: *const bkv_pool, kind: bkv_copy_kind, out: *mut *mut "
         "bkv_copy)")
    rc, out = check(tree)
    assert rc == 1 and "rust: bkv_pool_pending_copies declared" in out, out


def test_a_retyped_ctypes_argument_is_caught(tree):
    edit(tree, "bindings/python/batchkv/_ffi.py", "'bkv_abort': (c_int, [c_void_p, c_uint64]),",
         "'bkv_abort': (c_int, [c_void_p, c_uint32]),")
    rc, out = check(tree)
    assert rc == 1 and "python: bkv_abort declared" in out, out


def test_a_function_no_safe_wrapper_uses_is_caught_unless_listed_with_a_reason(tree):
    edit(tree, "bindings/python/batchkv/pool.py", "_lib.bkv_pool_check(", "_lib.bkv_pool_chek(")
    rc, out = check(tree)
    assert rc == 1 and "python: bkv_pool_check is declared but no safe wrapper uses it" in out
    with open(tree / "bindings/python/batchkv/_ffi.py", "a") as f:
        f.write('\nUNBOUND = dict(UNBOUND, bkv_pool_check="")\n')
    rc, out = check(tree)
    assert rc == 1 and "python: UNBOUND[bkv_pool_check] gives no reason" in out
    with open(tree / "bindings/python/batchkv/_ffi.py", "a") as f:
        f.write('\nUNBOUND = dict(UNBOUND, bkv_pool_check="a debugging walk; tests use the C suite")\n')
    rc, out = check(tree)
    assert rc == 0, out


def test_a_rust_function_no_wrapper_uses_is_caught(tree):
    edit(tree, "bindings/rust/src/lib.rs", "sys::bkv_seq_drop(", "sys::bkv_seq_close(")
    rc, out = check(tree)
    assert rc == 1 and "rust: bkv_seq_drop is declared but no safe wrapper uses it" in out


def test_a_function_no_test_reaches_is_caught(tree):
    # the Rust tests stop naming drop_seq: bkv_seq_drop is wrapped but untested
    for f in os.listdir(tree / "bindings/rust/tests"):
        p = tree / "bindings/rust/tests" / f
        p.write_text(p.read_text().replace("drop_seq", "close_seq"))
    rc, out = check(tree)
    assert rc == 1 and "rust: no test reaches bkv_seq_drop" in out
    # a Python wrapper reached only through another wrapper still counts
    rc, out = check(tree)
    assert "python: no test reaches" not in out


def test_a_field_no_test_reaches_is_caught(tree):
    for d in ("bindings/python/tests", "bindings/rust/tests"):
        for f in os.listdir(tree / d):
            if f not in ("test_layout.py", "layout.rs", "test_drift.py"):
                p = tree / d / f
                p.write_text(p.read_text().replace("overlap_spec_idle", "overlap_syncs"))
    rc, out = check(tree)
    assert rc == 1
    assert "python: no test reaches bkv_sched_stats.overlap_spec_idle" in out
    assert "rust: no test reaches bkv_sched_stats.overlap_spec_idle" in out
    with open(tree / "bindings/python/batchkv/_ffi.py", "a") as f:
        f.write('\nFIELDS_UNREACHED = dict(FIELDS_UNREACHED, '
                'bkv_sched_stats="a reason long enough")\n')
    rc, out = check(tree)
    assert "python: no test reaches bkv_sched_stats" not in out


def test_a_changed_enum_value_is_caught(tree):
    edit(tree, "include/batchkv.h", "BKV_PREEMPT_SWAP = 2", "BKV_PREEMPT_SWAP = 3")
    rc, out = check(tree)
    assert rc == 1 and "python: BKV_PREEMPT_SWAP" in out and "rust: const BKV_PREEMPT_SWAP" in out


def test_a_changed_callback_typedef_is_caught_in_both_languages(tree):
    edit(tree, "include/batchkv.h",
         "typedef const char *(*bkv_vllm_key_name_fn)(void *ud, uint64_t key);",
         "typedef const char *(*bkv_vllm_key_name_fn)(void *ud, uint32_t key);")
    rc, out = check(tree)
    assert rc == 1
    assert "python: callback type bkv_vllm_key_name_fn declared" in out, out
    assert "rust: callback type bkv_vllm_key_name_fn is" in out, out


def test_a_callback_field_is_checked_against_its_typedef(tree):
    # Rust: the field must name the alias (the alias itself is checked once)
    edit(tree, "bindings/rust/src/sys.rs", "pub key_name: bkv_vllm_key_name_fn,",
         "pub key_name: Option<unsafe extern \"C\" fn(*mut c_void, u64) -> *const c_char>,")
    # ctypes: the field's CFUNCTYPE must have the typedef's signature
    edit(tree, "bindings/python/batchkv/_ffi.py", "('key_name', bkv_vllm_key_name_fn),",
         "('key_name', CFUNCTYPE(c_void_p, c_void_p, c_uint32)),")
    rc, out = check(tree)
    assert rc == 1
    assert "python: bkv_vllm_config fields" in out, out
    assert "rust: bkv_vllm_config fields" in out, out


def test_a_typedef_the_reader_does_not_know_fails_loudly(tree):
    edit(tree, "include/batchkv.h", "typedef struct bkv_vllm_encoder bkv_vllm_encoder;",
         "typedef struct bkv_vllm_encoder bkv_vllm_encoder;\ntypedef uint64_t bkv_new_id;")
    rc, out = check(tree)
    assert rc != 0 and "bkvheader: read" in out and "typedefs" in out, out


def test_emitted_rust_spells_keywords_as_raw_identifiers(tree):
    # bkv_seq_state_frames has a parameter named `in`, a Rust keyword
    r = subprocess.run([sys.executable, str(tree / "bindings/tools/check_bindings.py"),
                        str(tree), "--emit-rust"], capture_output=True, text=True, check=True)
    line = [x for x in r.stdout.splitlines() if "fn bkv_seq_state_frames(" in x]
    assert line == ["    pub fn bkv_seq_state_frames(pool: *const bkv_pool, seq: u32, "
                    "r#in: *mut i32, out: *mut i32) -> c_int;"], line
    assert line[0] in open(os.path.join(ROOT, "bindings/rust/src/sys.rs")).read()
