/*
 * cli.c - bkv-sim's command line: one table of options, the parser that
 * walks it, and the usage text kept in it.
 *
 * Each row of `options` names an option, whether it takes a value, the
 * setter that parses the value, and where the setter stores it (an offset
 * into cli_args, so one setter serves every option of its shape: a flag, a
 * bounded count, a path). The row's help field is its part of the usage
 * text, in the order --help prints it; a row whose help is NULL is covered
 * by a neighbour's lines (--n by --workload synthetic, --csv by --json), and
 * rows without a name are the usage text's headings. The parser reads the
 * arguments left to right and stops at the first error with exit status 2:
 *
 *   argv ──find the row──▶ take its value ──row.set(args, row, value)──▶ cli_args
 *            │ none: "unknown option"   │ none: "needs a value"   │ refused: "bad value"
 *
 * Options that depend on one another (a chunked policy picks a mixed host
 * unless --host was given; seed 000 counts decode steps, traces tokens) are
 * settled once after the walk, in cli_parse.
 */
#include "cli.h"
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What a setter tells the parser. */
enum {
	SET_OK = 0,   /* stored; go on */
	SET_BAD = 1,  /* refused: the parser prints "bad value for NAME: 'V'" */
	SET_STOP = 2, /* refused with its own message printed: exit status 2 */
	SET_HELP = 3  /* the usage was printed: exit status 0 */
};

typedef enum arg_kind {
	ARG_NONE,    /* a flag: takes no value */
	ARG_VALUE,   /* takes the next argument; "needs a value" when none */
	ARG_DIGITS   /* takes the next argument only when it starts with a digit
			(--compare [K,K,..], --overlap [N]); the setter sees
			NULL otherwise */
} arg_kind;

typedef struct cli_option cli_option;
typedef int cli_setter(cli_args *a, const cli_option *opt, const char *v);

struct cli_option {
	const char *name;  /* "--slots"; NULL: a heading of the usage text */
	arg_kind arg;      /* whether it takes a value */
	cli_setter *set;   /* parses v and stores it */
	size_t off;        /* where set stores: an offset into cli_args */
	uint32_t lo, hi;   /* set_u32: the bounds, inclusive; set_flag: lo is
			      the value stored; set_us_or_never: lo is the
			      unit in us */
	const char *help;  /* its lines of the usage text; NULL: none */
};

#define OPT(f) offsetof(cli_args, o.f)
#define CFG(f) offsetof(cli_args, c.f)
#define FIELD(a, opt, type) ((type *)(void *)((char *)(a) + (opt)->off))

static void usage(FILE *f);

/* ---- value parsers ------------------------------------------------------- */

static int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > UINT32_MAX || *s == '-')
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* A comma-separated list of at most MAX_SWEEP counts >= 1 into vals. */
static int parse_list(const char *s, uint32_t *vals, int *n)
{
	char list[512];
	snprintf(list, sizeof(list), "%s", s);
	for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
		if (*n == MAX_SWEEP || parse_u32(tok, &vals[*n]) || vals[*n] == 0)
			return -1;
		(*n)++;
	}
	return 0;
}

static int parse_preset(const char *s, bkv_roofline_preset *p)
{
	if (!strcmp(s, "a100-llama2-13b"))
		*p = BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16;
	else if (!strcmp(s, "h100-llama3-8b"))
		*p = BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16;
	else if (!strcmp(s, "a100-opt-13b"))
		*p = BKV_ROOFLINE_A100_80GB_OPT_13B_FP16;
	else
		return -1;
	return 0;
}

/* ---- setters of one shape, placed by the row's offset -------------------- */

/* A flag: the int at off becomes lo. */
static int set_flag(cli_args *a, const cli_option *opt, const char *v)
{
	*FIELD(a, opt, int) = (int)opt->lo;
	return SET_OK;
}

/* A string kept as given (argv outlives the run). */
static int set_str(cli_args *a, const cli_option *opt, const char *v)
{
	*FIELD(a, opt, const char *) = v;
	return SET_OK;
}

/* A count in [lo, hi]: not a number is a bad value, below lo or above hi
 * says the bound; none (an ARG_DIGITS row's, --overlap [N]) is lo. */
static int set_u32(cli_args *a, const cli_option *opt, const char *v)
{
	uint32_t *p = FIELD(a, opt, uint32_t);
	if (!v)
		*p = opt->lo;
	else if (parse_u32(v, p))
		return SET_BAD;
	if (*p < opt->lo) {
		fprintf(stderr, "bkv-sim: %s %u: at least %u\n", opt->name, *p, opt->lo);
		return SET_STOP;
	}
	if (*p > opt->hi) {
		fprintf(stderr, "bkv-sim: %s %u: at most %u\n", opt->name, *p, opt->hi);
		return SET_STOP;
	}
	return SET_OK;
}

/* A power of two in [lo, hi] (--block-tokens: the pool's rule). */
static int set_pow2(cli_args *a, const cli_option *opt, const char *v)
{
	uint32_t *p = FIELD(a, opt, uint32_t);
	if (parse_u32(v, p))
		return SET_BAD;
	if (*p < opt->lo || *p > opt->hi || (*p & (*p - 1))) {
		fprintf(stderr, "bkv-sim: %s %u: must be a power of two in %u..%u\n", opt->name,
			*p, opt->lo, opt->hi);
		return SET_STOP;
	}
	return SET_OK;
}

/* A count >= 1, or "auto" (0: the cost model decides). */
static int set_u32_or_auto(cli_args *a, const cli_option *opt, const char *v)
{
	uint32_t *p = FIELD(a, opt, uint32_t);
	if (!strcmp(v, "auto"))
		*p = 0;
	else if (parse_u32(v, p) || *p == 0)
		return SET_BAD;
	return SET_OK;
}

/* A time in units of lo microseconds into a uint64_t, or "never"
 * (UINT64_MAX). */
