/*
 * shape.c - bkv-sim's model shapes: which KV groups a model's layers fall
 * into, and what its weights cost a roofline.
 *
 * A preset is one row of `presets` below, filled from the model's
 * published configuration (docs/bkv-sim.md, "Model shapes", cites each
 * figure and says which could not be checked here). A custom shape is a
 * comma-separated list of groups, each KIND[SPAN]:LAYERSxBYTES:
 *
 *     full:12x2048,window128:12x2048        gpt-oss-20b's KV, by hand
 *     chunk8192:36x4096,full:12x4096         Llama 4 Scout's
 *     full:12x2048,state256:36x1097728       Qwen3-Next's, checkpoints
 *                                            every 256 tokens
 *
 * BYTES is per token per layer for attention (2 x kv_heads x head_dim x
 * dtype bytes) and per sequence per layer for state. A custom shape sets
 * only the groups; the roofline keeps its --cost preset's weights.
 * sim_shape_apply writes the shape into a sim_config: the pool's groups,
 * and the roofline's when it prices the run.
 */
#include "shape.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One preset: a published model's groups and weights. */
typedef struct shape_preset {
	const char *name;             /* --shape NAME */
	uint32_t n_groups;            /* entries in groups */
	bkv_kv_group groups[BKV_MAX_GROUPS]; /* the KV groups (a STATE span of
					 0: checkpoint interval chosen at
					 apply) */
	double params;                /* all weights */
	double active_params;         /* weights per token (MoE: active) */
	double weight_bytes;          /* bytes of all weights */
	double attn_flops_per_pair;   /* 4 x attention layers x heads x head_dim */
} shape_preset;

#define G_FULL(l, b) {BKV_GROUP_FULL, l, 0, 0, b}
#define G_WINDOW(l, w, b) {BKV_GROUP_WINDOW, l, w, 0, b}
#define G_CHUNK(l, c, b) {BKV_GROUP_CHUNKED, l, c, 0, b}
#define G_STATE(l, b) {BKV_GROUP_STATE, l, 0, 0, b}

static const shape_preset presets[] = {
	/* 32 layers, 8 KV heads x 128, bf16: 4,096 B per token per layer;
	 * 32 query heads. Parameters as the h100-llama3-8b roofline preset. */
	{"llama3-8b", 1, {G_FULL(32, 4096)}, 8030261248.0, 7504920576.0, 2.0 * 8030261248.0,
	 4.0 * 32 * 32 * 128},
	/* 24 layers alternating a 128-token window and full attention, 8 KV
	 * heads x 64, bf16 (2,048 B); 64 query heads. 20.9e9 parameters, 3.6e9
	 * active; experts in MXFP4 (4.25 bits), the rest bf16: ~13.8e9 B. */
	{"gpt-oss-20b", 2, {G_FULL(12, 2048), G_WINDOW(12, 128, 2048)}, 20.9e9, 3.6e9, 13.8e9,
	 4.0 * 24 * 64 * 64},
	/* 36 layers, the same attention; 116.8e9 parameters, 5.1e9 active;
	 * ~65.2e9 B of weights (MXFP4 experts). */
	{"gpt-oss-120b", 2, {G_FULL(18, 2048), G_WINDOW(18, 128, 2048)}, 116.8e9, 5.1e9, 65.2e9,
	 4.0 * 36 * 64 * 64},
	/* 62 layers, every sixth global: 10 full, 52 with a 1,024-token window;
	 * 16 KV heads x 128, bf16 (8,192 B); 32 query heads; ~27e9 parameters
	 * (dense, tied head). The 52 window layers as four groups of 13, so
	 * that a frame (the largest page, 13 layers) wastes 3/13 of itself on
	 * a full-attention block instead of 42/52 (docs/design.md, "KV
	 * groups: sizing"). */
	{"gemma3-27b", 5,
	 {G_FULL(10, 8192), G_WINDOW(13, 1024, 8192), G_WINDOW(13, 1024, 8192),
	  G_WINDOW(13, 1024, 8192), G_WINDOW(13, 1024, 8192)},
	 27e9, 27e9, 54e9, 4.0 * 62 * 32 * 128},
	/* 48 layers, every fourth global (no RoPE), the rest chunked local
	 * attention of 8,192 tokens; 8 KV heads x 128, bf16 (4,096 B); 40 query
	 * heads; 16 experts, one routed plus a shared one per token: 107.8e9
	 * text parameters, 16.1e9 active, bf16. The 36 chunked layers as three
	 * groups of 12: every page the same size, no frame waste. */
	{"llama4-scout", 4,
	 {G_FULL(12, 4096), G_CHUNK(12, 8192, 4096), G_CHUNK(12, 8192, 4096),
	  G_CHUNK(12, 8192, 4096)},
	 107.8e9, 16.1e9, 215.6e9, 4.0 * 48 * 40 * 128},
	/* 48 layers, every fourth full attention (2 KV heads x 256, bf16: 2,048
	 * B; 16 query heads), the other 36 Gated DeltaNet: a 32 x 128 x 128
	 * recurrent state plus a 3 x 8,192 convolution state per layer, bf16:
	 * 1,097,728 B. 80e9 parameters, 3e9 active. */
	{"qwen3-next-80b", 2, {G_FULL(12, 2048), G_STATE(36, 1097728)}, 80e9, 3e9, 160e9,
	 4.0 * 12 * 16 * 256},
};

