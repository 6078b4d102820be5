/*
 * test_filestore.c - the file store KV connector (examples/connectors/
 * filestore.h) on its own: its connector ops called directly, as the
 * scheduler would, over a fake device memory (bytes per (group, block)),
 * with transfers completed through the config's done hook, which records
 * each completion so that every test can require that each transfer it
 * started completed exactly once.
 *
 * Two KV groups: group 0 attention blocks of BLOCK0 bytes, group 1 a state
 * group of STATE1 bytes per frame. Device contents are a function of
 * (group, block id, seed) so a load can be checked byte for byte.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "filestore.h"

#define BLOCK0 200u  /* bytes of a group-0 block */
#define STATE1 64u   /* bytes of a group-1 frame */
#define DEV_BLOCKS 64u
#define MAX_DONE 64u

/* The fake device and the completions recorded. */
typedef struct dev {
	uint8_t mem[2][DEV_BLOCKS][BLOCK0]; /* [group][block] bytes */
	uint32_t copy_fail;                 /* 1: copy_in and copy_out fail */
	pthread_mutex_t lock;               /* guards the fields below */
	pthread_cond_t cond;                /* signalled at each completion */
	uint32_t n_done;                    /* completions recorded */
	uint64_t xfer[MAX_DONE];            /* [n_done] their ids, in order */
	int status[MAX_DONE];               /* [n_done] their status */
	uint32_t n_failed[MAX_DONE];        /* [n_done] failed blocks */
	uint32_t failed[MAX_DONE][16];      /* [n_done] first 16 failed indices */
} dev;

static dev D;
static char dir[64];

static size_t block_bytes(void *host, uint32_t group, uint32_t frames)
{
	(void)host;
	return group == 0 ? BLOCK0 : (size_t)STATE1 * frames;
}

static int copy_out(void *host, const bkv_kv_xfer_block *b, void *dst, size_t n)
{
	dev *d = host;

	if (d->copy_fail)
		return -1;
	/* a state's frames are consecutive: frames x STATE1 <= BLOCK0 here */
	memcpy(dst, d->mem[b->group][b->block], n);
	return 0;
}

static int copy_in(void *host, const bkv_kv_xfer_block *b, const void *src, size_t n)
{
	dev *d = host;

	if (d->copy_fail)
		return -1;
	memcpy(d->mem[b->group][b->block], src, n);
	return 0;
}

static void on_done(void *host, uint64_t xfer, int status, const uint32_t *failed, uint32_t n)
{
	dev *d = host;
	uint32_t k, i;

	pthread_mutex_lock(&d->lock);
	k = d->n_done;
	if (k >= MAX_DONE)
		abort(); /* may run on the store's worker: no cr_assert here */
	d->xfer[k] = xfer;
	d->status[k] = status;
	d->n_failed[k] = n;
	for (i = 0; i < n && i < 16; i++)
		d->failed[k][i] = failed[i];
	d->n_done = k + 1;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

/* The completion of xfer: its record index; fails unless exactly one. */
static uint32_t done_of(uint64_t xfer)
{
	uint32_t i, k = UINT32_MAX, seen = 0;

	for (i = 0; i < D.n_done; i++)
		if (D.xfer[i] == xfer) {
			k = i;
			seen++;
		}
	cr_assert_eq(seen, 1, "transfer %llu completed %u times", (unsigned long long)xfer, seen);
	return k;
}

static void rm_rf(const char *path)
{
	struct stat st;
	DIR *d;
	struct dirent *e;
	char sub[512];

	if (lstat(path, &st) != 0)
		return;
	if (S_ISDIR(st.st_mode) && (d = opendir(path)) != NULL) {
		while ((e = readdir(d)) != NULL) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
			rm_rf(sub);
		}
		closedir(d);
		rmdir(path);
	} else {
		unlink(path);
	}
}

