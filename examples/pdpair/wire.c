/*
 * wire.c - what both processes of the pair share: whole reads and writes
 * on the socket, and a block's frame.
 *
 * A frame is a block file of the file store's format (filestore.h, "ON
 * DISK"), built and checked by its blockfile.c: the 48-byte header names
 * the hash, group 0, one frame and the payload's size and checksum, and
 * checksums itself. The payload is the block's KV as tinylm's paged host
 * lays it out, layer by layer:
 *
 *   layer 0: K[block_tokens][kv_width] V[block_tokens][kv_width]
 *   layer 1: ...
 *
 * Both processes serve the same model, so a payload of another size is
 * refused like a bad checksum.
 */
#include "pdpair.h"
#include "filestore.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int pd_write_full(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

int pd_read_full(int fd, void *p, size_t n)
{
	char *c = p;

	while (n) {
		ssize_t k = read(fd, c, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

size_t pd_block_payload(const tlm_model *m, uint32_t block_tokens)
{
	return (size_t)m->cfg.layers * 2 * block_tokens * tlm_kv_width(&m->cfg) * sizeof(float);
}

void pd_frame_encode(tlm_host *h, const tlm_model *m, uint32_t block_tokens, int32_t block,
		     uint64_t hash, uint8_t *out)
{
	const size_t per_layer = pd_block_payload(m, block_tokens) / m->cfg.layers;
	bkv_filestore_header hd;
	uint8_t *pay = out + BKV_FILESTORE_HEADER_BYTES;

	for (uint32_t l = 0; l < m->cfg.layers; l++)
		memcpy(pay + l * per_layer, tlm_host_kv_row(h, l, block, 0, 0), per_layer);
	hd.hash = hash;
	hd.group = 0;
	hd.frames = 1;
	hd.payload_bytes = pd_block_payload(m, block_tokens);
	hd.checksum = bkv_filestore_checksum(pay, (size_t)hd.payload_bytes);
	bkv_filestore_header_encode(&hd, out);
}

int pd_frame_load(tlm_host *h, const tlm_model *m, uint32_t block_tokens, int32_t block,
		  uint64_t hash, const uint8_t *buf, size_t n)
{
	const size_t payload = pd_block_payload(m, block_tokens);
	const size_t per_layer = payload / m->cfg.layers;
	bkv_filestore_header hd;

	if (bkv_filestore_block_parse(buf, n, &hd) != BKV_OK)
		return -1;
	if (hd.hash != hash || hd.group != 0 || hd.frames != 1 || hd.payload_bytes != payload)
		return -1;
	for (uint32_t l = 0; l < m->cfg.layers; l++)
		memcpy(tlm_host_kv_row(h, l, block, 0, 0),
		       buf + BKV_FILESTORE_HEADER_BYTES + l * per_layer, per_layer);
	return 0;
}