#define N_PRESETS (sizeof(presets) / sizeof(presets[0]))

const char *const sim_shape_presets[] = {"llama3-8b",    "gpt-oss-20b",  "gpt-oss-120b",
					 "gemma3-27b",   "llama4-scout", "qwen3-next-80b",
					 NULL};

_Static_assert(sizeof(sim_shape_presets) / sizeof(sim_shape_presets[0]) == N_PRESETS + 1,
	       "one name per preset");

/* ---- custom specs --------------------------------------------------------- */

/* An unsigned decimal at *s (advanced past it) of at most max; -1 when
 * there is none or it is too large. */
static int take_u64(const char **s, uint64_t max, uint64_t *out)
{
	char *end;
	if (**s < '0' || **s > '9')
		return -1;
	errno = 0;
	unsigned long long v = strtoull(*s, &end, 10);
	if (errno || v > max)
		return -1;
	*s = end;
	*out = v;
	return 0;
}

/* KIND[SPAN]:LAYERSxBYTES, the whole of tok. */
static int parse_group(const char *tok, bkv_kv_group *g)
{
	static const struct {
		const char *word; /* the spec's word */
		uint32_t kind;    /* its bkv_group_kind */
	} kinds[] = {{"full", BKV_GROUP_FULL},     {"window", BKV_GROUP_WINDOW},
		     {"chunked", BKV_GROUP_CHUNKED}, {"chunk", BKV_GROUP_CHUNKED},
		     {"state", BKV_GROUP_STATE}};
	uint64_t span = 0, layers, bytes;
	size_t i, n = sizeof(kinds) / sizeof(kinds[0]);
	for (i = 0; i < n; i++)
		if (!strncmp(tok, kinds[i].word, strlen(kinds[i].word)))
			break;
	if (i == n)
		return -1;
	const char *s = tok + strlen(kinds[i].word);
	if (*s != ':' && take_u64(&s, UINT32_MAX, &span))
		return -1;
	if (*s++ != ':' || take_u64(&s, UINT32_MAX, &layers) || *s++ != 'x' ||
	    take_u64(&s, UINT64_MAX, &bytes) || *s)
		return -1;
	*g = (bkv_kv_group){kinds[i].kind, (uint32_t)layers, (uint32_t)span, 0, bytes};
	return 0;
}

