/*
 * publisher.c - a libbatchkv replica that publishes its KV events the way a
 * vLLM replica does, so a router built for vLLM can follow it.
 *
 * It runs the events workload (workload.c: a scheduler over a small pool
 * with swap), drains the pool after every step through a bkv_vllm_encoder and
 * publishes each KVEventBatch as vLLM's ZmqEventPublisher does
 * (vllm/distributed/kv_events.py):
 *
 *   PUB     (--pub, default port 5557 on every interface) multipart (topic, seq as 8 bytes big-endian, msgpack payload);
 *           seq counts batches from 0
 *   ROUTER  (--replay, default port 5558) replay: a request (identity, "", start seq as 8 bytes
 *           big-endian) is answered with (identity, "", seq, payload) for
 *           every buffered batch with seq >= start, then (identity, "",
 *           -1 as 8 bytes, "") to end; the last --buffer batches are kept
 *
 * With --truth ENDPOINT it also publishes, after every drain, the digests of
 * the blocks really in the pool's index (a test oracle; see
 * tests/kvevents_zmq.py), and a replay request whose start field is the
 * 4 bytes "stop" ends the program (the test's way to say it is done; vLLM
 * ignores malformed requests, so a vLLM subscriber never sends one).
 * Drains are skipped on steps 30..39 (--gap) so that the pool's event ring
 * overflows and the encoder's resynchronisation goes out as well.
 *
 * Usage: bkv-kv-publisher [--pub ENDPOINT] [--replay ENDPOINT|-] [--topic T] [--requests N] [--ring N] [--buffer N] [--dp-rank R]
 *          [--wire map|array|array0] [--hash cbor|pickle|native] [--seed PYTHONHASHSEED] [--gap]
 *          [--step-us N] [--truth ENDPOINT] [--linger-ms N]
 */
#include "workload.h"

#include <zmq.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One buffered batch for replay. */
typedef struct held {
	uint64_t seq;  /* its batch number */
	uint8_t *p;    /* its payload (malloc) */
	size_t n;      /* payload bytes */
} held;

typedef struct publisher {
	void *pub;        /* PUB socket */
	void *replay;     /* ROUTER socket, or NULL */
	void *truth;      /* PUB socket for the oracle, or NULL */
	const char *topic; /* topic frame */
	uint64_t next;    /* seq of the next batch */
	held *buf;        /* [cap] replay ring */
	uint32_t cap;     /* batches kept */
	uint32_t n;       /* batches held, <= cap */
	uint32_t head;    /* index of the oldest */
	int stop;         /* a "stop" request came */
} publisher;

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void be64(uint8_t b[8], uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (56 - 8 * i));
}

static void publish(publisher *P, const uint8_t *msg, size_t len)
{
	uint8_t seq[8];
	held *h;

	be64(seq, P->next);
	zmq_send(P->pub, P->topic, strlen(P->topic), ZMQ_SNDMORE);
	zmq_send(P->pub, seq, 8, ZMQ_SNDMORE);
	zmq_send(P->pub, msg, len, 0);
	if (P->n == P->cap) { /* drop the oldest */
		free(P->buf[P->head].p);
		P->head = (P->head + 1) % P->cap;
		P->n--;
	}
	h = &P->buf[(P->head + P->n) % P->cap];
	h->seq = P->next++;
	h->p = malloc(len ? len : 1);
	h->n = len;
	if (h->p)
		memcpy(h->p, msg, len);
	P->n++;
}

/* Answer every pending replay request. */
static void serve_replay(publisher *P)
{
	uint8_t id[256], empty[8], start[16];
	static const uint8_t end_seq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

	while (P->replay) {
		int nid = zmq_recv(P->replay, id, sizeof id, ZMQ_DONTWAIT), ne, ns, more;
		size_t ml = sizeof more;
		uint64_t s = 0;
		uint32_t i;

		if (nid < 0)
			return;
		ne = zmq_recv(P->replay, empty, sizeof empty, 0);
		ns = zmq_recv(P->replay, start, sizeof start, 0);
		more = 0;
		zmq_getsockopt(P->replay, ZMQ_RCVMORE, &more, &ml);
		while (more) { /* a malformed request: drain and ignore it */
			zmq_recv(P->replay, start, sizeof start, 0);
			zmq_getsockopt(P->replay, ZMQ_RCVMORE, &more, &ml);
			ns = -1;
		}
		if (ne != 0 || nid > (int)sizeof id)
			continue;
		if (ns == 4 && memcmp(start, "stop", 4) == 0) {
			P->stop = 1;
			continue;
		}
		if (ns != 8)
			continue;
		for (i = 0; i < 8; i++)
			s = s << 8 | start[i];
		for (i = 0; i < P->n; i++) {
			const held *h = &P->buf[(P->head + i) % P->cap];
			uint8_t seq[8];

			if (h->seq < s)
				continue;
			be64(seq, h->seq);
			zmq_send(P->replay, id, (size_t)nid, ZMQ_SNDMORE);
			zmq_send(P->replay, "", 0, ZMQ_SNDMORE);
			zmq_send(P->replay, seq, 8, ZMQ_SNDMORE);
			zmq_send(P->replay, h->p, h->n, 0);
		}
		zmq_send(P->replay, id, (size_t)nid, ZMQ_SNDMORE);
		zmq_send(P->replay, "", 0, ZMQ_SNDMORE);
		zmq_send(P->replay, end_seq, 8, ZMQ_SNDMORE);
		zmq_send(P->replay, "", 0, 0);
	}
}

