/*
 * bench_multiturn.c - prefix hits and time to first token on multi-turn
 * conversations under continuous and chunked prefill (issue 23).
 *
 * The workload is what agents and chat front ends send: S sessions, each on
 * one of P shared system prompts, each running T turns; turn t's prompt is
 * the system prompt, every earlier user message and answer, and the new user
 * message, so every turn extends the last. A session's next turn is submitted
 * a think time after its previous answer ended (closed loop); sessions start
 * at Poisson arrivals. The host samples each answer's tokens from a fixed
 * function of (session, turn, position), so the next prompt can quote the
 * answer exactly.
 *
 * Time is virtual: every step advances the clock by the H100 / Llama-3-8B
 * roofline's price of the step's calls (the scheduler's own prediction with
 * that model as its cost model). TTFT is submission to the end of the step
 * that sampled the first token. Public header only.
 *
 *   bench_multiturn [sessions [turns [rate]]]   (defaults 96, 6, 4 per second)
 *
 * Prints one line per policy: prompt tokens, the share served by the prefix
 * cache, mean and p99 TTFT, and the simulated makespan.
 */
#include "batchkv.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYS_PROMPTS 4
#define SYS_LEN 2048
#define ANSWER_LEN 128
#define MAX_TURNS 16

typedef struct mt_session {
	uint32_t sys;          /* system prompt index */
	uint32_t turn;         /* turns submitted */
	uint32_t len;          /* tokens of the conversation so far */
	int32_t *conv;         /* [cap] the conversation's tokens */
	uint32_t cap;          /* entries of conv */
	double next_us;        /* when the next turn is submitted (< 0: one
				  is running) */
	uint64_t req;          /* the running turn's request id */
	uint32_t n_out;        /* tokens of its answer received */
	double submit_us;      /* when the running turn was submitted */
	int first_seen;        /* its first token arrived */
} mt_session;

typedef struct mt_host {
	mt_session *ss;        /* [n_sess] */
	uint32_t n_sess;       /* sessions */
	uint32_t turns;        /* turns per session */
	double now_us;         /* virtual clock */
	double *ttft;          /* [n_sess * turns] in ms */
	uint32_t n_ttft;       /* entries */
	mt_session **first;    /* [n_sess] sessions whose first token came in
				  the current step (timed at its end) */
	uint32_t n_first;      /* entries */
	uint32_t done;         /* sessions finished */
} mt_host;

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The answer token a session's turn has at position j of its answer. */
static int32_t answer_tok(uint32_t sess, uint32_t turn, uint32_t j)
{
	return (int32_t)(mix(((uint64_t)sess << 40) ^ ((uint64_t)turn << 20) ^ j) % 30000u) + 2;
}

static int mt_forward(void *hp, const bkv_batch *b, int32_t *next)
{
	mt_host *h = hp;
	uint32_t r;

	for (r = 0; r < b->n_rows; r++) {
		mt_session *s = b->row_user[r];
		if (b->row_sample[r]) /* the answer's next token */
			next[r] = answer_tok((uint32_t)(s - h->ss), s->turn, s->n_out);
	}
	return 0;
}

static void mt_token(void *hp, uint64_t id, uint32_t br, int32_t t, void *user)
{
	mt_host *h = hp;
	mt_session *s = user;

	(void)id;
	(void)br;
	if (!s->first_seen) {
		s->first_seen = 1;
		h->first[h->n_first++] = s;
	}
	s->conv[s->len++] = t;
	s->n_out++;
}

