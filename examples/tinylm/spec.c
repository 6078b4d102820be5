/*
 * spec.c - tinylm's draft model for speculative decoding: the served model
 * cut to its first layers (the same embedding, first blocks, final norm and
 * head; no weights of its own), run over the branch's whole context by the
 * reference generator (ref.c) and sampled as the served model samples, so
 * that where the shallow model agrees with the deep one its drafts are
 * accepted. It keeps no KV cache between calls (O(context) per call): a
 * demonstration of the host side of the contract, not a fast drafter.
 */
#include "tinylm.h"

#include <stdlib.h>
#include <string.h>

#define DRAFT_MAX_SAMPLES 8u

uint32_t tlm_draft_generate(const tlm_model *m, uint32_t layers, const int32_t *ctx,
			    uint32_t n_ctx, uint32_t k, uint32_t n_samples, uint64_t seed,
			    uint32_t branch, uint32_t adapter, const tlm_inputs *in,
			    int32_t *out)
{
	tlm_model view;
	int32_t *buf;
	uint32_t len[DRAFT_MAX_SAMPLES], n = 0;

	if (!m || !ctx || !n_ctx || !k || !layers || n_samples == 0 ||
	    n_samples > DRAFT_MAX_SAMPLES || branch >= n_samples || n_ctx + k > m->cfg.max_pos)
		return 0;
	view = *m; /* shares every weight */
	view.cfg.layers = layers < m->cfg.layers ? layers : m->cfg.layers;
	buf = malloc((size_t)n_samples * k * sizeof(int32_t));
	if (!buf)
		return 0;
	/* ctx is the branch's own history: continuing it as branch `branch`
	 * of an n_samples request samples each position as the served model
	 * would (tlm_sample keys on seed, branch and position) */
	if (tlm_ref_generate_mm(&view, adapter, in, ctx, n_ctx, k, NULL, 0, n_samples, seed, buf,
				len) == 0) {
		n = len[branch] < k ? len[branch] : k;
		memcpy(out, buf + (size_t)branch * k, n * sizeof(int32_t));
	}
	free(buf);
	return n;
}
