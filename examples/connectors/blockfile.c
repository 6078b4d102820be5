/*
 * blockfile.c - the file store's on-disk block format: the checksum, and
 * the encoder and the parsers of the 48-byte header (filestore.h, "ON
 * DISK"). Pure functions over byte arrays: no I/O, no allocation, no state,
 * so the libFuzzer target (tests/fuzz/fuzz_filestore.c) drives exactly the
 * code that reads files back.
 *
 * Every byte handed to a parser is untrusted: fields are read with explicit
 * little-endian loads (no struct overlay, no alignment assumption), every
 * length is compared before it is used, and payload_bytes is bounded
 * (BKV_FILESTORE_MAX_PAYLOAD) before anyone sizes a buffer by it. The
 * header carries its own checksum so that a flipped bit in a length or a
 * hash is caught before the payload is read.
 */
#include "filestore.h"

/* The multiply-xorshift constants (splitmix64's finaliser). */
#define MIX_K1 0xff51afd7ed558ccdull
#define MIX_K2 0xc4ceb9fe1a85ec53ull
#define MIX_SEED 0x9e3779b97f4a7c15ull

static uint64_t load_le64(const uint8_t *p)
{
	uint64_t v = 0;
	int i;

	for (i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint32_t load_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint16_t load_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static void store_le64(uint8_t *p, uint64_t v)
{
	int i;

	for (i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void store_le32(uint8_t *p, uint32_t v)
{
	int i;

	for (i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t mix(uint64_t h)
{
	h ^= h >> 33;
	h *= MIX_K1;
	h ^= h >> 29;
	h *= MIX_K2;
	h ^= h >> 32;
	return h;
}

uint64_t bkv_filestore_checksum(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = MIX_SEED ^ ((uint64_t)n * MIX_K2);

	for (; n >= 8; b += 8, n -= 8)
		h = mix(h ^ load_le64(b)) + MIX_SEED;
	for (; n > 0; b++, n--)
		h = (h ^ *b) * MIX_K1;
	return mix(h);
}

void bkv_filestore_header_encode(const bkv_filestore_header *h, uint8_t *out)
{
	store_le32(out, BKV_FILESTORE_MAGIC);
	out[4] = (uint8_t)BKV_FILESTORE_VERSION;
	out[5] = 0;
	out[6] = (uint8_t)BKV_FILESTORE_HEADER_BYTES;
	out[7] = 0;
	store_le64(out + 8, h->hash);
	store_le32(out + 16, h->group);
	store_le32(out + 20, h->frames);
	store_le64(out + 24, h->payload_bytes);
	store_le64(out + 32, h->checksum);
	store_le64(out + 40, bkv_filestore_checksum(out, 40));
}

int bkv_filestore_header_decode(const uint8_t *buf, size_t n, bkv_filestore_header *h)
{
	bkv_filestore_header d;

	if (!buf || !h || n < BKV_FILESTORE_HEADER_BYTES)
		return BKV_EINVAL;
	if (load_le32(buf) != BKV_FILESTORE_MAGIC || load_le16(buf + 4) != BKV_FILESTORE_VERSION ||
	    load_le16(buf + 6) != BKV_FILESTORE_HEADER_BYTES)
		return BKV_EINVAL;
	if (load_le64(buf + 40) != bkv_filestore_checksum(buf, 40))
		return BKV_EINVAL;
	d.hash = load_le64(buf + 8);
	d.group = load_le32(buf + 16);
	d.frames = load_le32(buf + 20);
	d.payload_bytes = load_le64(buf + 24);
	d.checksum = load_le64(buf + 32);
	if (d.frames == 0 || d.payload_bytes > BKV_FILESTORE_MAX_PAYLOAD)
		return BKV_EINVAL;
	*h = d;
	return BKV_OK;
}

int bkv_filestore_block_parse(const uint8_t *buf, size_t n, bkv_filestore_header *h)
{
	bkv_filestore_header d;

	if (bkv_filestore_header_decode(buf, n, &d) != BKV_OK)
		return BKV_EINVAL;
	/* n >= 48 here, so the subtraction cannot wrap */
	if (n - BKV_FILESTORE_HEADER_BYTES != d.payload_bytes)
		return BKV_EINVAL;
	if (bkv_filestore_checksum(buf + BKV_FILESTORE_HEADER_BYTES, (size_t)d.payload_bytes) !=
	    d.checksum)
		return BKV_EINVAL;
	if (h)
		*h = d;
	return BKV_OK;
}
