/*
 * nanobench: warm-cache latency of single system calls (FAST'15 Table 7 style).
 *
 *   nanobench DIR ITERS META_ITERS
 *
 * In DIR: a 1 MiB file is written, fsynced and read once (warm). Then, each call timed on its own
 * with CLOCK_MONOTONIC (after 100 untimed warm-up calls):
 *   open   open(file, O_RDONLY)             (the close is not timed)      ITERS times
 *   read   pread 4 KiB from the cached file                               ITERS times
 *   stat   stat(file)                                                     ITERS times
 *   chmod  chmod(file, 0600/0644 alternating)                             ITERS times
 *   write  pwrite 4 KiB into the cached file (overwrite)                  ITERS times
 *   mkdir  mkdir(new name)                                                META_ITERS times
 *   rmdir  rmdir of those directories                                     META_ITERS times
 *   unlink unlink of META_ITERS pre-created empty files                   META_ITERS times
 * Prints JSON: per call mean, median and 99th percentile in nanoseconds, and slow_share: the fraction
 * of the total time spent in calls over twice the median. On a shared machine the mean is often
 * dominated by those few calls (each waits for a CPU, milliseconds), while the median is the cost of
 * one call that did not wait: compare means with means and medians with medians.
 */
#include "common.h"
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int first = 1;
static void report(const char *op, uint64_t *lat, unsigned long long n) {
    long double sum = 0, slow = 0;
    for (unsigned long long i = 0; i < n; i++) sum += lat[i];
    qsort(lat, n, sizeof *lat, cmp_u64);
    uint64_t median = lat[n / 2];
    for (unsigned long long i = 0; i < n; i++)
        if (lat[i] > 2 * median) slow += lat[i];
    printf("%s\"%s\": {\"n\": %llu, \"mean_ns\": %.1f, \"median_ns\": %llu, \"p99_ns\": %llu, \"slow_share\": %.4f}",
           first ? "" : ", ", op, n, (double)(sum / n), (unsigned long long)median,
           (unsigned long long)lat[(n * 99) / 100], sum > 0 ? (double)(slow / sum) : 0.0);
    first = 0;
}

#define TIME_CALL(dst, expr, what)                  \
    do {                                            \
        uint64_t _s = now_ns();                     \
        if ((expr) < 0) die("%s", what);            \
        (dst) = now_ns() - _s;                      \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: nanobench DIR ITERS META_ITERS\n");
        return 2;
    }
    const char *dir = argv[1];
    unsigned long long iters = parse_u64(argv[2]), miters = parse_u64(argv[3]);
    unsigned long long maxn = iters > miters ? iters : miters;
    uint64_t *lat = calloc(maxn, sizeof(uint64_t));
    char file[4096], path[4200];
    snprintf(file, sizeof file, "%s/nano.file", dir);
    const size_t fsz = 1 << 20;
    char *buf = xmalloc(fsz);
    fill_random(buf, fsz);
    int fd = open(file, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("open %s", file);
    if (pwrite(fd, buf, fsz, 0) != (ssize_t)fsz) die("pwrite");
    if (fsync(fd)) die("fsync");
    if (pread(fd, buf, fsz, 0) != (ssize_t)fsz) die("pread");
    struct stat st;
    printf("{");

    for (int w = 0; w < 100; w++) close(open(file, O_RDONLY));
    for (unsigned long long i = 0; i < iters; i++) {
        int f;
        uint64_t s = now_ns();
        f = open(file, O_RDONLY);
        lat[i] = now_ns() - s;
        if (f < 0) die("open");
        close(f);
    }
    report("open", lat, iters);

    for (int w = 0; w < 100; w++) (void)!pread(fd, buf, 4096, (off_t)(w % 256) * 4096);
    for (unsigned long long i = 0; i < iters; i++)
        TIME_CALL(lat[i], pread(fd, buf, 4096, (off_t)(i % 256) * 4096), "pread");
    report("read", lat, iters);

    for (int w = 0; w < 100; w++) stat(file, &st);
    for (unsigned long long i = 0; i < iters; i++) TIME_CALL(lat[i], stat(file, &st), "stat");
    report("stat", lat, iters);

    for (int w = 0; w < 100; w++) chmod(file, 0644);
    for (unsigned long long i = 0; i < iters; i++) TIME_CALL(lat[i], chmod(file, (i % 2) ? 0644 : 0600), "chmod");
    report("chmod", lat, iters);

    for (int w = 0; w < 100; w++) (void)!pwrite(fd, buf, 4096, (off_t)(w % 256) * 4096);
    for (unsigned long long i = 0; i < iters; i++)
        TIME_CALL(lat[i], pwrite(fd, buf + (i % 16) * 4096, 4096, (off_t)(i % 256) * 4096), "pwrite");
    report("write", lat, iters);

    for (unsigned long long i = 0; i < miters; i++) {
        snprintf(path, sizeof path, "%s/nano.dir.%llu", dir, i);
        TIME_CALL(lat[i], mkdir(path, 0755), path);
    }
    report("mkdir", lat, miters);
    for (unsigned long long i = 0; i < miters; i++) {
        snprintf(path, sizeof path, "%s/nano.dir.%llu", dir, i);
        TIME_CALL(lat[i], rmdir(path), path);
    }
    report("rmdir", lat, miters);

    for (unsigned long long i = 0; i < miters; i++) {
        snprintf(path, sizeof path, "%s/nano.unlink.%llu", dir, i);
        int f = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (f < 0) die("create %s", path);
        close(f);
    }
    for (unsigned long long i = 0; i < miters; i++) {
        snprintf(path, sizeof path, "%s/nano.unlink.%llu", dir, i);
        TIME_CALL(lat[i], unlink(path), path);
    }
    report("unlink", lat, miters);
    printf("}\n");
    close(fd);
    return 0;
}
