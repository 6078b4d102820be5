/*
 * fuzz_filestore.c - the file store's block-file readers driven by
 * arbitrary bytes (examples/connectors/blockfile.c and the store's load and
 * open paths in filestore.c).
 *
 * The first byte picks a mode; the rest is a block file's bytes.
 *
 * Mode 0 (first byte & 7 not 1): the parsers on the bytes.
 *   - bkv_filestore_header_decode accepts exactly the canonical headers:
 *     when it accepts, encoding what it decoded gives the same 48 bytes;
 *   - bkv_filestore_block_parse accepts only when the header decodes, the
 *     length is exactly 48 + payload_bytes and the payload's checksum
 *     matches, and then agrees with the header decoder field for field;
 *   - a block file made from the input (its bytes as the payload, fields
 *     from its first bytes) parses, and the same file cut one byte short,
 *     one byte longer, or with one byte flipped (position from the input)
 *     does not.
 * Mode 1 (first byte & 7 == 1; one input in eight, as it opens a store and
 *   scans its 256 subdirectories): the bytes as a file on disk. They are written
 *   under the name of the hash their header field names into a store's
 *   directory, the store is opened over it (its scan), asked for that hash
 *   and, when it says present, made to load it into a fake device. The load
 *   succeeds exactly when the block parser accepts the bytes with the
 *   expected group, frames and size, and then the device holds the payload;
 *   otherwise it fails the block, and the file is gone afterwards.
 *
 * Both modes must leave no allocation behind (LeakSanitizer in the fuzz
 * build) and never read past the input.
 */
#include "fuzz.h"
#include "filestore.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#define FF_PAYLOAD 96u /* bytes of the fake device's block (group 0) */

/* ---- mode 0: the parsers -------------------------------------------------- */

static void check_parsers(const uint8_t *p, size_t n)
{
	bkv_filestore_header h, b;
	uint8_t enc[BKV_FILESTORE_HEADER_BYTES];
	int hr = bkv_filestore_header_decode(p, n, &h);
	int br = bkv_filestore_block_parse(p, n, &b);

	FZ_CHECK(hr == BKV_OK || hr == BKV_EINVAL, "header_decode returned %d", hr);
	FZ_CHECK(br == BKV_OK || br == BKV_EINVAL, "block_parse returned %d", br);
	if (hr == BKV_OK) {
		bkv_filestore_header_encode(&h, enc);
		FZ_CHECK(!memcmp(enc, p, sizeof(enc)), "an accepted header is not canonical");
		FZ_CHECK(h.frames >= 1 && h.payload_bytes <= BKV_FILESTORE_MAX_PAYLOAD,
			 "accepted frames %u, payload %llu", h.frames,
			 (unsigned long long)h.payload_bytes);
	}
	if (br == BKV_OK) {
		FZ_CHECK(hr == BKV_OK, "a block parsed without a valid header");
		FZ_CHECK(!memcmp(&h, &b, sizeof(h)), "the parsers disagree");
		FZ_CHECK(n == BKV_FILESTORE_HEADER_BYTES + b.payload_bytes, "length %zu", n);
		FZ_CHECK(bkv_filestore_checksum(p + BKV_FILESTORE_HEADER_BYTES, n - 48) ==
				 b.checksum,
			 "accepted a payload whose checksum differs");
	}
}

/* A valid file with the input as payload; then broken ones. */
static void check_roundtrip(const uint8_t *p, size_t n, size_t flip)
{
	bkv_filestore_header h, got;
	uint8_t *file = malloc(n + BKV_FILESTORE_HEADER_BYTES + 1);
	size_t len = n + BKV_FILESTORE_HEADER_BYTES;

	FZ_CHECK(file != NULL, "out of memory");
	memset(&h, 0, sizeof(h));
	memcpy(&h.hash, p, n < 8 ? n : 8);
	h.group = n > 8 ? p[8] : 0;
	h.frames = 1 + (n > 9 ? p[9] : 0);
	h.payload_bytes = n;
	h.checksum = bkv_filestore_checksum(p, n);
	bkv_filestore_header_encode(&h, file);
	if (n)
		memcpy(file + BKV_FILESTORE_HEADER_BYTES, p, n);
	file[len] = 0;
	FZ_CHECK(bkv_filestore_block_parse(file, len, &got) == BKV_OK, "a valid file refused");
	FZ_CHECK(!memcmp(&got, &h, sizeof(h)), "a valid file decoded differently");
	FZ_CHECK(bkv_filestore_block_parse(file, len - 1, &got) != BKV_OK, "a short file parsed");
	FZ_CHECK(bkv_filestore_block_parse(file, len + 1, &got) != BKV_OK, "a long file parsed");
	file[flip % len] ^= (uint8_t)(1u << (flip % 8));
	FZ_CHECK(bkv_filestore_block_parse(file, len, &got) != BKV_OK,
		 "a file with byte %zu flipped parsed", flip % len);
	free(file);
}