static int set_us_or_never(cli_args *a, const cli_option *opt, const char *v)
{
	uint64_t *p = FIELD(a, opt, uint64_t);
	uint32_t t;
	if (!strcmp(v, "never"))
		*p = UINT64_MAX;
	else if (parse_u32(v, &t))
		return SET_BAD;
	else
		*p = (uint64_t)t * opt->lo;
	return SET_OK;
}

/* A time in ms (a decimal) stored in a uint32_t field as us, 0..lo ms. */
static int set_ms_as_us(cli_args *a, const cli_option *opt, const char *v)
{
	uint32_t *p = FIELD(a, opt, uint32_t);
	char *end;
	double ms = strtod(v, &end);
	if (end == v || *end || !(ms >= 0.0) || ms > opt->lo)
		return SET_BAD;
	*p = (uint32_t)llround(ms * 1000.0);
	return SET_OK;
}

/* A decimal in [0, hi] into a double field (0 < value for lo 1). */
static int set_double(cli_args *a, const cli_option *opt, const char *v)
{
	double *p = FIELD(a, opt, double);
	char *end;
	double x = strtod(v, &end);
	if (end == v || *end || !(x >= 0.0) || (opt->lo && x == 0.0))
		return SET_BAD;
	if (x > opt->hi) {
		fprintf(stderr, "bkv-sim: %s %s: at most %u\n", opt->name, v, opt->hi);
		return SET_STOP;
	}
	*p = x;
	return SET_OK;
}

/* --noise SIGMA[,STALL_P,STALL_X]: sigma in [0, 3], stall_p in [0, 1],
 * stall_x >= 1 (default 10). */
static int set_noise(cli_args *a, const cli_option *opt, const char *v)
{
	(void)opt;
	double x[3] = {0.0, 0.0, 10.0};
	const char *p = v;
	for (int i = 0; i < 3; i++) {
		char *end;
		x[i] = strtod(p, &end);
		if (end == p)
			return SET_BAD;
		if (*end == '\0')
			break;
		if (*end != ',' || i == 2 || (i == 0 && !strchr(end + 1, ',')))
			return SET_BAD;
		p = end + 1;
	}
	if (!(x[0] >= 0.0 && x[0] <= 3.0) || !(x[1] >= 0.0 && x[1] <= 1.0) || !(x[2] >= 1.0))
		return SET_BAD;
	a->c.noise_sigma = x[0];
	a->c.noise_stall_p = x[1];
	a->c.noise_stall_x = x[2];
	return SET_OK;
}

/* --ext-tier LAT_US,GBPS,CAP_BLOCKS[,warm]: latency >= 0 us, bandwidth > 0
 * GB/s, capacity 1..MAX_EXT_BLOCKS entries. */
static int set_ext_tier(cli_args *a, const cli_option *opt, const char *v)
{
	(void)opt;
	const char *arg = v;
	char *end;
	double lat = strtod(v, &end), gbps;
	unsigned long cap;
	if (end == v || *end != ',')
		return SET_BAD;
	v = end + 1;
	gbps = strtod(v, &end);
	if (end == v || *end != ',')
		return SET_BAD;
	v = end + 1;
	errno = 0;
	cap = strtoul(v, &end, 10);
	if (end == v || errno || *v == '-' || (*end && strcmp(end, ",warm")))
		return SET_BAD;
	if (!(lat >= 0.0 && lat <= 1e9) || !(gbps > 0.0 && gbps <= 1e6) || cap < 1 ||
	    cap > MAX_EXT_BLOCKS) {
		fprintf(stderr, "bkv-sim: --ext-tier %s: latency 0..1e9 us, bandwidth above 0 "
			"(at most 1e6 GB/s), capacity 1..%u blocks\n", arg, MAX_EXT_BLOCKS);
		return SET_STOP;
	}
	a->c.ext_latency_us = lat;
	a->c.ext_gbps = gbps;
	a->c.ext_blocks = (uint32_t)cap;
	a->c.ext_warm = *end != '\0';
	return SET_OK;
}

/* A length distribution (trace_dist_parse) of at most MAX_LEN tokens; lo:
 * seed 000's generation mix is allowed. */
static int set_dist(cli_args *a, const cli_option *opt, const char *v)
{
	trace_dist *d = FIELD(a, opt, trace_dist);
	if (trace_dist_parse(v, d) || (!opt->lo && d->kind == DIST_SEED000_GEN)) {
		fprintf(stderr, "bkv-sim: bad value for %s: '%s' (%s1 to %u tokens)\n", opt->name,
			v, opt->lo ? "N, LO..HI or seed000; " : "N or LO..HI, ", MAX_LEN);
		return SET_STOP;
	}
	if (d->hi > MAX_LEN || d->lo > MAX_LEN) {
		fprintf(stderr, "bkv-sim: %s %s: at most %u tokens\n", opt->name, v, MAX_LEN);
		return SET_STOP;
	}
	return SET_OK;
}

/* ---- setters of one option each ------------------------------------------ */

static int set_help(cli_args *a, const cli_option *opt, const char *v)
{
	usage(stdout);
	return SET_HELP;
}

static int set_workload(cli_args *a, const cli_option *opt, const char *v)
{
	if (strcmp(v, "seed000") && strcmp(v, "synthetic") && strcmp(v, "sessions"))
		return SET_BAD;
	a->o.workload = v;
	if (!strcmp(v, "sessions")) { /* its own defaults, unless given before */
		if (a->o.prompt.kind == DIST_UNIFORM && a->o.prompt.lo == 8 && a->o.prompt.hi == 64)
			a->o.prompt = (trace_dist){DIST_UNIFORM, 6144, 10240};
		if (a->o.output.kind == DIST_SEED000_GEN)
			a->o.output = (trace_dist){DIST_CONST, 64, 64};
		if (a->o.arrival == ARRIVAL_BURST)
			a->o.arrival = ARRIVAL_UNIFORM, a->o.rate = 0.5;
	}
	return SET_OK;
}

/* FORMAT:PATH */
static int set_calib_csv(cli_args *a, const cli_option *opt, const char *v)
{
	(void)opt;
	a->c.calib_csv = v;
	return SET_OK;
}

