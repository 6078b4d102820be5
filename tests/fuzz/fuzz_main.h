/*
 * fuzz_main.h - the replay main of a fuzz harness (see fuzz.h). Included
 * last by each harness; compiled only when libFuzzer does not supply main.
 */
#ifndef BKV_FUZZ_MAIN_H
#define BKV_FUZZ_MAIN_H

#include "fuzz.h"

/* ---- replay main (plain builds) ------------------------------------------ */
#ifndef BKV_LIBFUZZER
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

/* Which input runs now: named if it aborts, and saved to ./fuzz-crash-input
 * (run the harness on that file to reproduce). */
static char fz_current[512];
static const uint8_t *fz_cur_data;
static size_t fz_cur_size;

static void fz_on_abort(int sig)
{
	int fd;

	(void)sig;
	(void)!write(2, "fuzz: failing input: ", 21);
	(void)!write(2, fz_current, strlen(fz_current));
	(void)!write(2, " (saved as fuzz-crash-input)\n", 30);
	fd = open("fuzz-crash-input", O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd >= 0) {
		(void)!write(fd, fz_cur_data, fz_cur_size);
		close(fd);
	}
	signal(SIGABRT, SIG_DFL);
	raise(SIGABRT);
}

typedef struct fz_files {
	uint8_t **data;
	size_t *size;
	char **name;
	size_t n, cap;
} fz_files;

static int fz_read_file(const char *path, fz_files *fs)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0, got;

	if (!f) {
		perror(path);
		return -1;
	}
	do {
		if (len == cap) {
			uint8_t *b = realloc(buf, cap ? cap * 2 : 4096);

			if (!b) {
				free(buf);
				fclose(f);
				return -1;
			}
			buf = b;
			cap = cap ? cap * 2 : 4096;
		}
		got = fread(buf + len, 1, cap - len, f);
		len += got;
	} while (got > 0);
	fclose(f);
	if (fs->n == fs->cap) {
		size_t c = fs->cap ? fs->cap * 2 : 64;
		uint8_t **d = realloc(fs->data, c * sizeof(*d));
		size_t *s;
		char **nm;

		if (!d) {
			free(buf);
			return -1;
		}
		fs->data = d;
		s = realloc(fs->size, c * sizeof(*s));
		if (!s) {
			free(buf);
			return -1;
		}
		fs->size = s;
		nm = realloc(fs->name, c * sizeof(*nm));
		if (!nm) {
			free(buf);
			return -1;
		}
		fs->name = nm;
		fs->cap = c;
	}
	fs->data[fs->n] = buf;
	fs->name[fs->n] = malloc(strlen(path) + 1);
	if (fs->name[fs->n])
		strcpy(fs->name[fs->n], path);
	fs->size[fs->n++] = len;
	return 0;
}

static int fz_cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Read a file, or every regular file of a directory in name order. */
static int fz_collect(const char *path, fz_files *fs)
{
	struct stat st;
	DIR *d;
	struct dirent *e;
	char **names = NULL;
	size_t n = 0, cap = 0, i;
	int rc = 0;

	if (stat(path, &st) != 0) {
		perror(path);
		return -1;
	}
	if (!S_ISDIR(st.st_mode))
		return fz_read_file(path, fs);
	d = opendir(path);
	if (!d) {
		perror(path);
		return -1;
	}
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		if (n == cap) {
			char **nn = realloc(names, (cap ? cap * 2 : 64) * sizeof(*nn));

			if (!nn)
				break;
			names = nn;
			cap = cap ? cap * 2 : 64;
		}
		names[n] = malloc(strlen(path) + strlen(e->d_name) + 2);
		if (!names[n])
			break;
		sprintf(names[n], "%s/%s", path, e->d_name);
		n++;
	}
	closedir(d);
	qsort(names, n, sizeof(*names), fz_cmp_names);
	for (i = 0; i < n; i++) {
		if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode) && fz_read_file(names[i], fs))
			rc = -1;
		free(names[i]);
	}
	free(names);
	return rc;
}

