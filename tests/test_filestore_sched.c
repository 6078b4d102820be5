/*
 * test_filestore_sched.c - the file store connector under the real
 * scheduler (bkv_sched_config.connector), across a restart.
 *
 * Engine 1 (a pool, a scheduler and a store over a fresh directory) serves
 * requests whose prompts share long prefixes; the library saves their full
 * blocks through the store. It is torn down. Engine 2 (a new pool, a new
 * scheduler, zeroed device memory, a store reopened over the same
 * directory) serves requests with the same prefixes and new tails: the
 * library must load the prefixes from disk (kv_load_tokens) and prefill on
 * from there. Run with the store's worker, with inline transfers (sync),
 * and with a slow store (the engine keeps stepping while loads are in
 * flight), and with one prefix block corrupted on disk between the two
 * engines (the store fails it, the library recomputes from it).
 *
 * The fake device checks every KV cell a batch reads, as tests/compose does:
 * a cell holds (the chained hash of its request's tokens [0, p], p), written
 * at slot_mapping; a row's context cells [0, start) must hold exactly that
 * for the row's own tokens. Engine 2's device starts zeroed, so a context
 * cell read right can only have come from a file the store loaded (or from
 * its own computation). Blocks move as raw cells (block_bytes = cells of
 * one block).
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "filestore.h"

#define BT 16u          /* tokens per block */
#define NBLK 192u       /* device blocks */
#define PREFIX 80u      /* shared prefix tokens (5 blocks) */
#define TAIL 24u        /* per-request tail tokens */
#define MAX_NEW 6u      /* tokens generated per request */
#define NREQ 3u         /* requests per engine (one per prefix) */
#define MAXTOK (PREFIX + TAIL + MAX_NEW + 1)

/* One KV cell of the fake device. */
typedef struct cell {
	uint64_t chain; /* chained hash of the writer's tokens [0, pos] */
	int32_t pos;    /* the token position it holds */
	uint32_t set;   /* 1 once written */
} cell;

/* A request as the host sees it. */
typedef struct rq {
	int32_t tok[MAXTOK];    /* prompt, then the sampled tokens */
	uint64_t chain[MAXTOK]; /* chain[p]: hash over tok[0, p] */
	uint32_t len;           /* tokens in tok */
	uint32_t first_start;   /* context length of its first row; UINT32_MAX
				   before */
	uint32_t finished;      /* on_finish calls */
} rq;

/* One engine: device, requests, library handles, findings. */
typedef struct eng {
	cell dev[NBLK * BT];      /* device KV, one cell per token slot */
	rq req[NREQ];             /* the requests, by submission order */
	uint64_t cells_checked;   /* context cells read and verified */
	uint32_t waiting_steps;   /* steps after which a request still waited
				     for external KV */
	uint32_t bad;             /* checks that failed */
	char why[256];            /* the first failure */
	bkv_pool *pool;           /* owned */
	bkv_sched *sched;         /* owned */
	bkv_filestore *fs;        /* owned */
	bkv_connector conn;       /* the store's ops, copied at create */
} eng;

static char dir[64];

static uint64_t mix(uint64_t h)
{
	h ^= h >> 31;
	h *= 0x9e3779b97f4a7c15ull;
	h ^= h >> 29;
	return h;
}

static void push(rq *q, int32_t t)
{
	q->tok[q->len] = t;
	q->chain[q->len] = mix((q->len ? q->chain[q->len - 1] : 0x5eedull) ^ (uint64_t)(uint32_t)t);
	q->len++;
}

static void fail(eng *e, const char *what, uint32_t a, uint32_t b)
{
	if (!e->bad++)
		snprintf(e->why, sizeof(e->why), "%s (%u, %u)", what, a, b);
}