static int set_trace(cli_args *a, const cli_option *opt, const char *v)
{
	const char *colon = strchr(v, ':');
	if (!colon)
		return SET_BAD;
	size_t k = (size_t)(colon - v);
	if (k == 5 && !strncmp(v, "azure", 5))
		a->o.fmt = TRACE_AZURE;
	else if (k == 8 && !strncmp(v, "mooncake", 8))
		a->o.fmt = TRACE_MOONCAKE;
	else if (k == 9 && !strncmp(v, "distserve", 9))
		a->o.fmt = TRACE_DISTSERVE;
	else
		return SET_BAD;
	a->o.trace_path = colon + 1;
	return SET_OK;
}

static int set_requests(cli_args *a, const cli_option *opt, const char *v)
{
	if (parse_u32(v, &a->o.n) || a->o.n == 0)
		return SET_BAD;
	if (a->o.n > MAX_REQS) {
		fprintf(stderr, "bkv-sim: --n %u is more than %u requests\n", a->o.n, MAX_REQS);
		return SET_STOP;
	}
	return SET_OK;
}

/* rr | shuffle */
static int set_order(cli_args *a, const cli_option *opt, const char *v)
{
	if (!strcmp(v, "rr"))
		a->o.sessions.order = SESSIONS_ROUND_ROBIN;
	else if (!strcmp(v, "shuffle"))
		a->o.sessions.order = SESSIONS_SHUFFLE;
	else
		return SET_BAD;
	return SET_OK;
}

/* burst | uniform:R | poisson:R | bursty:R */
static int set_arrival(cli_args *a, const cli_option *opt, const char *v)
{
	if (!strcmp(v, "burst")) {
		a->o.arrival = ARRIVAL_BURST;
	} else if (!strncmp(v, "uniform:", 8) || !strncmp(v, "poisson:", 8) ||
		   !strncmp(v, "bursty:", 7)) {
		a->o.arrival = v[0] == 'u' ? ARRIVAL_UNIFORM : v[1] == 'o' ? ARRIVAL_POISSON
									   : ARRIVAL_BURSTY;
		char *end;
		a->o.rate = strtod(strchr(v, ':') + 1, &end);
		if (*end || !(a->o.rate > 0))
			return SET_BAD;
	} else {
		return SET_BAD;
	}
	return SET_OK;
}

/* N (seeds 0..N-1) or A..B */
static int set_seeds(cli_args *a, const cli_option *opt, const char *v)
{
	uint32_t lo, hi;
	const char *dots = strstr(v, "..");
	if (dots) {
		char tmp[32];
		snprintf(tmp, sizeof(tmp), "%.*s", (int)(dots - v), v);
		if (parse_u32(tmp, &lo) || parse_u32(dots + 2, &hi) || hi < lo)
			return SET_BAD;
	} else {
		if (parse_u32(v, &hi) || hi == 0)
			return SET_BAD;
		lo = 0;
		hi -= 1;
	}
	a->o.seed_lo = lo;
	a->o.seed_hi = hi;
	a->o.seeds_set = 1;
	return SET_OK;
}

static int set_policy(cli_args *a, const cli_option *opt, const char *v)
{
	sim_config *c = &a->c;
	if (!strcmp(v, "static"))
		c->policy = BKV_POLICY_STATIC;
	else if (!strcmp(v, "continuous"))
		c->policy = BKV_POLICY_CONTINUOUS;
	else if (!strcmp(v, "chunked"))
		c->policy = BKV_POLICY_CONTINUOUS, a->o.policy_chunked = 1;
	else if (!strcmp(v, "auto"))
		c->policy = BKV_POLICY_CONTINUOUS, c->k = 0;
	else
		return SET_BAD;
	return SET_OK;
}

/* --compare [K,K,..]: v is the list, or NULL when none follows. */
static int set_compare(cli_args *a, const cli_option *opt, const char *v)
{
	a->o.compare = 1;
	if (v && parse_list(v, a->o.cmp_k, &a->o.n_cmp_k))
		return SET_BAD;
	return SET_OK;
}

static int set_host(cli_args *a, const cli_option *opt, const char *v)
{
	if (!strcmp(v, "split"))
		a->c.mixed_host = 0;
	else if (!strcmp(v, "mixed"))
		a->c.mixed_host = 1;
	else
		return SET_BAD;
	a->o.host_set = 1;
	return SET_OK;
}

/* KEY=V,V,.. with KEY one of k, budget, slots, max_adapters */
static int set_sweep(cli_args *a, const cli_option *opt, const char *v)
{
	opts *o = &a->o;
	const char *eq = strchr(v, '=');
	if (!eq || eq - v >= (long)sizeof(o->sweep_key))
		return SET_BAD;
	snprintf(o->sweep_key, sizeof(o->sweep_key), "%.*s", (int)(eq - v), v);
	if (strcmp(o->sweep_key, "k") && strcmp(o->sweep_key, "budget") &&
	    strcmp(o->sweep_key, "slots") && strcmp(o->sweep_key, "max_adapters"))
		return SET_BAD;
	o->n_sweep = 0;
	if (parse_list(eq + 1, o->sweep_vals, &o->n_sweep) || !o->n_sweep)
		return SET_BAD;
	return SET_OK;
}

static int set_cost(cli_args *a, const cli_option *opt, const char *v)
{
	sim_config *c = &a->c;
	bkv_roofline_preset p;
	a->o.cost_name = v;
	a->o.big_gpu = strstr(v, "h100") != NULL;
	if (!strcmp(v, "poly")) {
		c->cost_kind = SIM_COST_POLY;
	} else if (!strcmp(v, "poly-packed")) {
		c->cost_kind = SIM_COST_POLY;
		c->poly.packed = 1;
	} else if (!strcmp(v, "distserve")) {
		c->cost_kind = SIM_COST_DISTSERVE;
	} else if (!strncmp(v, "roofline:", 9) && !parse_preset(v + 9, &p)) {
		c->cost_kind = SIM_COST_ROOFLINE;
		bkv_cost_roofline_init(&c->roofline, p);
	} else {
		return SET_BAD;
	}
	return SET_OK;
}

