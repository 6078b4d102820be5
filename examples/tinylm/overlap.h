/*
 * overlap.h - a "device" thread for tinylm's paged host: the launch callback
 * of overlapped scheduling (bkv_step_launch) enqueues a step, the device
 * thread runs the steps in launch order, and the engine waits for each one
 * before it completes it (bkv_step_complete). overlap.c.
 */
#ifndef TINYLM_OVERLAP_H
#define TINYLM_OVERLAP_H

#include "tinylm.h"

typedef struct tlm_device tlm_device;

/* Start a device thread over host (not owned) for overlapped scheduling of
 * depth depth (bkv_sched_config.overlap, 1..BKV_OVERLAP_MAX_DEPTH). NULL
 * without memory or for a depth out of range. */
tlm_device *tlm_device_create(tlm_host *host, uint32_t depth);
/* Stop and join it (every launched step must have been waited for). */
void tlm_device_destroy(tlm_device *d);
/* bkv_host_ops.launch, with host = the tlm_device: copy the batch struct,
 * queue the step and return (0); -1 when depth + 1 steps are outstanding
 * already. The device replaces each placeholder BKV_TOKEN_PENDING_AT(back,
 * i) by the token it sampled for row i of the step launched back launches
 * before, from its own copy of those tokens (the library may refill a
 * step's arrays as soon as it completes); a placeholder beyond the depth or
 * naming a row that step did not have fails the step
 * (tlm_device_last_error). */
int tlm_device_launch(void *dev, const bkv_batch *batch, int32_t *next_tokens);
/* Wait until the oldest launched step has run; its status (0 or the host's
 * negative answer; a step after a failed one fails too). */
int tlm_device_wait(tlm_device *d);
/* Make the next launched step fail on the device (tlm_host_fail_next: late
 * == 0 before computing, else after writing its K/V), for tests of the
 * overlapped rollback; the steps launched after it fail too until the queue
 * drains. Engine thread. */
void tlm_device_fail_next(tlm_device *d, int late);
/* Placeholder tokens the device replaced so far (after the steps waited)
 * whose back distance is back; back 0: all of them. */
uint64_t tlm_device_placeholders(tlm_device *d, uint32_t back);
/* Why the device first refused a launch or failed a step on a placeholder,
 * written to buf ("" if it never did). */
void tlm_device_last_error(tlm_device *d, char *buf, size_t len);
/* Copy the device's counts into a run's result: res->placeholders by back
 * distance, and its last error (if any) to res->host_error. */
void tlm_device_result(tlm_device *d, tlm_run_result *res);

#endif /* TINYLM_OVERLAP_H */