/* ---- mode 1: a store over the bytes --------------------------------------- */

static uint8_t ff_dev[FF_PAYLOAD]; /* the fake device's one block */
static uint32_t ff_done;           /* completions */
static uint32_t ff_failed;         /* failed blocks over them */

static size_t ff_block_bytes(void *host, uint32_t group, uint32_t frames)
{
	(void)host;
	return group == 0 && frames == 1 ? FF_PAYLOAD : 0;
}

static int ff_copy_out(void *host, const bkv_kv_xfer_block *b, void *dst, size_t n)
{
	(void)host;
	(void)b;
	memcpy(dst, ff_dev, n);
	return 0;
}

static int ff_copy_in(void *host, const bkv_kv_xfer_block *b, const void *src, size_t n)
{
	(void)host;
	(void)b;
	FZ_CHECK(n == FF_PAYLOAD, "copy_in of %zu bytes", n);
	memcpy(ff_dev, src, n);
	return 0;
}

static void ff_on_done(void *host, uint64_t xfer, int status, const uint32_t *failed, uint32_t n)
{
	(void)host;
	(void)xfer;
	(void)failed;
	FZ_CHECK(status == BKV_OK, "load status %d", status);
	ff_done++;
	ff_failed += n;
}

static char ff_dir[64]; /* the store's directory, made once per process */

/* Remove the store's directory at exit (each input removes its file). */
static void ff_cleanup(void)
{
	char path[96];
	unsigned sub;

	for (sub = 0; sub < 256; sub++) {
		snprintf(path, sizeof(path), "%s/%02x", ff_dir, sub);
		(void)rmdir(path);
	}
	(void)rmdir(ff_dir);
}

static void check_store(const uint8_t *p, size_t n)
{
	bkv_filestore_config c;
	bkv_filestore_header h;
	bkv_filestore *fs;
	bkv_connector con;
	bkv_kv_xfer_block b;
	uint64_t hash = 0;
	char path[256];
	int fd, present, valid;

	if (!ff_dir[0]) {
		strcpy(ff_dir, "/tmp/bkv-fuzz-filestore-XXXXXX");
		FZ_CHECK(mkdtemp(ff_dir) != NULL, "mkdtemp");
		atexit(ff_cleanup);
	}
	if (n >= 16)
		memcpy(&hash, p + 8, 8); /* the header's hash field (little-endian host) */
	snprintf(path, sizeof(path), "%s/%02x", ff_dir, (unsigned)(hash & 0xff));
	(void)mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%02x/%016llx", ff_dir, (unsigned)(hash & 0xff),
		 (unsigned long long)hash);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	FZ_CHECK(fd >= 0, "cannot write %s", path);
	FZ_CHECK(n == 0 || write(fd, p, n) == (ssize_t)n, "short write");
	close(fd);
	valid = bkv_filestore_block_parse(p, n, &h) == BKV_OK && h.hash == hash && h.group == 0 &&
		h.frames == 1 && h.payload_bytes == FF_PAYLOAD;

	bkv_filestore_config_init(&c);
	c.dir = ff_dir;
	c.sync = 1;
	c.block_bytes = ff_block_bytes;
	c.copy_out = ff_copy_out;
	c.copy_in = ff_copy_in;
	c.done = ff_on_done;
	FZ_CHECK(bkv_filestore_open(&c, &fs) == BKV_OK, "open failed");
	bkv_filestore_connector(fs, &con);
	present = con.lookup(con.user, 1, &hash, 1);
	FZ_CHECK(present == 0 || present == 1, "lookup said %d", present);
	FZ_CHECK(!valid || present, "a valid file was not indexed");
	ff_done = ff_failed = 0;
	memset(ff_dev, 0, sizeof(ff_dev));
	b = (bkv_kv_xfer_block){hash, 0, 0, 0, 1};
	FZ_CHECK(con.load(con.user, 7, 1, &b, 1) == 0, "load did not start");
	FZ_CHECK(ff_done == 1, "load completed %u times", ff_done);
	FZ_CHECK(ff_failed == (valid ? 0u : 1u), "load failed %u (file valid: %d)", ff_failed,
		 valid);
	if (valid)
		FZ_CHECK(!memcmp(ff_dev, p + BKV_FILESTORE_HEADER_BYTES, FF_PAYLOAD),
			 "loaded bytes differ from the file's payload");
	else
		FZ_CHECK(access(path, F_OK) != 0, "an invalid file was kept");
	bkv_filestore_close(fs);
	(void)unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz f = {data, size, 0};
	uint8_t mode = fz_u8(&f);
	const uint8_t *p = data + f.i;
	size_t n = size - f.i;

	if ((mode & 7) == 1) {
		check_store(p, n);
		return 0;
	}
	check_parsers(p, n);
	check_roundtrip(p, n, (size_t)mode * 131u + n);
	return 0;
}

#include "fuzz_main.h"
