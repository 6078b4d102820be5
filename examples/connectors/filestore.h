/*
 * filestore.h - a KV connector (bkv_connector) over a directory of block
 * files: a disk tier that outlives the engine. docs/integration.md, "File
 * store connector", shows how a host wires it.
 *
 * OBJECT MODEL. A bkv_filestore owns one directory, an in-memory index of
 * the blocks in it (hash -> file size, in LRU order) and, unless
 * bkv_filestore_config.sync is set, one worker thread that does the file
 * I/O. bkv_filestore_connector fills a bkv_connector whose user pointer is
 * the store; the scheduler copies it at bkv_sched_create and then calls
 * lookup, load and save on its stepping thread. The store completes each
 * load and save exactly once, through the config's done hook when it is
 * set, else through bkv_kv_xfer_done on the scheduler given to
 * bkv_filestore_attach. The host says how KV bytes move between its device
 * and a buffer (block_bytes, copy_out, copy_in): the store never reads
 * device memory itself.
 *
 * ON DISK. One file per block, named by its 64-bit hash in 16 lowercase hex
 * digits, in one of 256 subdirectories named by the hash's low byte:
 *
 *   DIR/3f/00c0ffee1234563f
 *
 *   offset  bytes  field (little-endian)
 *   0       4      magic "BKVF"
 *   4       2      version (1)
 *   6       2      header bytes (48)
 *   8       8      hash
 *   16      4      group
 *   20      4      frames
 *   24      8      payload bytes
 *   32      8      checksum of the payload (bkv_filestore_checksum)
 *   40      8      checksum of bytes 0..39 (the header's own)
 *   48      ...    payload: what copy_out wrote
 *
 * A file is written under DIR/xx/HASH.tmp and renamed to its name, so a
 * crash never leaves a partial file under a block's name; leftover .tmp
 * files are removed at open.
 *
 * THREADS. lookup, load and save come from the scheduler's stepping thread;
 * bkv_filestore_stats, _set_faults and _flush may be called from any thread.
 * bkv_filestore_open and _close are not concurrent with anything else on
 * the same store. Close the store before destroying the scheduler it
 * completes transfers on.
 */
#ifndef BKV_FILESTORE_H
#define BKV_FILESTORE_H

#include <batchkv.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bkv_filestore bkv_filestore;

/* The store's configuration; bkv_filestore_config_init fills defaults. */
typedef struct bkv_filestore_config {
	uint32_t size;           /* sizeof(bkv_filestore_config); set by init */
	uint32_t sync;           /* 1: load and save do their I/O inside the
				    callback and complete before it returns
				    (deterministic tests); 0 (the default):
				    one worker thread does it */
	const char *dir;         /* the store's directory, copied at open;
				    created if missing (its parent must
				    exist). Required */
	uint64_t capacity_bytes; /* most bytes of block files (headers
				    included); a save evicts least recently
				    used files to stay under it; 0 = no
				    bound */
	uint32_t fsync;          /* 1: fsync each file before its rename
				    (survives power loss, not only a crash);
				    default 0 */
	uint32_t pad;            /* zero */
	void *host;              /* handed to every callback below */
	/* bytes of one block of group group spanning frames frames (a
	 * state's unit spans several); 0 refuses the block. Required */
	size_t (*block_bytes)(void *host, uint32_t group, uint32_t frames);
	/* copy block b's KV from the device into dst (n bytes, as
	 * block_bytes); < 0 fails the block's save. Required */
	int (*copy_out)(void *host, const bkv_kv_xfer_block *b, void *dst, size_t n);
	/* copy n bytes from src into block b's device memory; < 0 fails the
	 * block's load. Required */
	int (*copy_in)(void *host, const bkv_kv_xfer_block *b, const void *src, size_t n);
	/* optional: called instead of bkv_kv_xfer_done to complete a
	 * transfer, with the same arguments after the first (tests, hosts
	 * that forward completions themselves). NULL: bkv_kv_xfer_done on
	 * the attached scheduler */
	void (*done)(void *host, uint64_t xfer, int status, const uint32_t *failed, uint32_t n);
} bkv_filestore_config;

/* Faults to inject (bkv_filestore_set_faults); all zero is none. */
typedef struct bkv_filestore_faults {
	uint32_t delay_us;    /* sleep this long before each load or save
			       transfer (a slow store) */
	uint32_t fail_writes; /* 1: every block file write fails with ENOSPC
			       (a full store) */
	int64_t cut_after;    /* >= 0: the next block file written holds only
			       its first cut_after bytes but is renamed into
			       place and reported saved (a transfer cut
			       mid-block); then back to -1. < 0: off */
} bkv_filestore_faults;

