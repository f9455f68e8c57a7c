/* Shared bits of the benchmark helpers: timing, random buffers, errors. */
#ifndef AMARANTH_BENCH_COMMON_H
#define AMARANTH_BENCH_COMMON_H
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...) {
    int e = errno;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (e) fprintf(stderr, ": %s", strerror(e));
    fputc('\n', stderr);
    exit(1);
}

/* Fill buf with incompressible bytes from the kernel CSPRNG. */
static inline void fill_random(void *buf, size_t len) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = getrandom((char *)buf + done, len - done, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("getrandom");
        }
        done += (size_t)n;
    }
}

static inline void *xmalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, n ? n : 1)) die("posix_memalign(%zu)", n);
    return p;
}

/* Make the whole file system durable: syncfs(2), then fsync(2) of the directory. The kernel does not
 * pass syncfs on to a FUSE daemon (only virtiofs gets it), so for Amaranth the directory fsync
 * (FUSE_FSYNCDIR, a sync of the daemon's log) is what flushes; on a kernel FS it finds nothing left. */
static inline void sync_fs_of(int dfd, const char *what) {
    if (syncfs(dfd)) die("syncfs %s", what);
    if (fsync(dfd)) die("fsync %s", what);
}

static inline unsigned long long parse_u64(const char *s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) die("bad number '%s'", s);
    return v;
}
#endif
