/*
 * seqio: sequential write / read of one file, timed by the helper itself.
 *
 *   seqio write FILE SIZE BLOCK   pwrite SIZE bytes of incompressible random data in BLOCK-sized
 *                                  writes (taken at rotating offsets from one random pool, so no two
 *                                  blocks are identical), then one fsync.
 *   seqio read FILE BLOCK                 read the whole file in BLOCK-sized reads.
 *   seqio randread FILE COUNT BLOCK SEED [THREADS]
 *                                  COUNT preads of BLOCK bytes at BLOCK-aligned offsets drawn
 *                                  uniformly from the file (xorshift64* seeded with SEED, offsets
 *                                  drawn before the clock starts), after POSIX_FADV_RANDOM so the
 *                                  kernel reads no more than each call asks for; with THREADS
 *                                  (default 1), that many threads on one descriptor share the
 *                                  offsets (thread t takes every THREADS-th one from t), so up to
 *                                  THREADS reads are in flight.
 *
 * Prints one JSON object on stdout: bytes, seconds for the writes/reads, seconds for the fsync.
 * Buffer generation happens before the clock starts.
 */
#include "common.h"
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#define ROT_SPAN (1u << 20)

static int do_write(const char *path, unsigned long long size, size_t block) {
    /* One pool of BLOCK + 1 MiB random bytes; write i starts at a different, not 4 KiB-aligned
     * offset inside it (i * 4099 mod 1 MiB), so consecutive blocks differ at every block
     * alignment while the memory cost stays at one block. */
    size_t span = size < block ? (size_t)size : block;
    size_t pool_len = span + ROT_SPAN;
    char *pool = xmalloc(pool_len);
    fill_random(pool, pool_len);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("open %s", path);
    double t0 = now_s();
    unsigned long long off = 0, i = 0;
    while (off < size) {
        size_t len = block;
        if (size - off < len) len = (size_t)(size - off);
        const char *src = pool + (size_t)((i * 4099u) % ROT_SPAN);
        size_t done = 0;
        while (done < len) {
            ssize_t n = pwrite(fd, src + done, len - done, (off_t)(off + done));
            if (n < 0) {
                if (errno == EINTR) continue;
                die("pwrite %s at %llu", path, off + done);
            }
            done += (size_t)n;
        }
        off += len;
        i++;
    }
    double t1 = now_s();
    if (fsync(fd)) die("fsync %s", path);
    double t2 = now_s();
    if (close(fd)) die("close %s", path);
    printf("{\"bytes\": %llu, \"block\": %zu, \"write_s\": %.6f, \"fsync_s\": %.6f, \"total_s\": %.6f}\n",
           size, block, t1 - t0, t2 - t1, t2 - t0);
    return 0;
}

static int do_read(const char *path, size_t block) {
    char *buf = xmalloc(block);
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open %s", path);
    double t0 = now_s();
    unsigned long long total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, block);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("read %s", path);
        }
        if (n == 0) break;
        total += (unsigned long long)n;
    }
    double t1 = now_s();
    close(fd);
    printf("{\"bytes\": %llu, \"block\": %zu, \"read_s\": %.6f}\n", total, block, t1 - t0);
    return 0;
}

static uint64_t xorshift64s(uint64_t *x) {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

struct rr_job {
    int fd;
    const off_t *offs;
    unsigned long long count, first, step;
    size_t block;
    const char *path;
};

static void *rr_worker(void *arg) {
    struct rr_job *j = arg;
    char *buf = xmalloc(j->block);
    for (unsigned long long i = j->first; i < j->count; i += j->step) {
        ssize_t n = pread(j->fd, buf, j->block, j->offs[i]);
        if (n < 0 && errno == EINTR) {
            i -= j->step;
            continue;
        }
        if (n != (ssize_t)j->block) die("pread %s at %lld returned %zd", j->path, (long long)j->offs[i], n);
    }
    free(buf);
    return NULL;
}

static int do_randread(const char *path, unsigned long long count, size_t block, unsigned long long seed,
                       unsigned long long threads) {
    if (block == 0 || count == 0) die("randread: COUNT and BLOCK must be positive");
    if (threads == 0 || threads > 1024) die("randread: THREADS must be 1 to 1024");
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open %s", path);
    struct stat st;
    if (fstat(fd, &st)) die("fstat %s", path);
    unsigned long long blocks = (unsigned long long)st.st_size / block;
    if (blocks == 0) die("randread: %s is smaller than one block", path);
    int e = posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    if (e) {
        errno = e;
        die("posix_fadvise %s", path);
    }
    off_t *offs = xmalloc(count * sizeof *offs);
    uint64_t x = seed ? seed : 1;
    for (unsigned long long i = 0; i < count; i++) offs[i] = (off_t)((xorshift64s(&x) % blocks) * block);
    struct rr_job *jobs = xmalloc(threads * sizeof *jobs);
    pthread_t *tids = xmalloc(threads * sizeof *tids);
    for (unsigned long long t = 0; t < threads; t++)
        jobs[t] = (struct rr_job){fd, offs, count, t, threads, block, path};
    double t0 = now_s();
    if (threads == 1) {
        rr_worker(&jobs[0]);
    } else {
        for (unsigned long long t = 0; t < threads; t++)
            if (pthread_create(&tids[t], NULL, rr_worker, &jobs[t])) die("pthread_create");
        for (unsigned long long t = 0; t < threads; t++) pthread_join(tids[t], NULL);
    }
    double t1 = now_s();
    close(fd);
    printf("{\"reads\": %llu, \"block\": %zu, \"threads\": %llu, \"file_bytes\": %lld, \"read_s\": %.6f}\n",
           count, block, threads, (long long)st.st_size, t1 - t0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "write"))
        return do_write(argv[2], parse_u64(argv[3]), (size_t)parse_u64(argv[4]));
    if (argc == 4 && !strcmp(argv[1], "read")) return do_read(argv[2], (size_t)parse_u64(argv[3]));
    if ((argc == 6 || argc == 7) && !strcmp(argv[1], "randread"))
        return do_randread(argv[2], parse_u64(argv[3]), (size_t)parse_u64(argv[4]), parse_u64(argv[5]),
                           argc == 7 ? parse_u64(argv[6]) : 1);
    fprintf(stderr, "usage: seqio write FILE SIZE BLOCK | seqio read FILE BLOCK | "
                    "seqio randread FILE COUNT BLOCK SEED [THREADS]\n");
    return 2;
}