/* Check row r's context cells and tokens, write its new cells, sample. */
static void run_row(eng *e, const bkv_batch *b, uint32_t r, int32_t *next)
{
	rq *q = b->row_user[r];
	int32_t q0 = b->qo_indptr[r], nnew = b->qo_indptr[r + 1] - q0;
	int32_t k0 = b->kv_indptr[r], npages = b->kv_indptr[r + 1] - k0;
	uint32_t kvlen = (uint32_t)(npages - 1) * BT + (uint32_t)b->kv_last_page_len[r];
	uint32_t start = kvlen - (uint32_t)nnew, p, j;

	if (q->first_start == UINT32_MAX)
		q->first_start = start;
	for (p = 0; p < start; p++) {
		const cell *c = &e->dev[(size_t)b->kv_indices[k0 + p / BT] * BT + p % BT];

		e->cells_checked++;
		if (!c->set || c->pos != (int32_t)p || c->chain != q->chain[p])
			fail(e, "context cell wrong (position, start)", p, start);
	}
	for (j = 0; j < (uint32_t)nnew; j++) {
		p = start + j;
		if (p >= q->len || b->token_ids[q0 + j] != q->tok[p] || b->positions[q0 + j] != (int32_t)p)
			fail(e, "input token wrong (position, len)", p, q->len);
		else
			e->dev[b->slot_mapping[q0 + j]] = (cell){q->chain[p], (int32_t)p, 1};
	}
	if (b->row_sample[r] && kvlen == q->len && q->len < MAXTOK) {
		int32_t t = (int32_t)(1000 + q->chain[kvlen - 1] % 5000);

		push(q, t);
		next[r] = t;
	} else if (b->row_sample[r]) {
		fail(e, "sampled row not at the end (kvlen, len)", kvlen, q->len);
		next[r] = 1;
	}
}

static int forward(void *host, const bkv_batch *b, int32_t *next)
{
	uint32_t r;

	/* no swap or copy lists in this configuration: nothing to move */
	if (b->n_copies || b->n_swap_in || b->n_swap_out)
		fail(host, "unexpected copies (copies, swaps)", b->n_copies, b->n_swap_in);
	for (r = 0; r < b->n_rows; r++)
		run_row(host, b, r, next);
	return 0;
}

static void on_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	(void)req;
	if (why != BKV_FINISH_LENGTH)
		fail(host, "finish reason", (uint32_t)why, 0);
	((rq *)user)->finished++;
}

static size_t block_bytes(void *host, uint32_t group, uint32_t frames)
{
	(void)host;
	return group == 0 && frames == 1 ? BT * sizeof(cell) : 0;
}

static int copy_out(void *host, const bkv_kv_xfer_block *b, void *dst, size_t n)
{
	memcpy(dst, &((eng *)host)->dev[(size_t)b->block * BT], n);
	return 0;
}

static int copy_in(void *host, const bkv_kv_xfer_block *b, const void *src, size_t n)
{
	memcpy(&((eng *)host)->dev[(size_t)b->block * BT], src, n);
	return 0;
}

/* How the store runs: its worker or inline, and a delay per transfer. */
typedef struct mode {
	uint32_t sync;     /* bkv_filestore_config.sync */
	uint32_t delay_us; /* bkv_filestore_faults.delay_us */
} mode;

static eng *eng_start(mode m)
{
	bkv_filestore_faults f = {m.delay_us, 0, -1};
	eng *e = calloc(1, sizeof(*e));
	bkv_filestore_config fc;
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;

	cr_assert_not_null(e);
	bkv_pool_config_init(&pc);
	pc.device_blocks = NBLK;
	pc.block_tokens = BT;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &e->pool), BKV_OK, "%s", bkv_last_error());
	bkv_filestore_config_init(&fc);
	fc.dir = dir;
	fc.host = e;
	fc.block_bytes = block_bytes;
	fc.copy_out = copy_out;
	fc.copy_in = copy_in;
	fc.sync = m.sync;
	cr_assert_eq(bkv_filestore_open(&fc, &e->fs), BKV_OK);
	cr_assert_eq(bkv_filestore_set_faults(e->fs, &f), BKV_OK);
	cr_assert_eq(bkv_filestore_connector(e->fs, &e->conn), BKV_OK);
	bkv_sched_config_init(&sc);
	sc.connector = &e->conn;
	memset(&ops, 0, sizeof(ops));
	ops.forward = forward;
	ops.on_finish = on_finish;
	cr_assert_eq(bkv_sched_create(&sc, e->pool, &ops, e, NULL, &e->sched), BKV_OK, "%s",
		     bkv_last_error());
	cr_assert_eq(bkv_filestore_attach(e->fs, e->sched), BKV_OK);
	return e;
}