static int set_gen(cli_args *a, const cli_option *opt, const char *v)
{
	if (!strcmp(v, "steps"))
		a->c.gen = SIM_GEN_STEPS;
	else if (!strcmp(v, "tokens"))
		a->c.gen = SIM_GEN_TOKENS;
	else
		return SET_BAD;
	a->o.gen_set = 1;
	return SET_OK;
}

static int set_evict(cli_args *a, const cli_option *opt, const char *v)
{
	(void)opt;
	if (!strcmp(v, "lru"))
		a->c.evict = BKV_EVICT_LRU;
	else if (!strcmp(v, "value"))
		a->c.evict = BKV_EVICT_VALUE;
	else if (!strcmp(v, "segmented"))
		a->c.evict = BKV_EVICT_SEGMENTED;
	else
		return SET_BAD;
	return SET_OK;
}

static int set_layout(cli_args *a, const cli_option *opt, const char *v)
{
	(void)opt;
	if (!strcmp(v, "flat"))
		a->c.batch_layout = BKV_BATCH_FLAT;
	else if (!strcmp(v, "persistent"))
		a->c.batch_layout = BKV_BATCH_PERSISTENT;
	else
		return SET_BAD;
	return SET_OK;
}

static int set_victim(cli_args *a, const cli_option *opt, const char *v)
{
	(void)opt;
	if (!strcmp(v, "recent"))
		a->c.victim = BKV_VICTIM_RECENT;
	else if (!strcmp(v, "cost"))
		a->c.victim = BKV_VICTIM_COST;
	else
		return SET_BAD;
	return SET_OK;
}

static int set_reserve(cli_args *a, const cli_option *opt, const char *v)
{
	(void)opt;
	if (!strcmp(v, "prompt"))
		a->c.admit_reserve = BKV_RESERVE_PROMPT;
	else if (!strcmp(v, "output"))
		a->c.admit_reserve = BKV_RESERVE_OUTPUT;
	else
		return SET_BAD;
	return SET_OK;
}

/* --json, --csv: lo is the sim_format. */
static int set_format(cli_args *a, const cli_option *opt, const char *v)
{
	a->o.fmt_out = (sim_format)opt->lo;
	return SET_OK;
}

static int set_rate(cli_args *a, const cli_option *opt, const char *v)
{
	char *end;
	a->o.trace_rate = strtod(v, &end);
	if (*end || !(a->o.trace_rate > 0) || a->o.trace_rate > 1e9)
		return SET_BAD;
	return SET_OK;
}

/* --spec-k K|auto[:MAX]: fixed drafts per row, or the cost model's choice
 * up to MAX (default 8). */
static int set_spec_k(cli_args *a, const cli_option *opt, const char *v)
{
	(void)opt;
	a->c.spec_auto = !strncmp(v, "auto", 4);
	if (a->c.spec_auto) {
		a->c.spec_k = 8;
		if (v[4] == ':' && (parse_u32(v + 5, &a->c.spec_k) || !a->c.spec_k))
			return SET_BAD;
		else if (v[4] && v[4] != ':')
			return SET_BAD;
	} else if (parse_u32(v, &a->c.spec_k) || !a->c.spec_k) {
		return SET_BAD;
	}
	return a->c.spec_k <= BKV_SPEC_MAX_K ? SET_OK : SET_BAD;
}

/* --spec-accept A[,SPREAD] */
static int set_spec_accept(cli_args *a, const cli_option *opt, const char *v)
{
	char *end;
	(void)opt;
	a->c.spec_accept = strtod(v, &end);
	a->c.spec_spread = 0.0;
	if (*end == ',')
		a->c.spec_spread = strtod(end + 1, &end);
	if (*end || !(a->c.spec_accept >= 0.0) || !(a->c.spec_accept < 1.0) ||
	    !(a->c.spec_spread >= 0.0) || !(a->c.spec_spread <= 1.0))
		return SET_BAD;
	return SET_OK;
}

/* TTFT_MS,TPOT_MS[,PCT] */
static int set_goodput(cli_args *a, const cli_option *opt, const char *v)
{
	opts *o = &a->o;
	char *end;
	o->gp_pct = 90.0;
	o->gp_ttft_ms = strtod(v, &end);
	if (*end != ',')
		return SET_BAD;
	o->gp_tpot_ms = strtod(end + 1, &end);
	if (*end == ',')
		o->gp_pct = strtod(end + 1, &end);
	if (*end || !(o->gp_ttft_ms > 0) || !(o->gp_tpot_ms > 0) || !(o->gp_pct > 0) ||
	    o->gp_pct > 100 || o->gp_ttft_ms > 1e9 || o->gp_tpot_ms > 1e9)
		return SET_BAD;
	o->goodput = 1;
	return SET_OK;
}

/* ---- the table ----------------------------------------------------------- */

#define HEADING(text) {NULL, ARG_NONE, NULL, 0, 0, 0, text}
#define FLAG(name, field, value, help) {name, ARG_NONE, set_flag, field, value, 0, help}
#define COUNT(name, field, lo, hi, help) {name, ARG_VALUE, set_u32, field, lo, hi, help}
#define VALUE(name, setter, help) {name, ARG_VALUE, setter, 0, 0, 0, help}