static void setup(void)
{
	memset(&D.mem, 0, sizeof(D.mem));
	D.copy_fail = 0;
	D.n_done = 0;
	pthread_mutex_init(&D.lock, NULL);
	pthread_cond_init(&D.cond, NULL);
	strcpy(dir, "/tmp/bkv-filestore-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	rm_rf(dir);
}

TestSuite(filestore, .init = setup, .fini = teardown);

static bkv_filestore *open_store(uint32_t sync, uint64_t capacity)
{
	bkv_filestore_config c;
	bkv_filestore *fs = NULL;

	bkv_filestore_config_init(&c);
	c.dir = dir;
	c.sync = sync;
	c.capacity_bytes = capacity;
	c.host = &D;
	c.block_bytes = block_bytes;
	c.copy_out = copy_out;
	c.copy_in = copy_in;
	c.done = on_done;
	cr_assert_eq(bkv_filestore_open(&c, &fs), BKV_OK);
	return fs;
}

static bkv_filestore_stats stats(bkv_filestore *fs)
{
	bkv_filestore_stats st;

	cr_assert_eq(bkv_filestore_stats_get(fs, &st), BKV_OK);
	return st;
}

/* Distinct hashes whose low bytes differ (distinct subdirectories). */
static uint64_t H(uint32_t i)
{
	return 0x0123456789000000ull + (uint64_t)i * 0x10101ull + 1;
}

static void fill(uint32_t group, uint32_t block, uint32_t seed)
{
	uint32_t i;

	for (i = 0; i < BLOCK0; i++)
		D.mem[group][block][i] = (uint8_t)(seed * 131u + i * 7u + group * 29u + 1u);
}

static int same(uint32_t group, uint32_t block, uint32_t seed, size_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (D.mem[group][block][i] != (uint8_t)(seed * 131u + i * 7u + group * 29u + 1u))
			return 0;
	return 1;
}

static bkv_kv_xfer_block blk(uint64_t hash, uint32_t index, uint32_t block)
{
	bkv_kv_xfer_block b = {hash, index, 0, (int32_t)block, 1};

	return b;
}

static void block_file(uint64_t hash, char *out, size_t n)
{
	snprintf(out, n, "%s/%02x/%016llx", dir, (unsigned)(hash & 0xff), (unsigned long long)hash);
}

static int exists(uint64_t hash)
{
	char p[512];

	block_file(hash, p, sizeof(p));
	return access(p, F_OK) == 0;
}

/* Save blocks 0..n-1 of group 0 (device blocks 0..n-1, seeds 0..n-1) as
 * hashes H(first..first+n-1) in one transfer; require it completed with no
 * failure. */
static void save_n(bkv_connector *c, uint64_t xfer, uint32_t first, uint32_t n)
{
	bkv_kv_xfer_block b[16];
	uint32_t i, k;

	for (i = 0; i < n; i++) {
		fill(0, i, first + i);
		b[i] = blk(H(first + i), i, i);
	}
	cr_assert_eq(c->save(c->user, xfer, b, n), 0);
	k = done_of(xfer);
	cr_assert_eq(D.status[k], BKV_OK);
	cr_assert_eq(D.n_failed[k], 0);
}

/* Load hashes H(first..) into device blocks 32.. after clearing them. */
static uint32_t load_n(bkv_connector *c, uint64_t xfer, uint32_t first, uint32_t n)
{
	bkv_kv_xfer_block b[16];
	uint32_t i;

	for (i = 0; i < n; i++) {
		memset(D.mem[0][32 + i], 0, BLOCK0);
		b[i] = blk(H(first + i), i, 32 + i);
	}
	cr_assert_eq(c->load(c->user, xfer, 1, b, n), 0);
	return done_of(xfer);
}

static int lookup_n(bkv_connector *c, uint32_t first, uint32_t n)
{
	uint64_t h[16];
	uint32_t i;

	for (i = 0; i < n; i++)
		h[i] = H(first + i);
	return c->lookup(c->user, 1, h, n);
}

Test(filestore, save_then_load_round_trips_every_byte)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_connector c;
	bkv_kv_xfer_block st[2];
	uint32_t i, k;

	cr_assert_eq(bkv_filestore_connector(fs, &c), BKV_OK);
	cr_assert_eq(c.user, fs);
	save_n(&c, 1, 0, 6);
	for (i = 0; i < 6; i++)
		cr_assert(exists(H(i)));
	/* a state unit of 3 frames in group 1 */
	fill(1, 4, 77);
	st[0] = (bkv_kv_xfer_block){0xabcdef01ull, 6, 1, 4, 3};
	cr_assert_eq(c.save(c.user, 2, st, 1), 0);
	cr_assert_eq(D.n_failed[done_of(2)], 0);

	cr_assert_eq(lookup_n(&c, 0, 6), 6);
	k = load_n(&c, 3, 0, 6);
	cr_assert_eq(D.status[k], BKV_OK);
	cr_assert_eq(D.n_failed[k], 0);
	for (i = 0; i < 6; i++)
		cr_assert(same(0, 32 + i, i, BLOCK0), "block %u differs after load", i);
	memset(D.mem[1][9], 0, BLOCK0);
	st[1] = (bkv_kv_xfer_block){0xabcdef01ull, 6, 1, 9, 3};
	cr_assert_eq(c.load(c.user, 4, 1, &st[1], 1), 0);
	cr_assert_eq(D.n_failed[done_of(4)], 0);
	cr_assert(same(1, 9, 77, 3 * STATE1));
	cr_assert_eq(D.mem[1][9][3 * STATE1], 0, "the load wrote past the state's frames");

	bkv_filestore_stats s = stats(fs);
	cr_assert_eq(s.saves, 7);
	cr_assert_eq(s.loads, 7);
	cr_assert_eq(s.blocks, 7);
	cr_assert_eq(s.used_bytes, 6 * (48 + BLOCK0) + 48 + 3 * STATE1);
	cr_assert_eq(s.bytes_written, s.used_bytes);
	cr_assert_eq(s.bytes_read, 6 * BLOCK0 + 3 * STATE1);
	cr_assert_eq(s.lookups, 1);
	cr_assert_eq(s.hits, 6);
	cr_assert_eq(D.n_done, 4);
	bkv_filestore_close(fs);
}

