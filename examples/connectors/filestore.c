/*
 * filestore.c - a KV connector over a directory of block files
 * (filestore.h): the in-memory index, the transfer queue and its worker,
 * the file I/O of loads and saves, and the scan that rebuilds the index
 * when a store is opened again.
 *
 * The index is a chained hash table over a flat array of entries, linked by
 * uint32_t indices, with a second pair of links for the LRU list:
 *
 *   buckets[hash & mask] -> entries[i].hnext -> ... -> NIL
 *   lru_head (most recent) <-> entries[i].prev/next <-> ... <-> lru_tail
 *
 * An entry is a block file the store believes is whole; used_bytes is the
 * sum of their sizes and stays <= capacity_bytes (when set). A load that
 * finds a file missing, short, long or with a bad checksum drops its entry
 * and the file: the index can be wrong (a file cut by a crash, a directory
 * removed underneath) but never trusted past one failed load.
 *
 * Locks: lock guards the index, the counters, the faults and the queue; it
 * is held only for short bookkeeping. io_lock serialises transfers (the
 * worker, or the stepping thread in sync mode) and guards the scratch
 * buffer; taken before lock when both are held. A transfer completes (done
 * hook or bkv_kv_xfer_done) with neither lock held.
 */
#include "filestore.h"

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

#define NIL UINT32_MAX
#define PATH_BYTES 4096

/* One block file in the index. */
typedef struct entry {
	uint64_t hash;  /* the block's chained hash (the file's name) */
	uint64_t bytes; /* the file's size, header included, as written */
	uint32_t hnext; /* next entry in the same bucket; NIL ends. The free
			   list's link while the entry is unused */
	uint32_t prev;  /* LRU neighbour toward the head (more recent); NIL */
	uint32_t next;  /* LRU neighbour toward the tail (less recent); NIL */
	uint32_t pad;   /* zero */
} entry;

enum { JOB_LOAD = 0, JOB_SAVE = 1 };

/* One accepted transfer, queued or running; one allocation. */
typedef struct job {
	struct job *next;           /* queue link (FIFO); NULL ends */
	uint64_t xfer;              /* the id the library gave it */
	uint32_t kind;              /* JOB_LOAD or JOB_SAVE */
	uint32_t n;                 /* blocks */
	uint32_t *failed;           /* [n] scratch for the failed indices */
	bkv_kv_xfer_block blocks[]; /* [n], copied from the call */
} job;

struct bkv_filestore {
	bkv_filestore_config cfg; /* copy of the config; cfg.dir == dir */
	char *dir;                /* the directory (owned) */
	bkv_sched *sched;         /* where transfers complete without a done
				     hook (bkv_filestore_attach); not owned */

	pthread_mutex_t lock;     /* guards every field down to has_worker */
	pthread_cond_t wake;      /* worker: a job queued, or stopping */
	pthread_cond_t idle;      /* flush: queue empty and nothing running */
	entry *entries;           /* [cap] the index's entries */
	uint32_t cap;             /* entries allocated */
	uint32_t free_head;       /* first unused entry (hnext links); NIL */
	uint32_t *buckets;        /* [mask + 1] first entry per bucket; NIL */
	uint32_t mask;            /* buckets - 1 (a power of two minus one) */
	uint32_t count;           /* entries in use (== stats.blocks) */
	uint32_t lru_head;        /* most recently used entry; NIL when empty */
	uint32_t lru_tail;        /* least recently used: evicted first */
	uint64_t used_bytes;      /* sum of bytes over entries in use */
	bkv_filestore_stats st;   /* counters (blocks, used_bytes filled at
				     read) */
	bkv_filestore_faults faults; /* faults injected now */
	job *q_head;              /* queued jobs, oldest first; NULL empty */
	job *q_tail;              /* newest queued job */
	uint32_t running;         /* 1 while the worker runs a job */
	uint32_t stopping;        /* 1 once close began: nothing is accepted */
	uint32_t has_worker;      /* 1 when worker was started */
	pthread_t worker;         /* the I/O thread (when has_worker) */

	pthread_mutex_t io_lock;  /* serialises transfers; guards buf */
	uint8_t *buf;             /* scratch: one block file */
	size_t buf_cap;           /* bytes allocated at buf */
};

/* ---- the index (lock held) ------------------------------------------------ */