static const cli_option options[] = {
	{"--help", ARG_NONE, set_help, 0, 0, 0, NULL},
	{"-h", ARG_NONE, set_help, 0, 0, 0, NULL},
	HEADING("workload (one of):\n"),
	VALUE("--workload", set_workload,
	      "  --workload seed000         seed 000's 256 requests (default)\n"
	      "  --workload synthetic       --n N --arrival burst|uniform:R|poisson:R|bursty:R\n"
	      "                             --prompt N|LO..HI --output N|LO..HI|seed000\n"
	      "                             (bursty: Poisson bursts of 8 requests on average,\n"
	      "                             a geometric number, R requests/s in all)\n"
	      "  --workload sessions        --sessions S --turns T --grow G --order rr|shuffle:\n"
	      "                             S sessions in rotation, T rounds; a turn re-reads\n"
	      "                             its session's context and adds G tokens (default\n"
	      "                             12, 10, 512, rr; first contexts --prompt, default\n"
	      "                             6144..10240; --output 64; --arrival uniform:0.5)\n"),
	COUNT("--sessions", OPT(sessions.sessions), 1, 100000, NULL),
	COUNT("--turns", OPT(sessions.turns), 1, 100000, NULL),
	COUNT("--grow", OPT(sessions.grow), 0, MAX_LEN, NULL),
	VALUE("--order", set_order, NULL),
	VALUE("--n", set_requests, NULL),
	VALUE("--arrival", set_arrival, NULL),
	{"--prompt", ARG_VALUE, set_dist, OPT(prompt), 0, 0, NULL},
	{"--output", ARG_VALUE, set_dist, OPT(output), 1, 0, NULL},
	VALUE("--trace", set_trace,
	      "  --trace azure:FILE | mooncake:FILE | distserve:FILE [--run NAME]\n"),
	{"--run", ARG_VALUE, set_str, OPT(run), 0, 0, NULL},
	COUNT("--limit", OPT(limit), 1, UINT32_MAX,
	      "  --limit N                  first N >= 1 requests of a trace (without\n"
	      "                             it, the whole trace)\n"),
	VALUE("--rate", set_rate,
	      "  --rate R                   a trace's arrivals scaled to R req/s (its mean\n"
	      "                             rate: (n - 1) / span)\n"),
	FLAG("--no-spread", OPT(no_spread), 1,
	     "  --no-spread                with --rate or --goodput, keep a bucketed\n"
	     "                             trace's arrivals as recorded (default: the\n"
	     "                             requests sharing a time are spread uniformly\n"
	     "                             over their bucket, by the first seed)\n"),
	VALUE("--seeds", set_seeds,
	      "  --seeds N | A..B           seeds of synthetic workloads (seed000: 0..20)\n"),
	HEADING("policy:\n"),
	VALUE("--policy", set_policy,
	      "  --policy static|continuous|chunked|auto   (default continuous; auto =\n"
	      "                             continuous with the cost model choosing k)\n"),
	{"--k", ARG_VALUE, set_u32_or_auto, CFG(k), 0, 0,
	 "  --k N|auto                 admission group (default 1)\n"},
	{"--budget", ARG_VALUE, set_u32_or_auto, CFG(budget), 0, 0,
	 "  --budget N|auto            token budget of chunked prefill (default 512)\n"},
	COUNT("--tpot", CFG(tpot_us), 0, UINT32_MAX,
	      "  --tpot US                  the scheduler's time-between-tokens target\n"),
	{"--ttft", ARG_VALUE, set_ms_as_us, CFG(ttft_us), 4000000, 0,
	 "  --ttft MS                  the scheduler's time-to-first-token target\n"},
	COUNT("--max-tokens", CFG(max_tokens), 1, MAX_LEN,
	      "  --max-tokens N             every request's max_new_tokens (default 4096);\n"
	      "                             it ends by a stop token at its trace length\n"
	      "                             (or at N when that is shorter)\n"),
	FLAG("--oracle-lengths", CFG(oracle), 1,
	     "  --oracle-lengths           max_new_tokens = the trace length, no stop\n"
	     "                             token: the scheduler knows every length\n"),
	FLAG("--hints", CFG(hints), 1,
	     "  --hints                    requests carry their output length as a hint\n"
	     "                             (not the static baseline: it stays FCFS)\n"),
	{"--max-bypass", ARG_VALUE, set_us_or_never, CFG(max_bypass_us), 1000, 0,
	 "  --max-bypass MS|never      bound on the delay hints may add (default\n"
	 "                             auto: max_bypass_us = 0)\n"},
	{"--compare", ARG_DIGITS, set_compare, 0, 0, 0,
	 "  --compare [K,K,..]         static, k=1, fixed k (default 1,2,3,4,6,8,12,16,\n"
	 "                             24,32 up to --slots; the best is reported), auto,\n"
	 "                             chunked b=512 and chunked auto on a mixed host,\n"
	 "                             same traces, with ratios\n"},
	FLAG("--peers", OPT(peers), 1,
	     "  --peers                    with --compare: rows vllm-v1, vllm-v0, sglang,\n"
	     "                             sarathi, tgi, llamacpp, orca (each peer's\n"
	     "                             defaults in our knobs; docs/benchmarks.md)\n"),
	{"--max-wait", ARG_VALUE, set_us_or_never, CFG(max_wait_us), 1, 0,
	 "  --max-wait US|never        partial-group timeout (default never)\n"},
	VALUE("--spec-k", set_spec_k,
	      "  --spec-k K|auto[:MAX]      speculative decoding: K drafts per decode\n"
	      "                             row, or k chosen by the cost model up to MAX\n"
	      "                             (default 8); off by default\n"),
	VALUE("--spec-accept", set_spec_accept,
	      "  --spec-accept A[,S]        each draft accepted with probability A (each\n"
	      "                             request's A drawn from A +- S); default 0\n"),
	COUNT("--adapters", CFG(adapters), 0, 1000000,
	      "  --adapters N               LoRA: each request runs with one of N adapters,\n"
	      "                             rank k drawn with weight k^-S (--adapter-zipf S,\n"
	      "                             default 1; 0 = uniform); default none\n"),
	{"--adapter-zipf", ARG_VALUE, set_double, CFG(adapter_zipf), 0, 10, NULL},
	COUNT("--max-adapters", CFG(max_adapters), 0, BKV_MAX_ADAPTERS,
	      "  --max-adapters K           with --adapters: at most K adapters among the\n"
	      "                             running requests (the host's LoRA slots;\n"
	      "                             default 0 = N, no cap)\n"),
	COUNT("--adapter-wait-us", CFG(adapter_wait_us), 0, UINT32_MAX,
	      "  --adapter-wait-us US       bound on how long a request whose adapter has\n"
	      "                             no slot is passed by others (default 0 = auto)\n"),
	COUNT("--mm-images", CFG(mm_images), 0, 10000000,
	      "  --mm-images N              multimodal: requests carry images of N distinct\n"
	      "                             ones, rank k drawn with weight k^-S (--mm-zipf S,\n"
	      "                             default 1; 0 = uniform); default none (mm.c)\n"),
	{"--mm-zipf", ARG_VALUE, set_double, CFG(mm_zipf), 0, 10, NULL},
	COUNT("--mm-per-request", CFG(mm_per_request), 1, BKV_MAX_ENCODER_INPUTS,
	      "  --mm-per-request K         each request carries 1..K images, uniform (as\n"
	      "                             many as its prompt holds; default 1)\n"),
	COUNT("--mm-tokens", CFG(mm_tokens), 1, 1000000,
	      "  --mm-tokens T              prompt positions per image (default 576)\n"),
	{"--mm-encode-us", ARG_VALUE, set_double, CFG(mm_encode_us), 0, 1000000,
	 "  --mm-encode-us U           the host's encoder time per image token, us\n"
	 "                             (default 10; an assumption, mm.c)\n"},
	COUNT("--encoder-budget", CFG(encoder_budget), 0, UINT32_MAX,
	      "  --encoder-budget B         image tokens encoded per step at most\n"
	      "                             (default 0 = no bound)\n"),
	COUNT("--encoder-cache", CFG(encoder_cache), 0, UINT32_MAX,
	      "  --encoder-cache C          the host's encoder cache, tokens (default 0 =\n"
	      "                             8 x K x T)\n"),
	COUNT("--slots", CFG(slots), 1, MAX_SLOTS,
	      "  --slots N                  running slots (default 32)\n"),
	VALUE("--host", set_host,
	      "  --host split|mixed         split prefill/decode kernels or one forward\n"),
	FLAG("--no-baseline", OPT(baseline), 0,
	     "  --no-baseline              no static row; speed-ups are not reported\n"
	     "                             (not with --compare: its static row is the\n"
	     "                             reference of its ratios)\n"),
	VALUE("--sweep", set_sweep, "  --sweep k=1,2,4|budget=..|slots=..|max_adapters=..\n"),
	HEADING("cost model:\n"),
	VALUE("--cost", set_cost,
	      "  --cost poly|poly-packed|distserve|roofline:PRESET\n"
	      "     presets: a100-llama2-13b, h100-llama3-8b, a100-opt-13b\n"),
	{"--shape", ARG_VALUE, set_str, OPT(shape), 0, 0,
	 "  --shape NAME|custom:SPEC   the model's KV groups, in the pool and the\n"
	 "                             roofline (a preset also sets its weights):\n"
	 "     llama3-8b, gpt-oss-20b, gpt-oss-120b, gemma3-27b, llama4-scout,\n"
	 "     qwen3-next-80b; SPEC: KIND[SPAN]:LAYERSxBYTES,... with KIND full,\n"
	 "     windowW, chunkC, state[INTERVAL], e.g. full:12x2048,window128:12x2048\n"},
	FLAG("--no-model", CFG(give_model), 0,
	     "  --no-model                 do not give the model to the scheduler\n"),
	FLAG("--calibrate", CFG(calibrate), 1,
	     "  --calibrate                give the scheduler a calibrated model that\n"
	     "                             learns from scratch (observe) instead\n"),
	VALUE("--noise", set_noise,
	      "  --noise SIGMA[,P,X]        a noisy clock: each call takes the model's\n"
	      "                             time x lognormal(0, SIGMA), and with\n"
	      "                             probability P also x X (a stall; X default\n"
	      "                             10), over that factor's mean (1); the\n"
	      "                             scheduler gets a calibrated model over the\n"
	      "                             given one, learning from what it measures\n"),
	COUNT("--noise-seed", CFG(noise_seed32), 0, UINT32_MAX,
	      "  --noise-seed N             the noise's generator seed (default 1)\n"),
	VALUE("--calib-csv", set_calib_csv,
	      "  --calib-csv FILE           the scheduler's calibrated model (over the\n"
	      "                             given one, or from scratch with --calibrate)\n"
	      "                             first learns the step times FILE measured\n"
	      "                             (kind,decode_rows,decode_context,\n"
	      "                             prefill_tokens,measured_us: a real engine's,\n"
	      "                             e.g. examples/python/gpu_step_times.py)\n"),
	FLAG("--noise-exact", CFG(noise_exact), 1,
	     "  --noise-exact              with --noise, give the scheduler the exact\n"
	     "                             model instead (no calibration)\n"),
	VALUE("--gen", set_gen,
	      "  --gen steps|tokens         output length = decode steps after prefill\n"
	      "                             (seed000 default) or tokens (trace default)\n"),
	HEADING("pool:\n"),
	COUNT("--kv-blocks", CFG(kv_blocks), 0, MAX_BLOCKS,
	      "  --kv-blocks N --block-tokens N --host-blocks N --no-prefix-cache\n"),
	{"--block-tokens", ARG_VALUE, set_pow2, CFG(block_tokens), 1, MAX_BLOCK_TOKENS, NULL},
	COUNT("--host-blocks", CFG(host_blocks), 0, MAX_BLOCKS, NULL),
	COUNT("--state-units", CFG(state_units), 0, MAX_BLOCKS,
	      "  --state-units N            a recurrent-state shape's state units (live\n"
	      "                             states and checkpoints; default 2 x the\n"
	      "                             pool's sequences)\n"),
	FLAG("--state-share", CFG(state_share), 1,
	     "  --state-share              its units share the frames with attention\n"
	     "                             (--state-units is then their floor)\n"),
	FLAG("--no-prefix-cache", CFG(prefix_cache), 0, NULL),
	FLAG("--host-cache", CFG(host_cache), 1,
	     "  --host-cache               the host tier (--host-blocks) also keeps the\n"
	     "                             blocks the device cache evicts; hits reload\n"
	     "                             them (bkv_pool_config.host_cache)\n"),
	FLAG("--copy-overlap", CFG(copy_overlap), 1,
	     "  --copy-overlap             the host runs swap copies beside its kernels:\n"
	     "                             a call takes max(compute, copies out, copies\n"
	     "                             in) instead of their sum\n"),
	COUNT("--host-link-gbps", CFG(host_link_gbps), 1, 100000,
	      "  --host-link-gbps N         device<->host link, GB/s (default 25): every\n"
	      "                             swap copy costs its KV over it (roofline)\n"),
	VALUE("--ext-tier", set_ext_tier,
	      "  --ext-tier LAT_US,GBPS,CAP_BLOCKS[,warm]  an external KV tier behind\n"
	      "                             the KV connector (ext.c): CAP_BLOCKS blocks\n"
	      "                             (LRU), a link of GBPS GB/s each way, LAT_US\n"
	      "                             us per transfer; computed blocks are saved to\n"
	      "                             it, prompts load from it; warm: it starts\n"
	      "                             with every prompt's blocks (else empty)\n"),
	VALUE("--evict", set_evict,
	      "  --evict lru|value|segmented  the prefix cache's eviction policy\n"
	      "                             (bkv_sched_config.evict; default lru here,\n"
	      "                             segmented in bkv_sched_config_init)\n"),
	VALUE("--layout", set_layout,
	      "  --layout flat|persistent   the batch layout (bkv_sched_config.\n"
	      "                             batch_layout; default flat)\n"),
	VALUE("--victim", set_victim,
	      "  --victim recent|cost       preemption's victim (bkv_sched_config.victim;\n"
	      "                             default recent)\n"),
	VALUE("--reserve", set_reserve,
	      "  --reserve prompt|output    what admission keeps room for\n"
	      "                             (bkv_sched_config.admit_reserve; default prompt)\n"),
	HEADING("output:\n"),
	{"--json", ARG_NONE, set_format, 0, SIM_JSON, 0,
	 "  --json | --csv             instead of the table\n"},
	{"--csv", ARG_NONE, set_format, 0, SIM_CSV, 0, NULL},
	{"--svg", ARG_VALUE, set_str, OPT(svg), 0, 0,
	 "  --svg FILE                 prefill/decode time bars per row; with --goodput,\n"
	 "                             p99 TTFT and TPOT against rate per row\n"},
	FLAG("--fidelity", OPT(fidelity), 1,
	     "  --fidelity                 (distserve) every run vs its measurement\n"),
	COUNT("--host-overhead-us", CFG(host_overhead_us), 0, 10000000,
	      "  --host-overhead-us N       the host's own CPU time per step, us (default\n"
	      "                             0): synchronously it adds to every step\n"),
	FLAG("--prefill-first", CFG(prefill_first), 1,
	     "  --prefill-first            split host: a step that admits makes only its\n"
	     "                             prefill call; rows decode in the next step\n"
	     "                             that admits none (vLLM v0's iterations)\n"),
	{"--call-overhead-us", ARG_VALUE, set_double, CFG(call_overhead_us), 0, 10000000,
	 "  --call-overhead-us X       engine time per host call beyond the cost\n"
	 "                             model's forward, us (a decimal; default 0)\n"},
	{"--row-overhead-us", ARG_VALUE, set_double, CFG(row_overhead_us), 0, 10000000,
	 "  --row-overhead-us X        engine time per row of a call (sampling,\n"
	 "                             streaming its token), us (default 0)\n"},
	{"--prefill-scale", ARG_VALUE, set_double, CFG(prefill_scale), 1, 1000,
	 "  --prefill-scale F          the cost model's price of prefill work times\n"
	 "                             F > 0 (default 1); with the two above, an\n"
	 "                             engine calibration (fidelity_calib.py)\n"},
	{"--overlap", ARG_DIGITS, set_u32, CFG(overlap), 1, BKV_OVERLAP_MAX_DEPTH,
	 "  --overlap [N]              the overlapped contract (bkv_step_launch /\n"
	 "                             bkv_step_complete), N steps deep (1..8, default\n"
	 "                             1): a step takes max(device, host) instead of\n"
	 "                             their sum; a mixed host\n"},
	FLAG("--check", CFG(check), 1,
	     "  --check                    bkv_sched_check after every step\n"),
	VALUE("--goodput", set_goodput,
	      "  --goodput TTFT_MS,TPOT_MS[,PCT]  per policy, the highest arrival rate\n"
	      "                             (req/s) at which PCT% (default 90) of requests\n"
	      "                             meet both targets; needs arrivals spread in\n"
	      "                             time (a trace, or --arrival poisson:R|uniform:R)\n"),
	FLAG("--allow-errors", OPT(allow_errors), 1,
	     "  --allow-errors             exit 0 even when requests fail (default: a\n"
	     "                             warning and exit status 3)\n"),
	FLAG("--quiet", OPT(quiet), 1,
	     "  --quiet                    no progress on stderr (on a terminal a line\n"
	     "                             rewritten in place; else a line every few s)\n"),
};

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static void usage(FILE *f)
{
	fputs("usage: bkv-sim [options]\n", f);
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (options[i].help)
			fputs(options[i].help, f);
	fputs("sizes are bounded: --n <= 1000000 (and 10^7 over all seeds), --prompt and\n"
	      "--output <= 1048576 tokens, pools <= 4194304 blocks, --slots <= 65536\n",
	      f);
}