Test(filestore, lookup_counts_leading_hits_only)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_connector c;
	uint64_t h[4] = {H(0), H(1), H(9), H(2)};

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 3);
	cr_assert_eq(c.lookup(c.user, 1, h, 4), 2);
	cr_assert_eq(c.lookup(c.user, 1, h + 2, 2), 0);
	cr_assert_eq(c.lookup(c.user, 1, h, 0), 0);
	cr_assert_eq(stats(fs).hits, 2);
	bkv_filestore_close(fs);
}

Test(filestore, save_skips_blocks_already_present)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_connector c;

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 4);
	save_n(&c, 2, 2, 4); /* H(2), H(3) present, H(4), H(5) new */
	bkv_filestore_stats s = stats(fs);
	cr_assert_eq(s.saves, 6);
	cr_assert_eq(s.save_skipped, 2);
	cr_assert_eq(s.blocks, 6);
	bkv_filestore_close(fs);
}

Test(filestore, a_reopened_store_serves_the_blocks_on_disk)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_connector c;
	uint32_t i, k;
	char tmp[512];

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 5);
	bkv_filestore_close(fs);
	/* a leftover temporary file (a crash mid-write) is removed at open */
	block_file(H(7), tmp, sizeof(tmp));
	strcat(tmp, ".tmp");
	cr_assert_eq(close(open(tmp, O_WRONLY | O_CREAT, 0644)), 0);

	memset(&D.mem, 0, sizeof(D.mem));
	fs = open_store(1, 0);
	bkv_filestore_connector(fs, &c);
	cr_assert_eq(access(tmp, F_OK), -1);
	bkv_filestore_stats s = stats(fs);
	cr_assert_eq(s.blocks, 5);
	cr_assert_eq(s.used_bytes, 5 * (48 + BLOCK0));
	cr_assert_eq(s.corrupt, 0);
	cr_assert_eq(lookup_n(&c, 0, 6), 5);
	k = load_n(&c, 2, 0, 5);
	cr_assert_eq(D.n_failed[k], 0);
	for (i = 0; i < 5; i++)
		cr_assert(same(0, 32 + i, i, BLOCK0));
	bkv_filestore_close(fs);
}