static void mt_finish(void *hp, uint64_t id, bkv_finish_reason why, void *user)
{
	mt_host *h = hp;
	mt_session *s = user;

	(void)id;
	(void)why;
	s->req = 0;
	if (s->turn == h->turns)
		h->done++;
	else /* think time 0.5-2.5 s */
		s->next_us = h->now_us + 500000.0 + (double)(mix(s->len) % 2000000u);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int submit_turn(bkv_sched *sched, mt_host *h, mt_session *s)
{
	uint32_t sess = (uint32_t)(s - h->ss), user = 64 + (uint32_t)(mix(sess * 31 + s->turn) % 449);
	bkv_request q;
	uint32_t j;

	for (j = 0; j < user; j++) /* the user's message */
		s->conv[s->len++] = (int32_t)(mix(((uint64_t)sess << 32) ^ (s->turn << 16) ^ j) % 30000u) + 40000;
	bkv_request_init(&q);
	q.prompt = s->conv;
	q.prompt_len = s->len;
	q.max_new_tokens = ANSWER_LEN;
	q.user = s;
	s->submit_us = h->now_us;
	s->first_seen = 0;
	s->n_out = 0;
	s->next_us = -1.0;
	return bkv_submit(sched, &q, &s->req);
}

static double rate = 4.0; /* sessions started per second */

static void run(const char *name, int chunked, uint32_t budget, uint32_t n_sess, uint32_t turns)
{
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_cost_roofline rl;
	bkv_host_ops ops;
	bkv_sched_stats st;
	bkv_pool *pool;
	bkv_sched *sched;
	mt_host h;
	uint32_t i, j, steps = 0;
	double start = 0.0, sum = 0.0;

	memset(&h, 0, sizeof(h));
	h.n_sess = n_sess;
	h.turns = turns;
	h.ss = calloc(n_sess, sizeof(*h.ss));
	h.ttft = calloc((size_t)n_sess * turns, sizeof(double));
	h.first = calloc(n_sess, sizeof(*h.first));
	for (i = 0; i < n_sess; i++) {
		mt_session *s = &h.ss[i];

		s->sys = (uint32_t)(mix(i) % SYS_PROMPTS);
		s->cap = SYS_LEN + turns * (512 + ANSWER_LEN) + 16;
		s->conv = malloc(s->cap * sizeof(int32_t));
		for (j = 0; j < SYS_LEN; j++)
			s->conv[j] = (int32_t)(mix(((uint64_t)s->sys << 32) | j) % 30000u) + 2;
		s->len = SYS_LEN;
		start += 1e6 * -log(1.0 - (double)(mix(i + 77) % 1000000u) / 1e6) / rate;
		s->next_us = start; /* Poisson arrivals of sessions */
	}
	bkv_pool_config_init(&pc);
	pc.block_tokens = 16;
	pc.device_blocks = 60000; /* about 3,750 tokens per session of 256 */
	pc.max_seqs = 1024;
	if (bkv_pool_create(&pc, NULL, &pool) != BKV_OK)
		exit(1);
	bkv_cost_roofline_init(&rl, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16);
	bkv_sched_config_init(&sc);
	sc.max_running = 64;
	sc.chunked_prefill = chunked;
	sc.token_budget = budget;
	sc.cost = bkv_cost_roofline_model(&rl);
	memset(&ops, 0, sizeof(ops));
	ops.forward = mt_forward;
	ops.on_token = mt_token;
	ops.on_finish = mt_finish;
	if (bkv_sched_create(&sc, pool, &ops, &h, NULL, &sched) != BKV_OK)
		exit(1);
	while (h.done < n_sess) {
		bkv_step_info si;
		double next = -1.0;

		for (i = 0; i < n_sess; i++) {
			mt_session *s = &h.ss[i];

			if (s->next_us >= 0.0 && s->next_us <= h.now_us && s->turn < turns) {
				if (submit_turn(sched, &h, s) != BKV_OK)
					exit(2);
				s->turn++;
			}
		}
		if (bkv_sched_pending(sched) == 0) { /* idle: jump to the next turn */
			for (i = 0; i < n_sess; i++)
				if (h.ss[i].next_us >= 0.0 && h.ss[i].turn < turns &&
				    (next < 0.0 || h.ss[i].next_us < next))
					next = h.ss[i].next_us;
			if (next >= 0.0)
				h.now_us = next;
			continue;
		}
		h.n_first = 0;
		if (bkv_step(sched, &si) != BKV_OK)
			exit(3);
		h.now_us += si.predicted_us > 0.0 ? si.predicted_us : 1.0;
		for (i = 0; i < h.n_first; i++)
			h.ttft[h.n_ttft++] = (h.now_us - h.first[i]->submit_us) / 1000.0;
		steps++;
	}
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(sched, &st);
	qsort(h.ttft, h.n_ttft, sizeof(double), cmp_d);
	for (i = 0; i < h.n_ttft; i++)
		sum += h.ttft[i];
	printf("%-16s prompt tokens %10llu  hit %5.1f%%  ttft mean %8.1f ms  p99 %8.1f ms  "
	       "makespan %7.1f s  steps %u\n",
	       name, (unsigned long long)(st.prefill_tokens + st.hit_tokens),
	       100.0 * (double)st.hit_tokens / (double)(st.prefill_tokens + st.hit_tokens),
	       sum / h.n_ttft, h.ttft[(size_t)(0.99 * (h.n_ttft - 1))], h.now_us / 1e6, steps);
	bkv_sched_destroy(sched);
	bkv_pool_destroy(pool);
	for (i = 0; i < n_sess; i++)
		free(h.ss[i].conv);
	free(h.ss);
	free(h.ttft);
	free(h.first);
}

int main(int argc, char **argv)
{
	uint32_t n_sess = argc > 1 ? (uint32_t)atoi(argv[1]) : 96;
	uint32_t turns = argc > 2 ? (uint32_t)atoi(argv[2]) : 6;

	if (argc > 3)
		rate = atof(argv[3]);

	if (n_sess == 0 || turns == 0 || turns > MAX_TURNS)
		return 1;
	run("continuous", 0, 0, n_sess, turns);
	run("chunked 256", 1, 256, n_sess, turns);
	run("chunked 512", 1, 512, n_sess, turns);
	run("chunked 2048", 1, 2048, n_sess, turns);
	run("chunked auto", 1, 0, n_sess, turns);
	return 0;
}