static const cli_option *find_option(const char *name)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (options[i].name && !strcmp(options[i].name, name))
			return &options[i];
	return NULL;
}

/* ---- parsing ------------------------------------------------------------- */

static void defaults(cli_args *a)
{
	memset(a, 0, sizeof(*a));
	a->o.workload = "seed000";
	a->o.n = 256;
	a->o.baseline = 1;
	a->o.prompt = (trace_dist){DIST_UNIFORM, 8, 64};
	a->o.output = (trace_dist){DIST_SEED000_GEN, 1, 64};
	a->o.sessions = (trace_sessions_spec){12, 10, 512, SESSIONS_ROUND_ROBIN};
	a->o.cost_name = "poly";
	sim_config_init(&a->c);
}

/* What depends on several options, once they are all read. */
static void settle(cli_args *a)
{
	opts *o = &a->o;
	sim_config *c = &a->c;
	if (o->policy_chunked) {
		c->chunked = 1;
		if (!o->host_set)
			c->mixed_host = 1;
	}
	if (c->overlap && !o->host_set)
		c->mixed_host = 1; /* a launch is one mixed call */
	c->progress = o->quiet ? 0 : isatty(2) ? 1 : 2;
	if (!o->gen_set)
		c->gen = (!o->trace_path && !strcmp(o->workload, "seed000")) ? SIM_GEN_STEPS
									     : SIM_GEN_TOKENS;
}