static void set_mtime(uint64_t hash, time_t t)
{
	struct timespec ts[2] = {{t, 0}, {t, 0}};
	char p[512];

	block_file(hash, p, sizeof(p));
	cr_assert_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
}

Test(filestore, capacity_evicts_least_recently_used_first)
{
	/* room for exactly three files */
	bkv_filestore *fs = open_store(1, 3 * (48 + BLOCK0));
	bkv_connector c;

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 3);          /* H0 H1 H2; H0 least recent */
	cr_assert_eq(lookup_n(&c, 0, 1), 1); /* H0 used: H1 is now LRU */
	save_n(&c, 2, 3, 1);          /* H3 evicts H1 */
	cr_assert_eq(lookup_n(&c, 0, 1), 1);
	cr_assert_eq(lookup_n(&c, 1, 1), 0);
	cr_assert_eq(lookup_n(&c, 2, 2), 2);
	cr_assert(!exists(H(1)));
	cr_assert(exists(H(0)) && exists(H(2)) && exists(H(3)));
	save_n(&c, 3, 4, 2);          /* H4 H5 evict H0, then H2 */
	cr_assert(!exists(H(0)) && !exists(H(2)));
	cr_assert(exists(H(3)) && exists(H(4)) && exists(H(5)));
	bkv_filestore_stats s = stats(fs);
	cr_assert_eq(s.evictions, 3);
	cr_assert_eq(s.blocks, 3);
	cr_assert_eq(s.used_bytes, 3 * (48 + BLOCK0));
	bkv_filestore_close(fs);
	/* reopened smaller: the file written longest ago goes first (the
	 * times set here, so the order is not the hashes' order) */
	set_mtime(H(5), 1000);
	set_mtime(H(3), 2000);
	set_mtime(H(4), 3000);
	fs = open_store(1, 2 * (48 + BLOCK0));
	bkv_filestore_connector(fs, &c);
	cr_assert_eq(stats(fs).blocks, 2);
	cr_assert_eq(stats(fs).evictions, 1);
	cr_assert_eq(lookup_n(&c, 5, 1), 0);
	cr_assert_eq(lookup_n(&c, 3, 2), 2);
	bkv_filestore_close(fs);
}

Test(filestore, a_block_larger_than_the_capacity_fails_alone)
{
	bkv_filestore *fs = open_store(1, 2 * (48 + BLOCK0));
	bkv_connector c;
	bkv_kv_xfer_block b[2];
	uint32_t k;

	bkv_filestore_connector(fs, &c);
	fill(0, 0, 1);
	fill(1, 0, 2);
	b[0] = blk(H(0), 0, 0);
	b[1] = (bkv_kv_xfer_block){H(1), 1, 1, 0, 100}; /* 6,400 bytes */
	cr_assert_eq(c.save(c.user, 1, b, 2), 0);
	k = done_of(1);
	cr_assert_eq(D.status[k], BKV_OK);
	cr_assert_eq(D.n_failed[k], 1);
	cr_assert_eq(D.failed[k][0], 1);
	cr_assert(exists(H(0)) && !exists(H(1)));
	cr_assert_eq(stats(fs).save_failed, 1);
	bkv_filestore_close(fs);
}

/* Overwrite one byte of hash's file at offset off (from the end when < 0). */
static void poke(uint64_t hash, long off)
{
	char p[512];
	uint8_t byte;
	FILE *f;

	block_file(hash, p, sizeof(p));
	f = fopen(p, "r+b");
	cr_assert_not_null(f);
	cr_assert_eq(fseek(f, off, off < 0 ? SEEK_END : SEEK_SET), 0);
	cr_assert_eq(fread(&byte, 1, 1, f), 1);
	byte ^= 0x10;
	cr_assert_eq(fseek(f, -1, SEEK_CUR), 0);
	cr_assert_eq(fwrite(&byte, 1, 1, f), 1);
	fclose(f);
}

/* Load H(0..n) and require exactly the one failed index bad, caught as
 * corrupt, its file deleted and its entry dropped; the others intact. */