static bkv_sched_stats sched_stats(eng *e)
{
	bkv_sched_stats st;

	memset(&st, 0, sizeof(st));
	bkv_sched_stats_get(e->sched, &st);
	return st;
}

/* Submit one request per prefix (tails differ by engine), run them all,
 * then let the saves in flight finish. While a load is in flight the
 * engine keeps stepping, 1 ms apart. */
static void eng_run(eng *e, uint32_t tail_seed)
{
	const struct timespec ms = {0, 1000000};

	uint32_t i, k, steps = 0;

	for (i = 0; i < NREQ; i++) {
		rq *q = &e->req[i];
		bkv_request rqst;

		q->first_start = UINT32_MAX;
		for (k = 0; k < PREFIX; k++)
			push(q, (int32_t)(100 + i * 1000 + k));
		for (k = 0; k < TAIL; k++)
			push(q, (int32_t)(50000 + tail_seed * 1000 + i * 100 + k));
		bkv_request_init(&rqst);
		rqst.prompt = q->tok;
		rqst.prompt_len = q->len;
		rqst.max_new_tokens = MAX_NEW;
		rqst.user = q;
		cr_assert_eq(bkv_submit(e->sched, &rqst, NULL), BKV_OK);
	}
	while (bkv_sched_pending(e->sched) > 0 && steps++ < 20000) {
		cr_assert_eq(bkv_step(e->sched, NULL), BKV_OK);
		if (sched_stats(e).kv_waiting) {
			e->waiting_steps++;
			nanosleep(&ms, NULL);
		}
	}
	cr_assert_eq(bkv_sched_pending(e->sched), 0, "requests still pending after %u steps", steps);
	for (steps = 0; sched_stats(e).kv_save_held > 0 && steps < 100; steps++) {
		bkv_filestore_flush(e->fs);
		cr_assert_eq(bkv_step(e->sched, NULL), BKV_OK);
	}
	cr_assert_eq(sched_stats(e).kv_save_held, 0, "saves still held");
	cr_assert_eq(e->bad, 0, "%u bad checks; first: %s", e->bad, e->why);
	for (i = 0; i < NREQ; i++) {
		cr_assert_eq(e->req[i].finished, 1);
		cr_assert_eq(e->req[i].len, PREFIX + TAIL + MAX_NEW);
	}
}

static void eng_stop(eng *e)
{
	bkv_filestore_close(e->fs);
	bkv_sched_destroy(e->sched);
	bkv_pool_destroy(e->pool);
	free(e);
}

static void rm_rf(const char *path)
{
	struct stat st;
	struct dirent *d;
	char sub[512];
	DIR *dd;

	if (lstat(path, &st) != 0)
		return;
	if (S_ISDIR(st.st_mode) && (dd = opendir(path)) != NULL) {
		while ((d = readdir(dd)) != NULL) {
			if (strcmp(d->d_name, ".") && strcmp(d->d_name, "..")) {
				snprintf(sub, sizeof(sub), "%s/%s", path, d->d_name);
				rm_rf(sub);
			}
		}
		closedir(dd);
		rmdir(path);
	} else {
		unlink(path);
	}
}