/* The adapters' options need --adapters; a swept cap is at most
 * BKV_MAX_ADAPTERS. */
static int check_adapters(const cli_args *a)
{
	const sim_config *c = &a->c;
	const int swept = !strcmp(a->o.sweep_key, "max_adapters");
	if (!c->adapters && (c->max_adapters || c->adapter_wait_us || swept)) {
		fprintf(stderr, "bkv-sim: %s needs --adapters N\n",
			swept ? "--sweep max_adapters" : c->max_adapters ? "--max-adapters"
									  : "--adapter-wait-us");
		return -1;
	}
	for (int i = 0; swept && i < a->o.n_sweep; i++)
		if (a->o.sweep_vals[i] > BKV_MAX_ADAPTERS) {
			fprintf(stderr, "bkv-sim: --sweep max_adapters=%u: at most %u\n",
				a->o.sweep_vals[i], BKV_MAX_ADAPTERS);
			return -1;
		}
	return 0;
}

/* The images' options need --mm-images; one image must fit the encoder
 * cache and the budget (the scheduler refuses a request whose image never
 * could). */
static int check_mm(const cli_args *a)
{
	const sim_config *c = &a->c;
	const char *need = c->encoder_cache ? "--encoder-cache"
			   : c->encoder_budget ? "--encoder-budget" : NULL;
	if (!c->mm_images && need) {
		fprintf(stderr, "bkv-sim: %s needs --mm-images N\n", need);
		return -1;
	}
	if (c->mm_images && c->encoder_cache && c->encoder_cache < c->mm_tokens) {
		fprintf(stderr, "bkv-sim: --encoder-cache %u: at least --mm-tokens (%u)\n",
			c->encoder_cache, c->mm_tokens);
		return -1;
	}
	if (c->mm_images && c->encoder_budget && c->encoder_budget < c->mm_tokens) {
		fprintf(stderr, "bkv-sim: --encoder-budget %u: at least --mm-tokens (%u)\n",
			c->encoder_budget, c->mm_tokens);
		return -1;
	}
	return 0;
}

