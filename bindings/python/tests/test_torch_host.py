"""examples/python/torch_host.py: a Llama-shaped PyTorch model whose K/V lives
in torch tensors, served through batchkv token for token against a
contiguous reference through prefix hits, forks, swap preemption, both
batch layouts and speculation with its own first layers as the draft model.
Skipped without torch (Debian: apt-get install python3-torch)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

import batchkv  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "examples", "python"))
import torch_host  # noqa: E402

N_JOBS = 16


@pytest.fixture(scope="module")
def model_and_jobs():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    m = torch_host.Llama()
    jobs = torch_host.workload(m, n_jobs=N_JOBS, max_new=(6, 12))
    yield m, jobs
    torch.set_num_threads(threads)


def check(jobs, st, host):
    bad = torch_host.mismatches(jobs)
    assert not bad, "request %d: served %s, alone %s" % (bad[0].req, bad[0].got, bad[0].ref)
    assert st.hit_tokens > 0                       # shared system prompts
    assert host.counts["copies"] > 0               # n = 2 forks copy on write
    assert st.swaps > 0 and host.counts["swap_out"] > 0 and host.counts["swap_in"] > 0


@pytest.mark.parametrize("layout", [batchkv.BatchLayout.FLAT, batchkv.BatchLayout.PERSISTENT])
def test_token_exact_in_each_layout(model_and_jobs, layout):
    m, jobs = model_and_jobs
    st, host = torch_host.serve(m, jobs, layout, device_blocks=20, max_running=6)
    check(jobs, st, host)
    if layout == batchkv.BatchLayout.PERSISTENT:
        assert host.counts["deltas"] > 0


@pytest.mark.parametrize("draft_layers", [2, 4])
def test_token_exact_with_speculation(model_and_jobs, draft_layers):
    """Drafts from the first 2 of 4 layers (random weights: few accepted) and
    from all 4 (the model drafting for itself: greedy rows accept nearly
    every draft, so accepted runs cross block boundaries and swaps)."""
    m, jobs = model_and_jobs
    st, host = torch_host.serve(m, jobs, batchkv.BatchLayout.PERSISTENT, spec=3,
                                device_blocks=20, max_running=6, draft_layers=draft_layers)
    check(jobs, st, host)
    assert host.counts["drafts"] > 0 and host.counts["spec_rows"] > 0
    assert st.spec_accepted > (host.counts["spec_rows"] if draft_layers == 4 else 0)


def test_batched_mode_agrees_with_the_reference_on_most_tokens(model_and_jobs):
    """The batched path (the GPU timing's) rounds differently, so it is not
    exact; greedy tokens of this small model still agree almost always."""
    m, jobs = model_and_jobs
    greedy = [j for j in jobs if j.n == 1]
    st, host = torch_host.serve(m, greedy, batchkv.BatchLayout.FLAT, device_blocks=20,
                                max_running=6, mode="batched")
    assert all(j.finished == 1 for j in greedy)
    same = sum(a == b for j in greedy for a, b in zip(j.got[0], j.ref[0]))
    assert same >= 0.9 * sum(len(j.ref[0]) for j in greedy)


def test_gpu_step_times_runs_its_grid_on_the_cpu(tmp_path, capsys):
    """gpu_step_times.py --cpu-smoke: the CUDA script's code path with the
    small model (the times mean nothing on the CPU), its CSV and its report."""
    import gpu_step_times
    out = tmp_path / "steps.csv"
    assert gpu_step_times.main(["--cpu-smoke", "--reps", "2", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "kind,decode_rows,decode_context,prefill_tokens,measured_us"
    kinds = [line.split(",")[0] for line in lines[1:]]
    assert kinds.count("decode") == 2 and kinds.count("prefill") == 2
    assert all(float(line.split(",")[4]) > 0 for line in lines[1:])
    assert "median |error|" in capsys.readouterr().out
