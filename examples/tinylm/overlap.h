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

/* Start a device thread over host (not owned). NULL without memory. */
tlm_device *tlm_device_create(tlm_host *host);
/* Stop and join it (every launched step must have been waited for). */
void tlm_device_destroy(tlm_device *d);
/* bkv_host_ops.launch, with host = the tlm_device: copy the batch struct,
 * queue the step and return (0). The device replaces each placeholder
 * BKV_TOKEN_PENDING(i) by the token it sampled for row i of the step before,
 * from its own copy of those tokens (the library may refill the step's
 * arrays as soon as it completes). */
int tlm_device_launch(void *dev, const bkv_batch *batch, int32_t *next_tokens);
/* Wait until the oldest launched step has run; its status (0 or the host's
 * negative answer; a step after a failed one fails too). */
int tlm_device_wait(tlm_device *d);
/* Make the next launched step fail on the device (tlm_host_fail_next: late
 * == 0 before computing, else after writing its K/V), for tests of the
 * overlapped rollback; the steps launched after it fail too until the queue
 * drains. Engine thread. */
void tlm_device_fail_next(tlm_device *d, int late);
/* Placeholder tokens the device replaced so far (after the steps waited). */
uint64_t tlm_device_placeholders(tlm_device *d);

#endif /* TINYLM_OVERLAP_H */