/* Counters since open (bkv_filestore_stats). Blocks count block files. */
typedef struct bkv_filestore_stats {
	uint64_t lookups;      /* lookup calls */
	uint64_t hits;         /* blocks lookup reported present */
	uint64_t loads;        /* blocks loaded into the device */
	uint64_t load_failed;  /* blocks whose load failed (missing,
				  corrupt, copy_in error, cancelled) */
	uint64_t saves;        /* block files written */
	uint64_t save_skipped; /* blocks a save found already present */
	uint64_t save_failed;  /* blocks whose save failed (too large,
				  write error, copy_out error, cancelled) */
	uint64_t evictions;    /* block files evicted for capacity */
	uint64_t corrupt;      /* block files found corrupt or truncated
			          (at open or at load) and deleted */
	uint64_t bytes_read;   /* payload bytes loaded */
	uint64_t bytes_written; /* file bytes written (headers included) */
	uint64_t blocks;       /* block files in the index now */
	uint64_t used_bytes;   /* their bytes now (<= capacity_bytes) */
} bkv_filestore_stats;

/* The fixed header of a block file, decoded (see ON DISK above). */
typedef struct bkv_filestore_header {
	uint64_t hash;          /* the block's chained hash */
	uint32_t group;         /* its KV group */
	uint32_t frames;        /* frames it spans (1 for attention) */
	uint64_t payload_bytes; /* bytes after the header */
	uint64_t checksum;      /* bkv_filestore_checksum of the payload */
} bkv_filestore_header;

#define BKV_FILESTORE_MAGIC 0x46564b42u /* "BKVF" read little-endian */
#define BKV_FILESTORE_VERSION 1u
#define BKV_FILESTORE_HEADER_BYTES 48u
/* Most payload bytes a block file may claim (1 GiB): a bound on what a
 * parser allocates for bytes it does not trust. */
#define BKV_FILESTORE_MAX_PAYLOAD (1ull << 30)

/**
 * Fill a store config with defaults (see each field).
 * @param cfg  the config; NULL is ignored.
 */
void bkv_filestore_config_init(bkv_filestore_config *cfg);

/**
 * Open a store over cfg->dir: create the directory and its 256
 * subdirectories if missing, index every valid block file there (oldest
 * modification time least recently used), delete leftover temporary files
 * and files that fail the header checks (counted as corrupt), evict down
 * to capacity_bytes, and start the worker unless cfg->sync.
 * @param cfg  the config; copied (dir too).
 * @param out  the new store.
 * @return BKV_OK; BKV_EINVAL (NULL or missing field, a wrong size, dir
 *         not a directory and not creatable); BKV_ENOMEM; BKV_EHOST (the
 *         directory could not be read or the thread not started).
 */
int bkv_filestore_open(const bkv_filestore_config *cfg, bkv_filestore **out);

/**
 * Close a store: transfers queued and not started complete as failed
 * (status BKV_ESTATE), the one in progress finishes, the worker is joined
 * and everything is freed. Files stay. NULL is ignored.
 */
void bkv_filestore_close(bkv_filestore *fs);

/**
 * Fill a connector with the store's lookup, load and save; user is fs.
 * save_blocks and max_saves are 0 (the library's defaults).
 * @return BKV_OK; BKV_EINVAL (NULL argument).
 */
int bkv_filestore_connector(bkv_filestore *fs, bkv_connector *out);

/**
 * Name the scheduler transfers complete on (bkv_kv_xfer_done), when the
 * config has no done hook. Call it after bkv_sched_create and before the
 * first step; a load or save while neither is set does not start
 * (BKV_ESTATE).
 * @return BKV_OK; BKV_EINVAL (NULL fs).
 */
int bkv_filestore_attach(bkv_filestore *fs, bkv_sched *sched);

/**
 * Wait until every transfer accepted so far has completed.
 * @return BKV_OK; BKV_EINVAL (NULL fs).
 */
int bkv_filestore_flush(bkv_filestore *fs);

/**
 * Set the faults to inject from now on (tests).
 * @return BKV_OK; BKV_EINVAL (NULL argument).
 */
int bkv_filestore_set_faults(bkv_filestore *fs, const bkv_filestore_faults *f);

/**
 * Read the counters.
 * @return BKV_OK; BKV_EINVAL (NULL argument).
 */
int bkv_filestore_stats_get(bkv_filestore *fs, bkv_filestore_stats *out);

/* ---- the block file format (blockfile.c; no state, no allocation) ------ */

/** The 64-bit checksum of n bytes at p (a multiply-xorshift mix of 8-byte
 *  little-endian words, then the tail bytes). */
uint64_t bkv_filestore_checksum(const void *p, size_t n);

/** Encode h as the 48 header bytes at out. */
void bkv_filestore_header_encode(const bkv_filestore_header *h, uint8_t *out);

/**
 * Decode and check a header from untrusted bytes: n >= 48, magic, version,
 * header size, the header's own checksum, payload_bytes <=
 * BKV_FILESTORE_MAX_PAYLOAD, frames >= 1.
 * @return BKV_OK with *h filled; BKV_EINVAL (any check failed; *h
 *         unchanged).
 */
int bkv_filestore_header_decode(const uint8_t *buf, size_t n, bkv_filestore_header *h);

/**
 * Check a whole block file from untrusted bytes: a valid header, exactly
 * payload_bytes after it (neither truncated nor longer) whose checksum
 * matches.
 * @return BKV_OK with *h filled and the payload at buf + 48; BKV_EINVAL.
 */
int bkv_filestore_block_parse(const uint8_t *buf, size_t n, bkv_filestore_header *h);

#ifdef __cplusplus
}
#endif

#endif