static void expect_one_corrupt(bkv_filestore *fs, bkv_connector *c, uint32_t n, uint32_t bad)
{
	uint32_t k, i;

	k = load_n(c, 100, 0, n);
	cr_assert_eq(D.status[k], BKV_OK);
	cr_assert_eq(D.n_failed[k], 1);
	cr_assert_eq(D.failed[k][0], bad);
	for (i = 0; i < n; i++)
		if (i != bad)
			cr_assert(same(0, 32 + i, i, BLOCK0));
	cr_assert(!exists(H(bad)));
	cr_assert_eq(lookup_n(c, bad, 1), 0);
	bkv_filestore_stats s = stats(fs);
	cr_assert_eq(s.corrupt, 1);
	cr_assert_eq(s.load_failed, 1);
	cr_assert_eq(s.blocks, n - 1);
}

Test(filestore, a_flipped_payload_byte_is_caught_by_the_checksum)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_connector c;

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 4);
	poke(H(2), 48 + 100);
	expect_one_corrupt(fs, &c, 4, 2);
	bkv_filestore_close(fs);
}

Test(filestore, a_flipped_header_byte_is_caught)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_connector c;

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 3);
	poke(H(0), 20); /* frames */
	expect_one_corrupt(fs, &c, 3, 0);
	bkv_filestore_close(fs);
}

Test(filestore, a_truncated_file_is_caught_at_load_and_at_open)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_connector c;
	char p[512];

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 4);
	block_file(H(1), p, sizeof(p));
	cr_assert_eq(truncate(p, 48 + BLOCK0 - 10), 0);
	expect_one_corrupt(fs, &c, 4, 1);
	/* at open: caught by the size the header claims, before any load */
	block_file(H(3), p, sizeof(p));
	cr_assert_eq(truncate(p, 30), 0);
	block_file(H(2), p, sizeof(p));
	cr_assert_eq(truncate(p, 48 + 5), 0);
	bkv_filestore_close(fs);
	fs = open_store(1, 0);
	bkv_filestore_connector(fs, &c);
	bkv_filestore_stats s = stats(fs);
	cr_assert_eq(s.corrupt, 2);
	cr_assert_eq(s.blocks, 1);
	cr_assert_eq(lookup_n(&c, 0, 4), 1);
	cr_assert(!exists(H(2)) && !exists(H(3)));
	bkv_filestore_close(fs);
}

Test(filestore, a_write_cut_mid_block_is_caught_by_the_next_load)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_filestore_faults f = {0, 0, 48 + 77};
	bkv_connector c;

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 1);
	cr_assert_eq(bkv_filestore_set_faults(fs, &f), BKV_OK);
	save_n(&c, 2, 1, 3); /* H1 cut after 125 bytes; reported saved */
	cr_assert(exists(H(1)));
	cr_assert_eq(lookup_n(&c, 0, 4), 4);
	expect_one_corrupt(fs, &c, 4, 1);
	bkv_filestore_close(fs);
}

Test(filestore, a_write_cut_mid_block_is_dropped_at_reopen)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_filestore_faults f = {0, 0, 48 + 150};
	bkv_connector c;

	bkv_filestore_connector(fs, &c);
	cr_assert_eq(bkv_filestore_set_faults(fs, &f), BKV_OK);
	save_n(&c, 1, 0, 2); /* H0 cut; H1 whole (the fault is one-shot) */
	bkv_filestore_close(fs);
	fs = open_store(1, 0);
	bkv_filestore_connector(fs, &c);
	cr_assert_eq(stats(fs).corrupt, 1);
	cr_assert_eq(lookup_n(&c, 0, 2), 0);
	cr_assert_eq(lookup_n(&c, 1, 1), 1);
	bkv_filestore_close(fs);
}

/* Files in dir/xx (block files and temporaries). */
static uint32_t count_files(void)
{
	char p[512];
	uint32_t n = 0, sub;
	struct dirent *e;
	DIR *d;

	for (sub = 0; sub < 256; sub++) {
		snprintf(p, sizeof(p), "%s/%02x", dir, sub);
		d = opendir(p);
		cr_assert_not_null(d);
		while ((e = readdir(d)) != NULL)
			n += e->d_name[0] != '.';
		closedir(d);
	}
	return n;
}