/* Oracle message: ("truth", last batch seq or -1, digests, final flag,
 * [six u64 counters when final]). */
static void send_truth(publisher *P, const evw *w, const bkv_vllm_config *vc,
		       const bkv_vllm_encoder *enc, uint8_t *dig, uint32_t cap, int final)
{
	uint8_t seq[8];
	uint32_t n = evw_truth(w, vc, dig, cap);

	be64(seq, P->next ? P->next - 1 : UINT64_MAX);
	zmq_send(P->truth, "truth", 5, ZMQ_SNDMORE);
	zmq_send(P->truth, seq, 8, ZMQ_SNDMORE);
	zmq_send(P->truth, dig, (size_t)(n < cap ? n : cap) * BKV_VLLM_DIGEST_BYTES, ZMQ_SNDMORE);
	if (!final) {
		zmq_send(P->truth, "", 0, 0);
	} else {
		bkv_pool_stats ps;
		bkv_sched_stats ss;
		uint8_t st[48];
		uint64_t v[6];

		ps.size = sizeof ps;
		bkv_pool_stats_get(w->pool, &ps);
		ss.size = sizeof ss;
		bkv_sched_stats_get(w->sched, &ss);
		v[0] = ps.evictions, v[1] = ps.swap_out_blocks, v[2] = ss.preemptions;
		v[3] = ss.swaps, v[4] = ps.events_dropped, v[5] = bkv_vllm_encoder_resyncs(enc);
		for (int i = 0; i < 6; i++)
			be64(st + 8 * i, v[i]);
		zmq_send(P->truth, "end", 3, ZMQ_SNDMORE);
		zmq_send(P->truth, st, sizeof st, 0);
	}
}

static void sleep_us(long us)
{
	struct timespec t = {us / 1000000, (us % 1000000) * 1000};

	nanosleep(&t, NULL);
}

