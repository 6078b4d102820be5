/*
 * shape.h - model shapes for bkv-sim (shape.c): a model's KV groups and the
 * figures a roofline needs, from a preset of a published configuration or
 * from a custom spec ("full:12x2048,window128:12x2048"). docs/bkv-sim.md
 * names the source of every preset figure and gives the spec's grammar.
 */
#ifndef BKV_SIM_SHAPE_H
#define BKV_SIM_SHAPE_H

#include "sim.h"

#include <stddef.h>
#include <stdint.h>

/* One model's shape. */
typedef struct sim_shape {
	char name[64];                        /* the preset, or "custom" */
	uint32_t n_groups;                    /* entries in groups, 1..BKV_MAX_GROUPS */
	bkv_kv_group groups[BKV_MAX_GROUPS];  /* the KV groups; a preset's STATE
						 group has span 0 until
						 sim_shape_apply sets its
						 checkpoint interval */
	double params;                        /* all weights (0: custom, keep
						 the roofline preset's) */
	double active_params;                 /* weights each token multiplies
						 (MoE: the active experts') */
	double weight_bytes;                  /* bytes of weights read per call */
	double attn_flops_per_pair;           /* 4 x attention layers x query
						 heads x head_dim */
} sim_shape;

/* Tokens between a preset STATE group's checkpoints, before rounding up to
 * a multiple of the pool's block. */
#define SIM_SHAPE_STATE_INTERVAL 256u

/* The preset names, NULL-terminated, in --help's order. */
extern const char *const sim_shape_presets[];

/* Fill out from NAME (a preset) or "custom:SPEC". Returns 0, or -1 with a
 * message in err (an unknown preset, a malformed spec). */
int sim_shape_parse(const char *spec, sim_shape *out, char *err, size_t errlen);

/* Set c's pool groups (c->groups, c->n_groups) from the shape for the
 * block size c->block_tokens, and, when c prices with the roofline, its
 * groups (pointing at c->groups) and KV bytes, and for a preset its weights,
 * active parameters and attention FLOPs. Returns 0, or -1 with a message in
 * err when the groups are not valid at this block size
 * (bkv_kv_frame_bytes gives 0). */
int sim_shape_apply(const sim_shape *s, sim_config *c, char *err, size_t errlen);
/* A shape of one full-attention group is the plain model: it sets no
 * groups (c->n_groups stays 0), only the roofline's KV bytes and weights. */

/* Add one decode row whose context is `context` tokens (its new token
 * included) to gctx[0..c->n_groups), what each of c's groups reads for it:
 * FULL the context, WINDOW min(context, span), CHUNKED the tokens of the
 * new token's chunk, STATE 0 (bkv_step_shape.group_decode_context). */
void sim_shape_add_row(const sim_config *c, uint64_t context, uint64_t *gctx);

#endif /* BKV_SIM_SHAPE_H */