static void setup(void)
{
	strcpy(dir, "/tmp/bkv-filestore-sched-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	rm_rf(dir);
}

TestSuite(filestore_sched, .init = setup, .fini = teardown, .timeout = 120);

/* Flip one payload byte of the block file of hash. */
static void corrupt(uint64_t hash)
{
	char p[512];
	FILE *f;
	int c;

	snprintf(p, sizeof(p), "%s/%02x/%016llx", dir, (unsigned)(hash & 0xff),
		 (unsigned long long)hash);
	f = fopen(p, "r+b");
	cr_assert_not_null(f, "no block file %s", p);
	cr_assert_eq(fseek(f, 48 + 5, SEEK_SET), 0);
	c = fgetc(f);
	cr_assert_eq(fseek(f, 48 + 5, SEEK_SET), 0);
	fputc(c ^ 0x40, f);
	fclose(f);
}

/* Engine 1 saves; engine 2 restarts over the same directory (with one
 * prefix block of request 1 corrupted on disk when corrupt_block >= 0). */
static void run_restart(mode m, int corrupt_block)
{
	eng *e;
	bkv_filestore_stats fst;
	bkv_sched_stats st;
	uint64_t hashes[PREFIX / BT];
	uint32_t i, first1 = PREFIX;

	rm_rf(dir); /* each run starts from an empty store */
	cr_assert_eq(mkdir(dir, 0700), 0);
	e = eng_start(m);
	eng_run(e, 1);
	st = sched_stats(e);
	cr_assert_geq(st.kv_saved, NREQ * PREFIX / BT);
	cr_assert_eq(st.kv_save_failed, 0);
	cr_assert_eq(st.kv_load_tokens, 0, "a fresh store served a load");
	cr_assert_eq(bkv_filestore_stats_get(e->fs, &fst), BKV_OK);
	cr_assert_eq(fst.saves, st.kv_saved);
	cr_assert_eq(fst.blocks, st.kv_saved);
	cr_assert_eq(bkv_block_hashes(0, 0, BT, e->req[1].tok, PREFIX, hashes), PREFIX / BT);
	eng_stop(e);
	if (corrupt_block >= 0) {
		corrupt(hashes[corrupt_block]);
		first1 = (uint32_t)corrupt_block * BT;
	}

	e = eng_start(m);
	cr_assert_eq(bkv_filestore_stats_get(e->fs, &fst), BKV_OK);
	cr_assert_eq(fst.blocks, st.kv_saved, "the reopened store lost blocks");
	eng_run(e, 2);
	st = sched_stats(e);
	cr_assert_eq(st.kv_load_tokens, (NREQ - 1) * PREFIX + first1);
	cr_assert_eq(st.kv_load_failed > 0, corrupt_block >= 0);
	for (i = 0; i < NREQ; i++)
		cr_assert_eq(e->req[i].first_start, i == 1 ? first1 : PREFIX,
			     "request %u prefilled from %u", i, e->req[i].first_start);
	/* every context cell read was verified: the loaded ones included */
	cr_assert_geq(e->cells_checked, (NREQ - 1) * PREFIX + first1);
	cr_assert_eq(bkv_filestore_stats_get(e->fs, &fst), BKV_OK);
	cr_assert_eq(fst.corrupt, corrupt_block >= 0 ? 1 : 0);
	cr_assert_eq(fst.load_failed, corrupt_block >= 0 ? 1 : 0);
	/* inline transfers complete inside the callback: a load waits only
	 * for the next step, where its completion takes effect */
	if (m.sync)
		cr_assert_leq(e->waiting_steps, NREQ);
	/* a slow store: the engine kept stepping while loads were in flight */
	if (m.delay_us)
		cr_assert_gt(e->waiting_steps, NREQ);
	eng_stop(e);
}

Test(filestore_sched, a_restarted_engine_loads_its_prefixes_from_disk)
{
	run_restart((mode){0, 0}, -1);
}

Test(filestore_sched, a_corrupt_block_on_disk_is_recomputed_from_there)
{
	run_restart((mode){0, 0}, 2);
}

Test(filestore_sched, inline_transfers_complete_inside_the_callbacks)
{
	run_restart((mode){1, 0}, -1);
	run_restart((mode){1, 0}, 0);
}

Test(filestore_sched, a_slow_store_keeps_the_engine_stepping)
{
	run_restart((mode){0, 20000}, 4);
}
