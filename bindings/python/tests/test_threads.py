"""submit() and abort() from other Python threads while one thread steps: no
deadlock between the GIL and the library's lock, every request ends exactly
once, every abort either lands or answers NotFoundError."""
import threading
import time

import numpy as np

import batchkv
from batchkv import FinishReason, Pool, Scheduler

N_THREADS = 4
PER_THREAD = 150


class Host:
    def __init__(self):
        self.stepping = threading.Event()  # set by the first compute call
        self.finished = {}
        self.lock = threading.Lock()   # on_finish runs on the stepping thread only;
        self.tokens = 0                # the lock guards the test's own reads

    def forward(self, b, next_tokens):
        self.stepping.set()
        time.sleep(0.0005)             # the GIL is free: submitters run inside the step
        next_tokens[:] = np.where(b.row_sample != 0, 5, 0)

    def on_token(self, req, branch, token, user):
        self.tokens += 1

    def on_finish(self, req, reason, user):
        with self.lock:
            assert req not in self.finished, "request ended twice"
            self.finished[req] = (reason, user)


def test_submit_and_abort_from_threads_while_stepping():
    host = Host()
    pool = Pool(device_blocks=512, block_tokens=8)
    s = Scheduler(pool, host, max_running=32, max_queue=1 << 16)
    submitted = [[] for _ in range(N_THREADS)]
    during_step = [0]                  # submits that returned while a step ran
    aborted = [[] for _ in range(N_THREADS)]
    errors = []
    done = threading.Event()

    def client(t):
        try:
            rng = np.random.default_rng(t)
            s.submit([1, 2, 3], 50)        # something to step on
            host.stepping.wait(30)         # then submit while steps run
            for i in range(PER_THREAD):
                rid = s.submit(rng.integers(0, 1000, 1 + i % 20), 1 + i % 9, user=(t, i))
                submitted[t].append(rid)
                if s._stepping:
                    during_step[0] += 1
                if i % 3 == 0:
                    victim = submitted[t][int(rng.integers(0, len(submitted[t])))]
                    try:
                        s.abort(victim)
                        aborted[t].append(victim)
                    except batchkv.NotFoundError:
                        pass           # it had ended, or was aborted already
                assert s.pending >= 0
        except BaseException as e:     # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(N_THREADS)]
    for th in threads:
        th.start()
    steps = 0
    deadline = time.monotonic() + 120
    while any(th.is_alive() for th in threads) or s.pending:
        s.step()
        steps += 1
        assert time.monotonic() < deadline, "no progress: deadlock or livelock"
    for th in threads:
        th.join(10)
        assert not th.is_alive()
    done.set()
    assert not errors, errors
    all_ids = [r for sub in submitted for r in sub]
    assert len(all_ids) == len(set(all_ids)) == N_THREADS * PER_THREAD
    assert set(all_ids) <= set(host.finished)          # each ended exactly once
    assert len(host.finished) == len(all_ids) + N_THREADS
    n_abort = sum(1 for r, _ in host.finished.values() if r == FinishReason.ABORT)
    landed = {r for sub in aborted for r in sub}
    # an abort that answered OK ends its request with ABORT, unless the
    # request ended in the concurrent step (the header's rule)
    assert 0 < n_abort <= len(landed), (n_abort, len(landed))
    for r, (reason, user) in host.finished.items():
        if reason == FinishReason.ABORT:
            assert r in landed
        assert isinstance(user, tuple) or r not in all_ids
    st = s.stats()
    assert st.submitted == N_THREADS * (PER_THREAD + 1) and st.finished == st.submitted
    assert st.aborted == n_abort and s.check() == 0
    assert steps > 1
    # the two really overlapped (each step sleeps in forward with the GIL free)
    assert during_step[0] > 0, "no submit ran during a step (%d steps)" % steps
