//! Every struct of src/sys.rs against the C compiler: size, alignment, and
//! each field's offset and size, as printed by bindings/layout.c (built by
//! build.rs from the real header). A struct or field the C side has and
//! this list lacks fails too, so a field added to the header cannot go
//! unnoticed here.
use batchkv::sys::*;
use std::collections::BTreeMap;
use std::mem::{align_of, size_of, MaybeUninit};
use std::process::Command;

fn pointee_size<T>(_: *const T) -> usize {
    size_of::<T>()
}

macro_rules! layout {
    ($t:ident { $($f:ident),* }) => {{
        let u = MaybeUninit::<$t>::uninit();
        let base = u.as_ptr();
        let fields: Vec<(&str, usize, usize)> = vec![$({
            // SAFETY: addr_of! on an uninitialised place reads nothing
            let p = unsafe { std::ptr::addr_of!((*base).$f) };
            (stringify!($f), p as usize - base as usize, pointee_size(p))
        }),*];
        (stringify!($t), size_of::<$t>(), align_of::<$t>(), fields)
    }};
}

#[test]
fn every_struct_matches_the_c_layout() {
    let rust = vec![
        layout!(bkv_allocator { alloc, realloc, free, ud }),
        layout!(bkv_model_shape { layers, kv_heads, head_dim, dtype_bytes }),
        layout!(bkv_kv_group { kind, layers, span, reserved, bytes }),
        layout!(bkv_pool_config { size, block_tokens, device_blocks, host_blocks, max_seqs, watermark_blocks, prefix_cache, hash_seed, event_capacity, pin_permille, host_cache, reserved, n_groups, state_units, groups, state_share, state_pad }),
        layout!(bkv_pool_stats { size, block_tokens, device_blocks, host_blocks, nr_free, nr_used, nr_cached, nr_indexed, host_free, host_used, nr_seqs, nr_swapped, tokens, waste_slots, hit_tokens, miss_tokens, evictions, cow_copies, swap_out_blocks, swap_in_blocks, events, events_dropped, dup_blocks, state_units, state_free, state_checkpoints, state_frames, state_hits, state_evictions, host_cached, host_demoting, host_demoted, host_kept, host_skipped, host_hit_blocks, host_evictions, n_groups, group_used, group_cached }),
        layout!(bkv_pool_memory { size, block_bytes, seq_slot_bytes, index_slots, index_used, reserved, blocks, device_tokens, index, txn_queue, txn_owners, check_scratch, host, seq_slots, block_tables, copy_lists, event_ring, total }),
        layout!(bkv_block_info { size, state, ref_count, fill, indexed, copy_pending, kids, parent, key, hash, tokens }),
        layout!(bkv_copy { src, dst }),
        layout!(bkv_seq_info { len, n_blocks, swapped, key }),
        layout!(bkv_chunk_shape { len, start }),
        layout!(bkv_step_shape { kind, decode_rows, decode_context, n_chunks, chunks, padded_rows, n_groups, group_decode_context, decode_drafts }),
        layout!(bkv_cost_model { step_us, observe, ctx }),
        layout!(bkv_cost_poly { size, a, b, c, kappa, rows_ref, packed, d0, d1, d2, reserved }),
        layout!(bkv_cost_calib_confidence { size, n_eff, scale_fit, scale_base, level, trusted, uses_fit }),
        layout!(bkv_cost_roofline { size, name, peak_flops, mem_bw, model_bytes, active_params, kv_bytes_per_token, attn_flops_per_pair, flops_eff, mem_eff, overhead_us, reserved, n_groups, groups }),
        layout!(bkv_encode { cache_id, req, user, input, len }),
        layout!(bkv_batch { kind, n_rows, n_decode_rows, n_tokens, block_tokens, token_ids, positions, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, slot_mapping, row_sample, row_req, row_branch, row_user, n_copies, copies, n_swap_out, swap_out, n_swap_in, swap_in, layout, n_row_slots, row_slot, row_tables, row_table_len, n_table_deltas, table_deltas, delta_blocks, n_groups, groups, n_spec_rows, row_drafts, spec_tokens, n_accepted, row_adapter, n_adapters, adapters, n_encode, encode, n_encoder_free, encoder_free }),
        layout!(bkv_batch_group { kind, span, slot_mapping, kv_indptr, kv_indices, kv_first_block, row_tables, row_table_len, state_in, state_out, state_frames, state_out_spec }),
        layout!(bkv_table_delta { slot, start, n, len, flags }),
        layout!(bkv_host_ops { forward, prefill, decode, on_token, on_finish, now_us, draft, launch }),
        layout!(bkv_kv_xfer_block { hash, index, group, block, frames }),
        layout!(bkv_connector { lookup, load, save, preempted, user, save_blocks, max_saves, contains }),
        layout!(bkv_sched_config { size, policy, max_running, admit_group, max_wait_us, chunked_prefill, token_budget, max_queue, preempt, host_link_bytes_per_us, kv_bytes_per_token, tpot_target_us, cost, max_bypass_us, batch_layout, ttft_target_us, spec_max_k, spec_k_mode, spec_drafts, overlap, evict, victim, admit_reserve, retention, copy_overlap, prefill_first, max_adapters, pad0, adapter_wait_us, encoder_cache, encoder_budget, pad1, connector }),
        layout!(bkv_request { size, prompt, prompt_len, max_new_tokens, stop_tokens, n_stop, priority, cache_key, n, predicted_output, user, retention, n_retention, adapter, n_inputs, inputs }),
        layout!(bkv_encoder_input { cache_id, token_start, token_len, cost, pad }),
        layout!(bkv_retention_range { token_start, token_end, priority, pad, duration_us }),
        layout!(bkv_step_info { rows, prefill_tokens, decode_tokens, hit_tokens, prefill_calls, decode_calls, admitted, finished, preempted, running, waiting, predicted_us, measured_us }),
        layout!(bkv_step_outputs { size, n_tokens, token_req, token_branch, token_ids, n_finished, finished_req, finished_reason }),
        layout!(bkv_sched_stats { size, waiting, running, swapped, steps, failed_steps, submitted, finished, aborted, prefill_tokens, decode_tokens, hit_tokens, preemptions, swaps, prefill_calls, decode_calls, busy_us, unadmittable, spec_rows, spec_drafted, spec_accepted, overlap_steps, overlap_syncs, overlap_wasted_tokens, spec_skipped_rows, overlap_spec_waits, overlap_spec_undrafted, overlap_spec_idle, adapter_passes, encoder_lookups, encoder_hits, encoder_runs, encoder_evictions, kv_waiting, kv_save_held, kv_lookups, kv_lookup_errors, kv_loads, kv_load_tokens, kv_load_failed, kv_saved, kv_save_failed }),
        layout!(bkv_kv_event { seq, hash, parent_hash, key, kind, token_count, block, has_parent, medium, reserved }),
        layout!(bkv_seq_image { size, block_tokens, len, n_blocks, key, hash_seed, blocks, hashes, tokens, cap_blocks, cap_tokens, n_groups, state_frames, group_blocks, state_frame, reserved, group_layout }),
        layout!(bkv_vllm_config { size, wire, hash, int_hashes, hash_seed, medium, data_parallel_rank, group_idx, spec_kind, sliding_window, extra_keys, key_name, key_name_ud, host_medium, reserved }),
    ];
    let out = Command::new(env!("BKV_LAYOUT_EXE")).output().expect("run bkv_layout");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut c_structs = BTreeMap::new();
    let mut c_fields = BTreeMap::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "S" => {
                c_structs.insert(w[1].to_string(), (w[2].parse::<usize>().unwrap(),
                                                    w[3].parse::<usize>().unwrap()));
            }
            "F" => {
                c_fields.insert((w[1].to_string(), w[2].to_string()),
                                (w[3].parse::<usize>().unwrap(), w[4].parse::<usize>().unwrap()));
            }
            _ => panic!("bad line {}", line),
        }
    }
    assert!(c_structs.len() >= 19, "bkv_layout printed {} structs", c_structs.len());
    let mut seen = 0;
    for (name, size, align, fields) in &rust {
        let c = c_structs.get(*name).unwrap_or_else(|| panic!("{} not in layout.c", name));
        assert_eq!((*size, *align), *c, "{}: Rust (size, align) vs C", name);
        for (f, off, fsize) in fields {
            let cf = c_fields.get(&(name.to_string(), f.to_string()))
                .unwrap_or_else(|| panic!("{}.{} not in layout.c", name, f));
            assert_eq!((*off, *fsize), *cf, "{}.{}: Rust (offset, size) vs C", name, f);
            seen += 1;
        }
    }
    assert_eq!(rust.len(), c_structs.len(), "structs in C and in this test");
    assert_eq!(seen, c_fields.len(), "fields in C and in this test");
}