static uint32_t bucket_of(const bkv_filestore *fs, uint64_t hash)
{
	return (uint32_t)((hash ^ (hash >> 29) ^ (hash >> 47)) & fs->mask);
}

static uint32_t idx_find(const bkv_filestore *fs, uint64_t hash)
{
	uint32_t i = fs->buckets[bucket_of(fs, hash)];

	while (i != NIL && fs->entries[i].hash != hash)
		i = fs->entries[i].hnext;
	return i;
}

static void lru_unlink(bkv_filestore *fs, uint32_t i)
{
	entry *e = &fs->entries[i];

	if (e->prev != NIL)
		fs->entries[e->prev].next = e->next;
	else
		fs->lru_head = e->next;
	if (e->next != NIL)
		fs->entries[e->next].prev = e->prev;
	else
		fs->lru_tail = e->prev;
	e->prev = e->next = NIL;
}

static void lru_push_head(bkv_filestore *fs, uint32_t i)
{
	entry *e = &fs->entries[i];

	e->prev = NIL;
	e->next = fs->lru_head;
	if (fs->lru_head != NIL)
		fs->entries[fs->lru_head].prev = i;
	fs->lru_head = i;
	if (fs->lru_tail == NIL)
		fs->lru_tail = i;
}

static void lru_touch(bkv_filestore *fs, uint32_t i)
{
	if (fs->lru_head == i)
		return;
	lru_unlink(fs, i);
	lru_push_head(fs, i);
}

/* Double the buckets when they are as many as the entries. */
static int idx_grow_buckets(bkv_filestore *fs)
{
	uint32_t nb = (fs->mask + 1) * 2, i, b;
	uint32_t *nbk = malloc(nb * sizeof(*nbk));

	if (!nbk)
		return BKV_ENOMEM;
	for (i = 0; i < nb; i++)
		nbk[i] = NIL;
	free(fs->buckets);
	fs->buckets = nbk;
	fs->mask = nb - 1;
	for (i = fs->lru_head; i != NIL; i = fs->entries[i].next) {
		b = bucket_of(fs, fs->entries[i].hash);
		fs->entries[i].hnext = fs->buckets[b];
		fs->buckets[b] = i;
	}
	return BKV_OK;
}

/* Add hash (not present) as the most recently used entry. */
static int idx_insert(bkv_filestore *fs, uint64_t hash, uint64_t bytes)
{
	uint32_t i, b;

	if (fs->count >= fs->mask + 1 && idx_grow_buckets(fs) != BKV_OK)
		return BKV_ENOMEM;
	if (fs->free_head == NIL) {
		uint32_t nc = fs->cap ? fs->cap * 2 : 64;
		entry *ne = realloc(fs->entries, nc * sizeof(*ne));

		if (!ne)
			return BKV_ENOMEM;
		fs->entries = ne;
		for (i = nc; i-- > fs->cap;) {
			ne[i].hnext = fs->free_head;
			fs->free_head = i;
		}
		fs->cap = nc;
	}
	i = fs->free_head;
	fs->free_head = fs->entries[i].hnext;
	fs->entries[i].hash = hash;
	fs->entries[i].bytes = bytes;
	fs->entries[i].pad = 0;
	b = bucket_of(fs, hash);
	fs->entries[i].hnext = fs->buckets[b];
	fs->buckets[b] = i;
	lru_push_head(fs, i);
	fs->count++;
	fs->used_bytes += bytes;
	return BKV_OK;
}

static void idx_remove(bkv_filestore *fs, uint32_t i)
{
	uint32_t *link = &fs->buckets[bucket_of(fs, fs->entries[i].hash)];

	while (*link != i)
		link = &fs->entries[*link].hnext;
	*link = fs->entries[i].hnext;
	lru_unlink(fs, i);
	fs->entries[i].hnext = fs->free_head;
	fs->free_head = i;
	fs->count--;
	fs->used_bytes -= fs->entries[i].bytes;
}

/* ---- paths and plain file I/O (no lock needed) ---------------------------- */

static void block_path(const bkv_filestore *fs, uint64_t hash, int tmp, char *out)
{
	snprintf(out, PATH_BYTES, "%s/%02x/%016llx%s", fs->dir, (unsigned)(hash & 0xff),
		 (unsigned long long)hash, tmp ? ".tmp" : "");
}

