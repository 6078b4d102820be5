/*
 * msgpack.c - msgpack as msgspec writes it, for the event encoder
 * (events/encoder.c): the shortest form of every integer, string, binary,
 * array and map header, floats as float64, all into a bkv__wbuf.
 */
#include "events/vllm.h"

#include <string.h>

void bkv__mp_uint(bkv__wbuf *w, uint64_t v)
{
	if (v < 128)
		bkv__wb_byte(w, (uint8_t)v);
	else if (v < 256)
		bkv__wb_byte(w, 0xcc), bkv__wb_be(w, v, 1);
	else if (v < 65536)
		bkv__wb_byte(w, 0xcd), bkv__wb_be(w, v, 2);
	else if (v <= 0xffffffffu)
		bkv__wb_byte(w, 0xce), bkv__wb_be(w, v, 4);
	else
		bkv__wb_byte(w, 0xcf), bkv__wb_be(w, v, 8);
}

void bkv__mp_int(bkv__wbuf *w, int64_t v)
{
	if (v >= 0)
		bkv__mp_uint(w, (uint64_t)v);
	else if (v >= -32)
		bkv__wb_byte(w, (uint8_t)(0xe0 | (v + 32)));
	else if (v >= -128)
		bkv__wb_byte(w, 0xd0), bkv__wb_be(w, (uint64_t)v, 1);
	else if (v >= -32768)
		bkv__wb_byte(w, 0xd1), bkv__wb_be(w, (uint64_t)v, 2);
	else if (v >= INT32_MIN)
		bkv__wb_byte(w, 0xd2), bkv__wb_be(w, (uint64_t)v, 4);
	else
		bkv__wb_byte(w, 0xd3), bkv__wb_be(w, (uint64_t)v, 8);
}

void bkv__mp_nil(bkv__wbuf *w)
{
	bkv__wb_byte(w, 0xc0);
}

void bkv__mp_f64(bkv__wbuf *w, double d)
{
	uint64_t u;

	memcpy(&u, &d, sizeof u);
	bkv__wb_byte(w, 0xcb);
	bkv__wb_be(w, u, 8);
}

void bkv__mp_str(bkv__wbuf *w, const char *s)
{
	size_t n = strlen(s);

	if (n < 32)
		bkv__wb_byte(w, (uint8_t)(0xa0 | n));
	else if (n < 256)
		bkv__wb_byte(w, 0xd9), bkv__wb_be(w, n, 1);
	else if (n < 65536)
		bkv__wb_byte(w, 0xda), bkv__wb_be(w, n, 2);
	else
		bkv__wb_byte(w, 0xdb), bkv__wb_be(w, n, 4);
	bkv__wb_put(w, s, n);
}

void bkv__mp_bin(bkv__wbuf *w, const uint8_t *p, size_t n)
{
	if (n < 256)
		bkv__wb_byte(w, 0xc4), bkv__wb_be(w, n, 1);
	else if (n < 65536)
		bkv__wb_byte(w, 0xc5), bkv__wb_be(w, n, 2);
	else
		bkv__wb_byte(w, 0xc6), bkv__wb_be(w, n, 4);
	bkv__wb_put(w, p, n);
}

/* An array or map header of n entries: the fix form (fix | n) below 16, else
 * the 16-bit form (tag16) or the 32-bit one (tag16 + 1). */
static void mp_container(bkv__wbuf *w, size_t n, uint8_t fix, uint8_t tag16)
{
	if (n < 16)
		bkv__wb_byte(w, (uint8_t)(fix | n));
	else if (n < 65536)
		bkv__wb_byte(w, tag16), bkv__wb_be(w, n, 2);
	else
		bkv__wb_byte(w, (uint8_t)(tag16 + 1)), bkv__wb_be(w, n, 4);
}

void bkv__mp_array(bkv__wbuf *w, size_t n)
{
	mp_container(w, n, 0x90, 0xdc);
}

void bkv__mp_map(bkv__wbuf *w, size_t n)
{
	mp_container(w, n, 0x80, 0xde);
}