Test(filestore, a_full_store_fails_its_writes_and_leaves_no_file)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_filestore_faults f = {0, 1, -1}, none = {0, 0, -1};
	bkv_kv_xfer_block b[3];
	bkv_connector c;
	uint32_t i, k;

	bkv_filestore_connector(fs, &c);
	bkv_filestore_set_faults(fs, &f);
	for (i = 0; i < 3; i++)
		b[i] = blk(H(i), i, i);
	cr_assert_eq(c.save(c.user, 1, b, 3), 0);
	k = done_of(1);
	cr_assert_eq(D.n_failed[k], 3);
	for (i = 0; i < 3; i++)
		cr_assert_eq(D.failed[k][i], i);
	cr_assert_eq(count_files(), 0);
	cr_assert_eq(lookup_n(&c, 0, 3), 0);
	bkv_filestore_stats s = stats(fs);
	cr_assert_eq(s.save_failed, 3);
	cr_assert_eq(s.blocks, 0);
	cr_assert_eq(s.used_bytes, 0);
	/* and it recovers once there is room again */
	bkv_filestore_set_faults(fs, &none);
	save_n(&c, 2, 0, 3);
	cr_assert_eq(lookup_n(&c, 0, 3), 3);
	bkv_filestore_close(fs);
}

Test(filestore, a_copy_error_fails_the_block_and_keeps_the_file)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_connector c;
	uint32_t k;

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 2);
	D.copy_fail = 1;
	k = load_n(&c, 2, 0, 2);
	cr_assert_eq(D.n_failed[k], 2);
	cr_assert(exists(H(0)) && exists(H(1)));
	cr_assert_eq(stats(fs).corrupt, 0);
	cr_assert_eq(lookup_n(&c, 0, 2), 2);
	bkv_filestore_close(fs);
}

Test(filestore, a_missing_file_fails_its_block_and_leaves_the_index)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_connector c;
	char p[512];
	uint32_t k;

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 3);
	block_file(H(1), p, sizeof(p));
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(lookup_n(&c, 0, 3), 3);
	k = load_n(&c, 2, 0, 3);
	cr_assert_eq(D.n_failed[k], 1);
	cr_assert_eq(D.failed[k][0], 1);
	cr_assert(same(0, 32, 0, BLOCK0) && same(0, 34, 2, BLOCK0));
	cr_assert_eq(lookup_n(&c, 0, 3), 1);
	bkv_filestore_stats s = stats(fs);
	cr_assert_eq(s.corrupt, 0);
	cr_assert_eq(s.blocks, 2);
	cr_assert_eq(s.used_bytes, 2 * (48 + BLOCK0));
	bkv_filestore_close(fs);
}

Test(filestore, a_removed_directory_fails_every_transfer_cleanly)
{
	bkv_filestore *fs = open_store(1, 0);
	bkv_kv_xfer_block b[2];
	bkv_connector c;
	uint32_t k;

	bkv_filestore_connector(fs, &c);
	save_n(&c, 1, 0, 3);
	rm_rf(dir);
	cr_assert_eq(lookup_n(&c, 0, 3), 3); /* the index does not know yet */
	k = load_n(&c, 2, 0, 3);
	cr_assert_eq(D.status[k], BKV_OK);
	cr_assert_eq(D.n_failed[k], 3);
	cr_assert_eq(lookup_n(&c, 0, 3), 0); /* a failed load drops them */
	b[0] = blk(H(5), 0, 0);
	b[1] = blk(H(6), 1, 1);
	cr_assert_eq(c.save(c.user, 3, b, 2), 0);
	k = done_of(3);
	cr_assert_eq(D.n_failed[k], 2);
	bkv_filestore_stats s = stats(fs);
	cr_assert_eq(s.blocks, 0);
	cr_assert_eq(s.used_bytes, 0);
	cr_assert_eq(s.load_failed, 3);
	cr_assert_eq(s.save_failed, 2);
	cr_assert_eq(D.n_done, 3);
	bkv_filestore_close(fs);
}

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