static int parse_custom(const char *spec, sim_shape *out, char *err, size_t errlen)
{
	char list[512];
	if (strlen(spec) >= sizeof(list)) {
		snprintf(err, errlen, "custom shape longer than %zu characters", sizeof(list) - 1);
		return -1;
	}
	snprintf(list, sizeof(list), "%s", spec);
	snprintf(out->name, sizeof(out->name), "custom");
	/* One group per comma-separated field; an empty field is malformed. */
	for (char *tok = list, *next; tok; tok = next) {
		next = strchr(tok, ',');
		if (next)
			*next++ = '\0';
		if (out->n_groups == BKV_MAX_GROUPS) {
			snprintf(err, errlen, "more than %d groups", BKV_MAX_GROUPS);
			return -1;
		}
		if (parse_group(tok, &out->groups[out->n_groups])) {
			snprintf(err, errlen,
				 "bad group '%s' (KIND[SPAN]:LAYERSxBYTES, KIND full, windowW, "
				 "chunkC or state[INTERVAL])",
				 tok);
			return -1;
		}
		out->n_groups++;
	}
	if (!out->n_groups) {
		snprintf(err, errlen, "no groups");
		return -1;
	}
	return 0;
}

/* ---- presets and applying ------------------------------------------------- */

int sim_shape_parse(const char *spec, sim_shape *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	if (!strncmp(spec, "custom:", 7))
		return parse_custom(spec + 7, out, err, errlen);
	for (size_t i = 0; i < N_PRESETS; i++) {
		const shape_preset *p = &presets[i];
		if (strcmp(spec, p->name))
			continue;
		snprintf(out->name, sizeof(out->name), "%s", p->name);
		out->n_groups = p->n_groups;
		memcpy(out->groups, p->groups, p->n_groups * sizeof(p->groups[0]));
		out->params = p->params;
		out->active_params = p->active_params;
		out->weight_bytes = p->weight_bytes;
		out->attn_flops_per_pair = p->attn_flops_per_pair;
		return 0;
	}
	snprintf(err, errlen, "unknown shape '%s' (a preset, or custom:SPEC)", spec);
	return -1;
}

int sim_shape_apply(const sim_shape *s, sim_config *c, char *err, size_t errlen)
{
	uint32_t bt = c->block_tokens;
	double kv = 0.0;
	c->n_groups = s->n_groups;
	memcpy(c->groups, s->groups, s->n_groups * sizeof(s->groups[0]));
	for (uint32_t i = 0; i < s->n_groups; i++) {
		bkv_kv_group *g = &c->groups[i];
		if (g->kind == BKV_GROUP_STATE && s->params > 0.0 && g->span == 0 && bt)
			g->span = (SIM_SHAPE_STATE_INTERVAL + bt - 1) / bt * bt;
		if (g->kind != BKV_GROUP_STATE)
			kv += (double)g->layers * (double)g->bytes;
	}
	if (!bkv_kv_frame_bytes(c->groups, c->n_groups, bt)) {
		snprintf(err, errlen,
			 "shape %s is not valid at %u-token blocks (layers and bytes >= 1, a "
			 "window or chunk >= 1, a state interval a multiple of the block, one "
			 "state group at most)",
			 s->name, bt);
		c->n_groups = 0;
		return -1;
	}
	if (c->n_groups == 1 && c->groups[0].kind == BKV_GROUP_FULL)
		c->n_groups = 0; /* the plain model */
	if (c->cost_kind == SIM_COST_ROOFLINE) {
		c->roofline.n_groups = c->n_groups;
		c->roofline.groups = c->n_groups ? c->groups : NULL;
		c->roofline.kv_bytes_per_token = kv;
		if (s->params > 0.0) {
			c->roofline.model_bytes = s->weight_bytes;
			c->roofline.active_params = s->active_params;
			c->roofline.attn_flops_per_pair = s->attn_flops_per_pair;
		}
	}
	return 0;
}

void sim_shape_add_row(const sim_config *c, uint64_t context, uint64_t *gctx)
{
	for (uint32_t i = 0; i < c->n_groups; i++) {
		const bkv_kv_group *g = &c->groups[i];
		uint64_t read = context;
		if (g->kind == BKV_GROUP_WINDOW && read > g->span)
			read = g->span;
		else if (g->kind == BKV_GROUP_CHUNKED && context)
			read = context - (context - 1) / g->span * g->span;
		else if (g->kind == BKV_GROUP_STATE)
			read = 0;
		gctx[i] += read;
	}
}
