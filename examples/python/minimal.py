"""minimal.py - examples/minimal.c in Python: the shortest complete integration.

A fake host whose "model" answers each row with (last input token + 1): one
pool, one scheduler with a mixed-batch forward callback, three requests,
step() until every request has ended. A real host would run its attention
kernels over batch.kv_indices / batch.slot_mapping where this one adds one.

    meson setup build && meson compile -C build
    BATCHKV_LIBRARY=build/lib/libbatchkv.so PYTHONPATH=bindings/python \\
        /usr/bin/python3 examples/python/minimal.py

(After `meson install` neither variable is needed.)
"""
import sys

import numpy as np

import batchkv


class Host:
    def forward(self, batch, next_tokens):
        # a real host performs batch.swap_out, batch.swap_in, batch.copies first;
        # batch arrays are zero-copy numpy views, valid only during this call
        last = batch.token_ids[batch.qo_indptr[1:] - 1]
        next_tokens[:] = np.where(batch.row_sample != 0, last + 1, 0)

    def on_token(self, req, branch, token, user):
        print("request %d: token %d" % (req, token))

    def on_finish(self, req, reason, user):
        self.finished += 1
        why = {batchkv.FinishReason.STOP: "stop token",
               batchkv.FinishReason.LENGTH: "length"}.get(reason, "other")
        print("request %d: finished (%s)" % (req, why))

    finished = 0


def main():
    host = Host()
    with batchkv.Pool(device_blocks=64) as pool, batchkv.Scheduler(pool, host) as sched:
        for i in range(3):
            sched.submit([100, 101, 102, 103, 104], max_new_tokens=2 + 2 * i, stop_tokens=[110])
        while sched.pending:
            sched.step()        # raises what a callback raised; the step was rolled back
    return 0 if host.finished == 3 else 1


if __name__ == "__main__":
    sys.exit(main())