Test(filestore, a_slow_store_works_behind_the_callbacks)
{
	bkv_filestore *fs = open_store(0, 0);
	bkv_filestore_faults f = {30000, 0, -1};
	bkv_kv_xfer_block b[4];
	bkv_connector c;
	uint64_t t0;
	uint32_t i;

	bkv_filestore_connector(fs, &c);
	bkv_filestore_set_faults(fs, &f);
	for (i = 0; i < 4; i++) {
		fill(0, i, i);
		b[i] = blk(H(i), i, i);
	}
	t0 = now_us();
	cr_assert_eq(c.save(c.user, 1, b, 2), 0);
	cr_assert_eq(c.save(c.user, 2, b + 2, 2), 0);
	for (i = 0; i < 4; i++)
		b[i] = blk(H(i), i, 32 + i);
	cr_assert_eq(c.load(c.user, 3, 1, b, 4), 0); /* queued behind the saves */
	cr_assert_lt(now_us() - t0, 25000, "a callback waited for the store");
	cr_assert_eq(bkv_filestore_flush(fs), BKV_OK);
	cr_assert_geq(now_us() - t0, 3 * 30000);
	cr_assert_eq(D.n_done, 3);
	/* in the order they were started */
	cr_assert(D.xfer[0] == 1 && D.xfer[1] == 2 && D.xfer[2] == 3);
	for (i = 0; i < 3; i++)
		cr_assert(D.status[i] == BKV_OK && D.n_failed[i] == 0);
	for (i = 0; i < 4; i++)
		cr_assert(same(0, 32 + i, i, BLOCK0));
	bkv_filestore_close(fs);
	cr_assert_eq(D.n_done, 3);
}

Test(filestore, close_completes_queued_transfers_as_failed)
{
	bkv_filestore *fs = open_store(0, 0);
	bkv_filestore_faults f = {50000, 0, -1};
	bkv_kv_xfer_block b[8];
	bkv_connector c;
	uint32_t i, k, ok = 0, cancelled = 0;

	bkv_filestore_connector(fs, &c);
	bkv_filestore_set_faults(fs, &f);
	for (i = 0; i < 8; i++) {
		fill(0, i, i);
		b[i] = blk(H(i), i, i);
	}
	for (i = 0; i < 8; i++)
		cr_assert_eq(c.save(c.user, 10 + i, b + i, 1), 0);
	bkv_filestore_close(fs);
	cr_assert_eq(D.n_done, 8);
	for (i = 0; i < 8; i++) {
		k = done_of(10 + i);
		if (D.status[k] == BKV_OK && D.n_failed[k] == 0)
			ok++;
		else if (D.status[k] == BKV_ESTATE && D.n_failed[k] == 0)
			cancelled++;
	}
	cr_assert_eq(ok + cancelled, 8);
	cr_assert_geq(cancelled, 6, "close waited for the queue (%u cancelled)", cancelled);
	/* what completed as saved is on disk; nothing else is */
	cr_assert_eq(count_files(), ok);
}

Test(filestore, refuses_transfers_it_cannot_complete)
{
	bkv_filestore_config cfg;
	bkv_filestore *fs;
	bkv_connector c;
	bkv_kv_xfer_block b = blk(H(0), 0, 0);

	bkv_filestore_config_init(&cfg);
	cr_assert_eq(bkv_filestore_open(&cfg, &fs), BKV_EINVAL); /* no dir */
	cfg.dir = dir;
	cr_assert_eq(bkv_filestore_open(&cfg, &fs), BKV_EINVAL); /* no callbacks */
	cfg.block_bytes = block_bytes;
	cfg.copy_out = copy_out;
	cfg.copy_in = copy_in;
	cfg.host = &D;
	cfg.sync = 1;
	cr_assert_eq(bkv_filestore_open(&cfg, &fs), BKV_OK);
	bkv_filestore_connector(fs, &c);
	/* neither a done hook nor an attached scheduler: nothing starts */
	cr_assert_eq(c.save(c.user, 1, &b, 1), BKV_ESTATE);
	cr_assert_eq(c.load(c.user, 2, 1, &b, 1), BKV_ESTATE);
	cr_assert_eq(D.n_done, 0);
	bkv_filestore_close(fs);
	bkv_filestore_close(NULL);
}
