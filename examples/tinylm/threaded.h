/*
 * threaded.h - tinylm served by one engine thread to several client threads
 * (threaded.c).
 */
#ifndef TINYLM_THREADED_H
#define TINYLM_THREADED_H

#include "tinylm.h"

/*
 * Serve workload w with n_clients client threads (client i submits jobs i,
 * i + n_clients, ..., keeping at most window of them in flight, and aborts
 * its own requests from its thread) and one engine thread stepping the
 * scheduler configured by rc. Fills res (steps, wall time, generated tokens,
 * scheduler/pool/host counters); tokens land in the jobs for
 * tlm_workload_verify.
 * Returns 0 or the first failing bkv_* status.
 */
int tlm_threaded_serve(tlm_workload *w, const tlm_model *m, const tlm_run_config *rc,
		       uint32_t n_clients, uint32_t window, tlm_run_result *res);

/*
 * The same, overlapped: the engine thread drives bkv_step_launch /
 * bkv_step_complete and a device thread (overlap.c) runs the launched steps,
 * so the library plans the next step while the device computes up to
 * rc->sched.overlap steps (1 when 0). The token streams are the synchronous
 * run's. rc->split and rc->fail_every must be 0 (BKV_EINVAL).
 */
int tlm_threaded_serve_overlap(tlm_workload *w, const tlm_model *m, const tlm_run_config *rc,
			       uint32_t n_clients, uint32_t window, tlm_run_result *res);

#endif /* TINYLM_THREADED_H */