static uint64_t fz_splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* One mutant of a corpus input: flip, overwrite, insert, erase or splice. */
static size_t fz_mutate(uint64_t *rng, const fz_files *fs, uint8_t *out, size_t max)
{
	size_t k = fz_splitmix(rng) % fs->n, len = fs->size[k], i, edits;

	if (len > max)
		len = max;
	memcpy(out, fs->data[k], len);
	edits = 1 + fz_splitmix(rng) % 8;
	for (i = 0; i < edits; i++) {
		uint64_t r = fz_splitmix(rng);
		size_t at = len ? (size_t)(r >> 8) % len : 0;

		switch (r % 5) {
		case 0: /* flip a bit */
			if (len)
				out[at] ^= (uint8_t)(1u << ((r >> 40) % 8));
			break;
		case 1: /* overwrite with an interesting byte */
			if (len) {
				static const uint8_t v[] = {0, 1, 2, 0x7f, 0x80, 0xff, '\n', ',', '"'};

				out[at] = v[(r >> 40) % sizeof(v)];
			}
			break;
		case 2: /* insert a random byte */
			if (len < max) {
				memmove(out + at + 1, out + at, len - at);
				out[at] = (uint8_t)(r >> 48);
				len++;
			}
			break;
		case 3: /* erase a run */
			if (len) {
				size_t m = 1 + (r >> 40) % 16;

				if (m > len - at)
					m = len - at;
				memmove(out + at, out + at + m, len - at - m);
				len -= m;
			}
			break;
		default: { /* splice a slice of another input in */
			size_t o = fz_splitmix(rng) % fs->n, olen = fs->size[o], from, m;

			if (!olen)
				break;
			from = (size_t)(r >> 8) % olen;
			m = 1 + (r >> 40) % 64;
			if (m > olen - from)
				m = olen - from;
			if (m > max - at)
				m = max - at;
			memcpy(out + at, fs->data[o] + from, m);
			if (at + m > len)
				len = at + m;
		}
		}
	}
	return len;
}

int main(int argc, char **argv)
{
	fz_files fs = {NULL, NULL, NULL, 0, 0};
	unsigned long long mutants = 0, seed = 1, i;
	uint8_t *buf;
	int a;

	for (a = 1; a < argc; a++) {
		if (!strcmp(argv[a], "-r") && a + 1 < argc) {
			mutants = strtoull(argv[++a], NULL, 10);
		} else if (!strcmp(argv[a], "-s") && a + 1 < argc) {
			seed = strtoull(argv[++a], NULL, 10);
		} else if (fz_collect(argv[a], &fs) != 0) {
			return 2;
		}
	}
	if (fs.n == 0) {
		fprintf(stderr, "usage: %s [-r MUTANTS] [-s SEED] FILE|DIR...\n", argv[0]);
		return 2;
	}
	signal(SIGABRT, fz_on_abort);
	for (i = 0; i < fs.n; i++) {
		snprintf(fz_current, sizeof(fz_current), "%s", fs.name[i] ? fs.name[i] : "?");
		fz_cur_data = fs.data[i];
		fz_cur_size = fs.size[i];
		LLVMFuzzerTestOneInput(fs.data[i], fs.size[i]);
	}
	buf = malloc(1 << 16);
	if (!buf)
		return 2;
	for (i = 0; i < mutants; i++) {
		uint64_t rng = seed * 0x2545f4914f6cdd1dull + i;
		size_t len = fz_mutate(&rng, &fs, buf, 1 << 16);

		snprintf(fz_current, sizeof(fz_current), "mutant %llu of seed %llu (-r %llu -s %llu)", i,
			 seed, i + 1, seed);
		fz_cur_data = buf;
		fz_cur_size = len;

		LLVMFuzzerTestOneInput(buf, len);
	}
	printf("%s: %zu corpus inputs and %llu mutants (seed %llu) ran clean\n", argv[0], fs.n,
	       mutants, seed);
	free(buf);
	for (i = 0; i < fs.n; i++) {
		free(fs.data[i]);
		free(fs.name[i]);
	}
	free(fs.data);
	free(fs.name);
	free(fs.size);
	return 0;
}
#endif /* BKV_LIBFUZZER */

#endif /* BKV_FUZZ_MAIN_H */