/* What one option alone cannot check: a fixed admission group must fit in
 * the running slots (the scheduler refuses admit_group > max_running). */
static int check_settled(const cli_args *a)
{
	const sim_config *c = &a->c;
	if (a->o.compare && !a->o.baseline) {
		fprintf(stderr, "bkv-sim: --no-baseline does not apply to --compare: its static "
			"row is the reference of every speed-up and ratio it reports (without "
			"--compare, --policy P or --sweep runs rows without it)\n");
		return -1;
	}
	if (c->k > c->slots) {
		fprintf(stderr, "bkv-sim: --k %u: at most --slots (%u): an admission group "
			"larger than the running slots never fills\n", c->k, c->slots);
		return -1;
	}
	if (check_adapters(a) || check_mm(a))
		return -1;
	if (c->ext_gbps > 0.0 && !c->prefix_cache) {
		fprintf(stderr, "bkv-sim: --ext-tier needs the prefix cache (not with "
			"--no-prefix-cache): loaded blocks join it\n");
		return -1;
	}
	for (int i = 0; !strcmp(a->o.sweep_key, "k") && i < a->o.n_sweep; i++)
		if (a->o.sweep_vals[i] > c->slots) {
			fprintf(stderr, "bkv-sim: --sweep k=%u: at most --slots (%u)\n",
				a->o.sweep_vals[i], c->slots);
			return -1;
		}
	return 0;
}

/* --shape, once --cost and --block-tokens are known: the pool's groups and
 * the roofline's (shape.c). */
static int apply_shape(cli_args *a)
{
	sim_shape sh;
	char err[256];
	if (sim_shape_parse(a->o.shape, &sh, err, sizeof(err)) ||
	    sim_shape_apply(&sh, &a->c, err, sizeof(err))) {
		fprintf(stderr, "bkv-sim: --shape %s: %s\n", a->o.shape, err);
		return -1;
	}
	return 0;
}

int cli_parse(int argc, char **argv, cli_args *a)
{
	defaults(a);
	for (int i = 1; i < argc; i++) {
		const char *name = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		const cli_option *opt = find_option(name);
		if (!opt) {
			fprintf(stderr, "bkv-sim: unknown option '%s' (see --help)\n", name);
			return 2;
		}
		if (opt->arg == ARG_VALUE) {
			if (!v) {
				fprintf(stderr, "bkv-sim: %s needs a value\n", name);
				return 2;
			}
			i++;
		} else if (opt->arg == ARG_DIGITS && v && v[0] >= '0' && v[0] <= '9') {
			i++;
		} else {
			v = NULL;
		}
		switch (opt->set(a, opt, v)) {
		case SET_BAD:
			fprintf(stderr, "bkv-sim: bad value for %s: '%s'\n", name, v);
			return 2;
		case SET_STOP:
			return 2;
		case SET_HELP:
			return 0;
		default:
			break;
		}
	}
	settle(a);
	if (check_settled(a))
		return 2;
	return a->o.shape && apply_shape(a) ? 2 : -1;
}