/* Drop hash's entry, if any, and its file (lock not held). */
static void drop_block(bkv_filestore *fs, uint64_t hash, int corrupt)
{
	char path[PATH_BYTES];
	uint32_t i;

	block_path(fs, hash, 0, path);
	(void)unlink(path);
	pthread_mutex_lock(&fs->lock);
	i = idx_find(fs, hash);
	if (i != NIL)
		idx_remove(fs, i);
	if (corrupt)
		fs->st.corrupt++;
	pthread_mutex_unlock(&fs->lock);
}

static int buf_reserve(bkv_filestore *fs, size_t n)
{
	uint8_t *b;

	if (n <= fs->buf_cap)
		return BKV_OK;
	b = realloc(fs->buf, n);
	if (!b)
		return BKV_ENOMEM;
	fs->buf = b;
	fs->buf_cap = n;
	return BKV_OK;
}

/* Read the whole file at path into fs->buf (io_lock held): its length in
 * *n. BKV_ENOENT: cannot be opened or read; BKV_EINVAL: larger than any
 * valid block file; BKV_ENOMEM. */
static int read_file(bkv_filestore *fs, const char *path, size_t *n)
{
	struct stat st;
	size_t got = 0;
	ssize_t r;
	int fd = open(path, O_RDONLY), rc = BKV_OK;

	if (fd < 0)
		return BKV_ENOENT;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
		rc = BKV_ENOENT;
	else if ((uint64_t)st.st_size > BKV_FILESTORE_HEADER_BYTES + BKV_FILESTORE_MAX_PAYLOAD)
		rc = BKV_EINVAL;
	else
		rc = buf_reserve(fs, (size_t)st.st_size + 1);
	/* read one byte past the size fstat gave, to see a file that grew */
	while (rc == BKV_OK && got < (size_t)st.st_size + 1) {
		r = read(fd, fs->buf + got, (size_t)st.st_size + 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			rc = BKV_ENOENT;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	*n = got;
	return rc;
}

static int write_all(int fd, const uint8_t *p, size_t n, int fail)
{
	ssize_t w;

	if (fail) {
		errno = ENOSPC;
		return -1;
	}
	while (n > 0) {
		w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/*
 * Write fs->buf[0, n) as hash's block file: to HASH.tmp, then rename (io_lock
 * held). cut >= 0 writes only that many bytes (the cut_after fault). BKV_OK;
 * BKV_EHOST on any error (the temporary file removed).
 */
static int write_block(bkv_filestore *fs, uint64_t hash, size_t n, int64_t cut, int fail)
{
	char tmp[PATH_BYTES], path[PATH_BYTES];
	int fd, bad;

	block_path(fs, hash, 1, tmp);
	block_path(fs, hash, 0, path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return BKV_EHOST;
	if (cut >= 0 && (uint64_t)cut < n)
		n = (size_t)cut;
	bad = write_all(fd, fs->buf, n, fail) != 0;
	if (!bad && fs->cfg.fsync)
		bad = fsync(fd) != 0;
	bad |= close(fd) != 0;
	if (!bad)
		bad = rename(tmp, path) != 0;
	if (bad) {
		(void)unlink(tmp);
		return BKV_EHOST;
	}
	return BKV_OK;
}

/* ---- transfers (io_lock held) --------------------------------------------- */

/* Load one block into the device: BKV_OK or the reason it failed. */
static int load_block(bkv_filestore *fs, const bkv_kv_xfer_block *b)
{
	char path[PATH_BYTES];
	bkv_filestore_header h;
	size_t need = fs->cfg.block_bytes(fs->cfg.host, b->group, b->frames), n = 0;
	uint32_t i;
	int rc;

	if (need == 0)
		return BKV_EINVAL;
	block_path(fs, b->hash, 0, path);
	rc = read_file(fs, path, &n);
	if (rc == BKV_ENOENT) {
		drop_block(fs, b->hash, 0);
		return rc;
	}
	if (rc == BKV_OK)
		rc = bkv_filestore_block_parse(fs->buf, n, &h);
	if (rc == BKV_OK && (h.hash != b->hash || h.group != b->group ||
			     h.frames != b->frames || h.payload_bytes != need))
		rc = BKV_EINVAL;
	if (rc == BKV_EINVAL) {
		drop_block(fs, b->hash, 1);
		return rc;
	}
	if (rc != BKV_OK)
		return rc;
	if (fs->cfg.copy_in(fs->cfg.host, b, fs->buf + BKV_FILESTORE_HEADER_BYTES, need) < 0)
		return BKV_EHOST;
	pthread_mutex_lock(&fs->lock);
	i = idx_find(fs, b->hash);
	if (i != NIL)
		lru_touch(fs, i);
	fs->st.loads++;
	fs->st.bytes_read += need;
	pthread_mutex_unlock(&fs->lock);
	return BKV_OK;
}

/* Evict least recently used files until bytes more fit (lock held). */
static void make_room(bkv_filestore *fs, uint64_t bytes)
{
	char path[PATH_BYTES];
	uint32_t i;

	while (fs->cfg.capacity_bytes && fs->lru_tail != NIL &&
	       fs->used_bytes + bytes > fs->cfg.capacity_bytes) {
		i = fs->lru_tail;
		block_path(fs, fs->entries[i].hash, 0, path);
		(void)unlink(path);
		idx_remove(fs, i);
		fs->st.evictions++;
	}
}

/* Save one block: BKV_OK (written, or already present) or why it failed. */
static int save_block(bkv_filestore *fs, const bkv_kv_xfer_block *b)
{
	bkv_filestore_header h;
	size_t need = fs->cfg.block_bytes(fs->cfg.host, b->group, b->frames);
	uint64_t total = (uint64_t)need + BKV_FILESTORE_HEADER_BYTES;
	int64_t cut;
	uint32_t i;
	int fail, rc;

	pthread_mutex_lock(&fs->lock);
	i = idx_find(fs, b->hash);
	if (i != NIL) {
		lru_touch(fs, i);
		fs->st.save_skipped++;
		pthread_mutex_unlock(&fs->lock);
		return BKV_OK;
	}
	pthread_mutex_unlock(&fs->lock);
	if (need == 0 || need > BKV_FILESTORE_MAX_PAYLOAD ||
	    (fs->cfg.capacity_bytes && total > fs->cfg.capacity_bytes))
		return BKV_E2BIG;
	if (buf_reserve(fs, (size_t)total) != BKV_OK)
		return BKV_ENOMEM;
	if (fs->cfg.copy_out(fs->cfg.host, b, fs->buf + BKV_FILESTORE_HEADER_BYTES, need) < 0)
		return BKV_EHOST;
	h.hash = b->hash;
	h.group = b->group;
	h.frames = b->frames;
	h.payload_bytes = need;
	h.checksum = bkv_filestore_checksum(fs->buf + BKV_FILESTORE_HEADER_BYTES, need);
	bkv_filestore_header_encode(&h, fs->buf);

	pthread_mutex_lock(&fs->lock);
	make_room(fs, total);
	cut = fs->faults.cut_after;
	fs->faults.cut_after = -1;
	fail = fs->faults.fail_writes != 0;
	pthread_mutex_unlock(&fs->lock);
	rc = write_block(fs, b->hash, (size_t)total, cut, fail);
	pthread_mutex_lock(&fs->lock);
	if (rc == BKV_OK && idx_find(fs, b->hash) == NIL)
		rc = idx_insert(fs, b->hash, total);
	if (rc == BKV_OK) {
		fs->st.saves++;
		fs->st.bytes_written += cut >= 0 && (uint64_t)cut < total ? (uint64_t)cut : total;
	}
	pthread_mutex_unlock(&fs->lock);
	if (rc == BKV_ENOMEM)
		drop_block(fs, b->hash, 0);
	return rc;
}

static void complete(bkv_filestore *fs, uint64_t xfer, int status, const uint32_t *failed,
		     uint32_t n)
{
	if (fs->cfg.done)
		fs->cfg.done(fs->cfg.host, xfer, status, failed, n);
	else if (fs->sched)
		(void)bkv_kv_xfer_done(fs->sched, xfer, status, n ? failed : NULL, n);
}

/* Run one transfer and complete it (no lock held on entry). */
static void run_job(bkv_filestore *fs, job *j)
{
	struct timespec ts;
	uint32_t i, nf = 0, delay;

	pthread_mutex_lock(&fs->io_lock);
	pthread_mutex_lock(&fs->lock);
	delay = fs->faults.delay_us;
	pthread_mutex_unlock(&fs->lock);
	if (delay) {
		ts.tv_sec = delay / 1000000u;
		ts.tv_nsec = (long)(delay % 1000000u) * 1000;
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}
	for (i = 0; i < j->n; i++) {
		int rc = j->kind == JOB_LOAD ? load_block(fs, &j->blocks[i])
					     : save_block(fs, &j->blocks[i]);
		if (rc != BKV_OK)
			j->failed[nf++] = i;
	}
	pthread_mutex_lock(&fs->lock);
	if (j->kind == JOB_LOAD)
		fs->st.load_failed += nf;
	else
		fs->st.save_failed += nf;
	pthread_mutex_unlock(&fs->lock);
	pthread_mutex_unlock(&fs->io_lock);
	complete(fs, j->xfer, BKV_OK, j->failed, nf);
}

static void *worker_main(void *arg)
{
	bkv_filestore *fs = arg;
	job *j;

	pthread_mutex_lock(&fs->lock);
	for (;;) {
		while (!fs->q_head && !fs->stopping)
			pthread_cond_wait(&fs->wake, &fs->lock);
		if (fs->stopping)
			break; /* close cancels what is still queued */
		j = fs->q_head;
		fs->q_head = j->next;
		if (!fs->q_head)
			fs->q_tail = NULL;
		fs->running = 1;
		pthread_mutex_unlock(&fs->lock);
		run_job(fs, j);
		free(j);
		pthread_mutex_lock(&fs->lock);
		fs->running = 0;
		if (!fs->q_head)
			pthread_cond_broadcast(&fs->idle);
	}
	pthread_mutex_unlock(&fs->lock);
	return NULL;
}

/* ---- the connector's callbacks (the stepping thread) ---------------------- */

static int fs_lookup(void *user, uint64_t req, const uint64_t *hashes, uint32_t n)
{
	bkv_filestore *fs = user;
	uint32_t k, i;

	(void)req;
	pthread_mutex_lock(&fs->lock);
	for (k = 0; k < n; k++) {
		i = idx_find(fs, hashes[k]);
		if (i == NIL)
			break;
		lru_touch(fs, i);
	}
	fs->st.lookups++;
	fs->st.hits += k;
	pthread_mutex_unlock(&fs->lock);
	return (int)k;
}

/* Accept a load or a save: run it now (sync) or queue it for the worker. */
static int submit(bkv_filestore *fs, uint32_t kind, uint64_t xfer, const bkv_kv_xfer_block *blocks,
		  uint32_t n)
{
	job *j;

	if (!fs->cfg.done && !fs->sched)
		return BKV_ESTATE;
	if (n > 0 && !blocks)
		return BKV_EINVAL;
	j = malloc(sizeof(*j) + (size_t)n * (sizeof(j->blocks[0]) + sizeof(uint32_t)));
	if (!j)
		return BKV_ENOMEM;
	j->next = NULL;
	j->xfer = xfer;
	j->kind = kind;
	j->n = n;
	j->failed = (uint32_t *)(void *)(j->blocks + n);
	if (n)
		memcpy(j->blocks, blocks, (size_t)n * sizeof(*blocks));
	if (fs->cfg.sync) {
		run_job(fs, j);
		free(j);
		return BKV_OK;
	}
	pthread_mutex_lock(&fs->lock);
	if (fs->stopping) {
		pthread_mutex_unlock(&fs->lock);
		free(j);
		return BKV_ESTATE;
	}
	if (fs->q_tail)
		fs->q_tail->next = j;
	else
		fs->q_head = j;
	fs->q_tail = j;
	pthread_cond_signal(&fs->wake);
	pthread_mutex_unlock(&fs->lock);
	return BKV_OK;
}

static int fs_load(void *user, uint64_t xfer, uint64_t req, const bkv_kv_xfer_block *blocks,
		   uint32_t n)
{
	(void)req;
	return submit(user, JOB_LOAD, xfer, blocks, n);
}

static int fs_save(void *user, uint64_t xfer, const bkv_kv_xfer_block *blocks, uint32_t n)
{
	return submit(user, JOB_SAVE, xfer, blocks, n);
}

/* ---- open: the directory scan --------------------------------------------- */

/* A block file found by the scan. */
typedef struct found {
	uint64_t hash;  /* from its name, equal to its header's */
	uint64_t bytes; /* its size */
	int64_t mtime;  /* its modification time, ns: the LRU order */
} found;

static int cmp_found(const void *a, const void *b)
{
	const found *x = a, *y = b;

	if (x->mtime != y->mtime)
		return x->mtime < y->mtime ? -1 : 1;
	return x->hash < y->hash ? -1 : x->hash > y->hash;
}

/* Parse a block file's name: 16 lowercase hex digits. */
static int name_hash(const char *name, uint64_t *hash)
{
	uint64_t h = 0;
	int i;

	for (i = 0; i < 16; i++) {
		char c = name[i];

		if (c >= '0' && c <= '9')
			h = h << 4 | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			h = h << 4 | (uint64_t)(c - 'a' + 10);
		else
			return 0;
	}
	*hash = h;
	return name[16] == '\0';
}

/* Check one file's header against its name and size; 1 when valid. */
static int check_file(const char *path, uint64_t hash, found *f)
{
	uint8_t hdr[BKV_FILESTORE_HEADER_BYTES];
	bkv_filestore_header h;
	struct stat st;
	ssize_t r;
	int fd = open(path, O_RDONLY), ok;

	if (fd < 0)
		return 0;
	ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
	r = ok ? read(fd, hdr, sizeof(hdr)) : -1;
	close(fd);
	ok = ok && r == (ssize_t)sizeof(hdr) &&
	     bkv_filestore_header_decode(hdr, sizeof(hdr), &h) == BKV_OK && h.hash == hash &&
	     (uint64_t)st.st_size == BKV_FILESTORE_HEADER_BYTES + h.payload_bytes;
	if (ok) {
		f->hash = hash;
		f->bytes = (uint64_t)st.st_size;
		f->mtime = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	}
	return ok;
}

/* Scan subdirectory sub: collect valid files into *v, delete the rest. */
static int scan_sub(bkv_filestore *fs, unsigned sub, found **v, size_t *n, size_t *cap)
{
	char path[PATH_BYTES];
	struct dirent *e;
	uint64_t hash;
	DIR *d;
	int rc = BKV_OK;

	snprintf(path, sizeof(path), "%s/%02x", fs->dir, sub);
	if (mkdir(path, 0755) != 0 && errno != EEXIST)
		return BKV_EHOST;
	d = opendir(path);
	if (!d)
		return BKV_EHOST;
	while (rc == BKV_OK && (e = readdir(d)) != NULL) {
		size_t len = strlen(e->d_name);

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%02x/%s", fs->dir, sub, e->d_name);
		if (len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0) {
			(void)unlink(path); /* a write a crash cut short */
			continue;
		}
		if (*n == *cap) {
			size_t nc = *cap ? *cap * 2 : 256;
			found *nv = realloc(*v, nc * sizeof(*nv));

			if (!nv) {
				rc = BKV_ENOMEM;
				break;
			}
			*v = nv;
			*cap = nc;
		}
		if (name_hash(e->d_name, &hash) && (hash & 0xff) == sub &&
		    check_file(path, hash, &(*v)[*n])) {
			(*n)++;
		} else if (unlink(path) == 0) {
			fs->st.corrupt++;
		}
	}
	closedir(d);
	return rc;
}

/* Rebuild the index from the directory, oldest file least recent. */
static int scan(bkv_filestore *fs)
{
	found *v = NULL;
	size_t n = 0, cap = 0, i;
	unsigned sub;
	int rc = BKV_OK;

	for (sub = 0; sub < 256 && rc == BKV_OK; sub++)
		rc = scan_sub(fs, sub, &v, &n, &cap);
	if (rc == BKV_OK && n > 1)
		qsort(v, n, sizeof(*v), cmp_found);
	for (i = 0; i < n && rc == BKV_OK; i++)
		rc = idx_insert(fs, v[i].hash, v[i].bytes);
	free(v);
	if (rc == BKV_OK)
		make_room(fs, 0);
	return rc;
}

/* ---- the public functions ------------------------------------------------- */

void bkv_filestore_config_init(bkv_filestore_config *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof(*cfg));
	cfg->size = sizeof(*cfg);
}

static int init_index(bkv_filestore *fs)
{
	uint32_t i;

	fs->mask = 255;
	fs->buckets = malloc((fs->mask + 1) * sizeof(*fs->buckets));
	if (!fs->buckets)
		return BKV_ENOMEM;
	for (i = 0; i <= fs->mask; i++)
		fs->buckets[i] = NIL;
	fs->free_head = fs->lru_head = fs->lru_tail = NIL;
	fs->faults.cut_after = -1;
	return BKV_OK;
}

int bkv_filestore_open(const bkv_filestore_config *cfg, bkv_filestore **out)
{
	bkv_filestore *fs;
	struct stat st;
	int rc;

	if (!out || !cfg || cfg->size != sizeof(*cfg) || !cfg->dir || !cfg->dir[0] ||
	    !cfg->block_bytes || !cfg->copy_out || !cfg->copy_in)
		return BKV_EINVAL;
	*out = NULL;
	if (mkdir(cfg->dir, 0755) != 0 && errno != EEXIST)
		return BKV_EINVAL;
	if (stat(cfg->dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return BKV_EINVAL;
	fs = calloc(1, sizeof(*fs));
	if (!fs)
		return BKV_ENOMEM;
	fs->cfg = *cfg;
	fs->dir = malloc(strlen(cfg->dir) + 1);
	if (!fs->dir || init_index(fs) != BKV_OK) {
		free(fs->dir);
		free(fs);
		return BKV_ENOMEM;
	}
	strcpy(fs->dir, cfg->dir);
	fs->cfg.dir = fs->dir;
	pthread_mutex_init(&fs->lock, NULL);
	pthread_mutex_init(&fs->io_lock, NULL);
	pthread_cond_init(&fs->wake, NULL);
	pthread_cond_init(&fs->idle, NULL);
	rc = scan(fs);
	if (rc == BKV_OK && !cfg->sync) {
		if (pthread_create(&fs->worker, NULL, worker_main, fs) != 0)
			rc = BKV_EHOST;
		else
			fs->has_worker = 1;
	}
	if (rc != BKV_OK) {
		bkv_filestore_close(fs);
		return rc;
	}
	*out = fs;
	return BKV_OK;
}

void bkv_filestore_close(bkv_filestore *fs)
{
	job *j, *next;

	if (!fs)
		return;
	pthread_mutex_lock(&fs->lock);
	fs->stopping = 1;
	pthread_cond_broadcast(&fs->wake);
	pthread_mutex_unlock(&fs->lock);
	if (fs->has_worker)
		pthread_join(fs->worker, NULL);
	for (j = fs->q_head; j; j = next) {
		next = j->next;
		if (j->kind == JOB_LOAD)
			fs->st.load_failed += j->n;
		else
			fs->st.save_failed += j->n;
		complete(fs, j->xfer, BKV_ESTATE, NULL, 0);
		free(j);
	}
	pthread_cond_destroy(&fs->idle);
	pthread_cond_destroy(&fs->wake);
	pthread_mutex_destroy(&fs->io_lock);
	pthread_mutex_destroy(&fs->lock);
	free(fs->buf);
	free(fs->buckets);
	free(fs->entries);
	free(fs->dir);
	free(fs);
}

int bkv_filestore_connector(bkv_filestore *fs, bkv_connector *out)
{
	if (!fs || !out)
		return BKV_EINVAL;
	memset(out, 0, sizeof(*out));
	out->lookup = fs_lookup;
	out->load = fs_load;
	out->save = fs_save;
	out->user = fs;
	return BKV_OK;
}

int bkv_filestore_attach(bkv_filestore *fs, bkv_sched *sched)
{
	if (!fs)
		return BKV_EINVAL;
	pthread_mutex_lock(&fs->lock);
	fs->sched = sched;
	pthread_mutex_unlock(&fs->lock);
	return BKV_OK;
}

int bkv_filestore_flush(bkv_filestore *fs)
{
	if (!fs)
		return BKV_EINVAL;
	pthread_mutex_lock(&fs->lock);
	while (fs->q_head || fs->running)
		pthread_cond_wait(&fs->idle, &fs->lock);
	pthread_mutex_unlock(&fs->lock);
	return BKV_OK;
}

int bkv_filestore_set_faults(bkv_filestore *fs, const bkv_filestore_faults *f)
{
	if (!fs || !f)
		return BKV_EINVAL;
	pthread_mutex_lock(&fs->lock);
	fs->faults = *f;
	pthread_mutex_unlock(&fs->lock);
	return BKV_OK;
}

int bkv_filestore_stats_get(bkv_filestore *fs, bkv_filestore_stats *out)
{
	if (!fs || !out)
		return BKV_EINVAL;
	pthread_mutex_lock(&fs->lock);
	*out = fs->st;
	out->blocks = fs->count;
	out->used_bytes = fs->used_bytes;
	pthread_mutex_unlock(&fs->lock);
	return BKV_OK;
}