int main(int argc, char **argv)
{
	const char *pub_ep = "tcp://*:5557", *replay_ep = "tcp://*:5558", *truth_ep = NULL;
	const char *hash = "cbor", *seed = "0", *wire = "map";
	uint32_t requests = 160, ring = 64, buffer = 10000;
	int dp = -1, gap = 0, rc, more, hwm = 100000;
	long step_us = 2000, linger_ms = 30000;
	publisher P;
	bkv_vllm_config vc;
	bkv_vllm_encoder *enc = NULL;
	bkv_pool_stats ps;
	uint8_t *dig;
	void *ctx;
	evw w;
	double t_end;

	memset(&P, 0, sizeof P);
	P.topic = "";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--gap")) {
			gap = 1;
			continue;
		}
		if (!v)
			return fprintf(stderr, "%s needs a value\n", a), 2;
		i++;
		if (!strcmp(a, "--pub"))
			pub_ep = v;
		else if (!strcmp(a, "--replay"))
			replay_ep = strcmp(v, "-") ? v : NULL;
		else if (!strcmp(a, "--topic"))
			P.topic = v;
		else if (!strcmp(a, "--requests"))
			requests = (uint32_t)atoi(v);
		else if (!strcmp(a, "--ring"))
			ring = (uint32_t)atoi(v);
		else if (!strcmp(a, "--buffer"))
			buffer = (uint32_t)atoi(v);
		else if (!strcmp(a, "--dp-rank"))
			dp = atoi(v);
		else if (!strcmp(a, "--wire"))
			wire = v;
		else if (!strcmp(a, "--hash"))
			hash = v;
		else if (!strcmp(a, "--seed"))
			seed = v;
		else if (!strcmp(a, "--step-us"))
			step_us = atol(v);
		else if (!strcmp(a, "--truth"))
			truth_ep = v;
		else if (!strcmp(a, "--linger-ms"))
			linger_ms = atol(v);
		else
			return fprintf(stderr, "unknown option %s\n", a), 2;
	}
	if (buffer == 0)
		buffer = 1;

	bkv_vllm_config_init(&vc);
	vc.hash = !strcmp(hash, "native") ? BKV_VLLM_HASH_NATIVE
		  : !strcmp(hash, "pickle") ? BKV_VLLM_HASH_SHA256
					    : BKV_VLLM_HASH_SHA256_CBOR;
	vc.wire = !strcmp(wire, "array")    ? BKV_VLLM_WIRE_ARRAY
		  : !strcmp(wire, "array0") ? BKV_VLLM_WIRE_ARRAY_V0
					    : BKV_VLLM_WIRE_MAP;
	vc.hash_seed = seed;
	vc.data_parallel_rank = dp;
	vc.key_name = evw_key_name;
	if ((rc = evw_create(&w, ring, requests, 42)) != 0 ||
	    (rc = bkv_vllm_encoder_create(&vc, w.pool, NULL, &enc)) != BKV_OK)
		return fprintf(stderr, "setup: %s %s\n", bkv_strerror(rc), bkv_last_error()), 1;
	ps.size = sizeof ps;
	bkv_pool_stats_get(w.pool, &ps);
	dig = malloc((size_t)ps.device_blocks * BKV_VLLM_DIGEST_BYTES);
	P.buf = calloc(buffer, sizeof *P.buf);
	P.cap = buffer;

	ctx = zmq_ctx_new();
	P.pub = zmq_socket(ctx, ZMQ_PUB);
	zmq_setsockopt(P.pub, ZMQ_SNDHWM, &hwm, sizeof hwm);
	if (zmq_bind(P.pub, pub_ep) != 0)
		return fprintf(stderr, "bind %s: %s\n", pub_ep, zmq_strerror(zmq_errno())), 1;
	if (replay_ep) {
		P.replay = zmq_socket(ctx, ZMQ_ROUTER);
		if (zmq_bind(P.replay, replay_ep) != 0)
			return fprintf(stderr, "bind %s: %s\n", replay_ep, zmq_strerror(zmq_errno())), 1;
	}
	if (truth_ep) {
		P.truth = zmq_socket(ctx, ZMQ_PUB);
		zmq_setsockopt(P.truth, ZMQ_SNDHWM, &hwm, sizeof hwm);
		if (zmq_bind(P.truth, truth_ep) != 0)
			return fprintf(stderr, "bind %s: %s\n", truth_ep, zmq_strerror(zmq_errno())), 1;
	}

	do {
		const uint8_t *msg;
		size_t len;

		more = evw_step(&w);
		if (more < 0)
			return fprintf(stderr, "step: %s\n", bkv_strerror(more)), 1;
		serve_replay(&P);
		if (gap && w.step >= 30 && w.step < 40 && more)
			continue;
		rc = bkv_vllm_encoder_drain(enc, w.pool, now_s(), &msg, &len);
		if (rc < 0)
			return fprintf(stderr, "encode: %s\n", bkv_strerror(rc)), 1;
		if (len)
			publish(&P, msg, len);
		if (P.truth)
			send_truth(&P, &w, &vc, enc, dig, ps.device_blocks, !more);
		if (step_us > 0)
			sleep_us(step_us);
	} while (more);
	fprintf(stderr, "bkv-kv-publisher: %u steps, %llu batches, %llu resyncs\n", w.step,
		(unsigned long long)P.next, (unsigned long long)bkv_vllm_encoder_resyncs(enc));

	/* Keep answering replays a while (until "stop" or linger_ms). */
	t_end = now_s() + (double)linger_ms / 1000.0;
	while (!P.stop && now_s() < t_end) {
		zmq_pollitem_t it = {P.replay, 0, ZMQ_POLLIN, 0};

		if (!P.replay)
			break;
		if (zmq_poll(&it, 1, 50) > 0)
			serve_replay(&P);
	}
	for (uint32_t i = 0; i < P.n; i++)
		free(P.buf[(P.head + i) % P.cap].p);
	free(P.buf);
	free(dig);
	zmq_close(P.pub);
	if (P.replay)
		zmq_close(P.replay);
	if (P.truth)
		zmq_close(P.truth);
	zmq_ctx_term(ctx);
	bkv_vllm_encoder_destroy(enc);
	evw_destroy(&w);
	return 0;
}
