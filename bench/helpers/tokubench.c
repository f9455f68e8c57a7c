/*
 * tokubench: the TokuBench small-file creation benchmark (BetrFS micro/tokubench,
 * `benchmark-fs-threaded --files N -d 128 --iosize 200 --operations 1 --pwrite --threads 4`).
 *
 *   tokubench DIR NFILES THREADS FANOUT IOSIZE SAMPLE_EVERY SEED
 *
 * Creates NFILES files named benchfile.<random u64>, each with one IOSIZE-byte pwrite, in a balanced
 * directory tree under DIR: file i goes to leaf directory i / FANOUT, whose path is that number
 * written in base FANOUT, one digit per level (benchdir.<digit>/benchdir.<digit>/...), so no
 * directory holds more than FANOUT entries. Thread t creates files [t*N/T, (t+1)*N/T).
 * Every SAMPLE_EVERY files (counted across all threads) the elapsed time is recorded, giving the
 * cumulative files/s curve. After all threads finish, syncfs() on DIR is timed separately.
 * Prints one JSON object.
 */
#include "common.h"
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *g_dir;
static unsigned long long g_n, g_fanout, g_sample, g_seed;
static unsigned g_threads, g_levels;
static size_t g_iosize;
static atomic_ullong g_done;
static double g_t0;
static double *g_samples;

static void leaf_path(char *out, size_t cap, unsigned long long leaf) {
    unsigned long long digits[64];
    for (unsigned l = 0; l < g_levels; l++) {
        digits[g_levels - 1 - l] = leaf % g_fanout;
        leaf /= g_fanout;
    }
    size_t n = (size_t)snprintf(out, cap, "%s", g_dir);
    for (unsigned l = 0; l < g_levels; l++) n += (size_t)snprintf(out + n, cap - n, "/benchdir.%llu", digits[l]);
}

static void mkdirs(char *path, size_t base_len) {
    /* create every component after the base directory; EEXIST is fine (threads share parents) */
    for (char *p = path + base_len + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(path, 0755) && errno != EEXIST) die("mkdir %s", path);
            *p = '/';
        }
    }
    if (mkdir(path, 0755) && errno != EEXIST) die("mkdir %s", path);
}

static inline uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void *worker(void *arg) {
    unsigned t = (unsigned)(uintptr_t)arg;
    unsigned long long lo = g_n * t / g_threads, hi = g_n * (t + 1) / g_threads;
    uint64_t rng = (g_seed + 1) * 0x9E3779B97F4A7C15ull + t * 0x632BE59BD9B4E019ull + 1;
    char *buf = xmalloc(g_iosize);
    char dir[4096], path[4200];
    size_t base_len = strlen(g_dir);
    unsigned long long cur_leaf = ~0ull;
    for (unsigned long long i = lo; i < hi; i++) {
        unsigned long long leaf = i / g_fanout;
        if (leaf != cur_leaf) {
            leaf_path(dir, sizeof dir, leaf);
            mkdirs(dir, base_len);
            cur_leaf = leaf;
        }
        snprintf(path, sizeof path, "%s/benchfile.%llu", dir, (unsigned long long)xorshift(&rng));
        int fd = open(path, O_WRONLY | O_CREAT, 0644);
        if (fd < 0) die("open %s", path);
        for (size_t k = 0; k + 8 <= g_iosize; k += 8) {
            uint64_t r = xorshift(&rng);
            memcpy(buf + k, &r, 8);
        }
        if (pwrite(fd, buf, g_iosize, 0) != (ssize_t)g_iosize) die("pwrite %s", path);
        if (close(fd)) die("close %s", path);
        unsigned long long n = atomic_fetch_add(&g_done, 1) + 1;
        if (n % g_sample == 0) g_samples[n / g_sample - 1] = now_s() - g_t0;
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: tokubench DIR NFILES THREADS FANOUT IOSIZE SAMPLE_EVERY SEED\n");
        return 2;
    }
    g_dir = argv[1];
    g_n = parse_u64(argv[2]);
    g_threads = (unsigned)parse_u64(argv[3]);
    g_fanout = parse_u64(argv[4]);
    g_iosize = (size_t)parse_u64(argv[5]);
    g_sample = parse_u64(argv[6]);
    g_seed = parse_u64(argv[7]);
    if (!g_n || !g_threads || g_fanout < 2 || !g_sample) die("bad arguments");
    unsigned long long leaves = (g_n + g_fanout - 1) / g_fanout, cap = g_fanout;
    g_levels = 1;
    while (cap < leaves) {
        cap *= g_fanout;
        g_levels++;
    }
    if (mkdir(g_dir, 0755) && errno != EEXIST) die("mkdir %s", g_dir);
    g_samples = calloc(g_n / g_sample + 1, sizeof(double));
    pthread_t *th = calloc(g_threads, sizeof(pthread_t));
    g_t0 = now_s();
    for (unsigned t = 0; t < g_threads; t++)
        if (pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)t)) die("pthread_create");
    for (unsigned t = 0; t < g_threads; t++) pthread_join(th[t], NULL);
    double t1 = now_s();
    int dfd = open(g_dir, O_RDONLY | O_DIRECTORY);
    if (dfd < 0) die("open %s", g_dir);
    sync_fs_of(dfd, g_dir);
    double t2 = now_s();
    close(dfd);
    double create_s = t1 - g_t0, total_s = t2 - g_t0;
    printf("{\"files\": %llu, \"threads\": %u, \"fanout\": %llu, \"levels\": %u, \"iosize\": %zu, "
           "\"create_s\": %.6f, \"syncfs_s\": %.6f, \"files_per_s\": %.3f, \"files_per_s_incl_sync\": %.3f, "
           "\"curve\": [",
           g_n, g_threads, g_fanout, g_levels, g_iosize, create_s, t2 - t1, (double)g_n / create_s,
           (double)g_n / total_s);
    for (unsigned long long k = 0; k < g_n / g_sample; k++)
        printf("%s[%llu, %.6f]", k ? ", " : "", (k + 1) * g_sample, g_samples[k]);
    printf("]}\n");
    return 0;
}
