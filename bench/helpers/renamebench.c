/*
 * renamebench: COUNT x (rename(A, B) + fsync of the parent directory), alternating A->B and B->A,
 * as in BetrFS micro/circlingtradeoff/file-rename.c (files) and micro/rename (directories).
 *
 *   renamebench A B COUNT
 *
 * A and B must be in the same directory; A must exist. Each iteration's latency is measured with
 * CLOCK_MONOTONIC. Prints JSON: total seconds, renames/s, and every latency in microseconds.
 * After an even COUNT the object is back at A.
 */
#include "common.h"
#include <fcntl.h>
#include <libgen.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: renamebench A B COUNT\n");
        return 2;
    }
    const char *a = argv[1], *b = argv[2];
    unsigned long long count = parse_u64(argv[3]);
    char *tmp = strdup(a);
    const char *parent = dirname(tmp);
    int dfd = open(parent, O_RDONLY | O_DIRECTORY);
    if (dfd < 0) die("open %s", parent);
    double *lat = calloc(count ? count : 1, sizeof(double));
    double t0 = now_s();
    for (unsigned long long i = 0; i < count; i++) {
        double s = now_s();
        const char *from = (i % 2) ? b : a, *to = (i % 2) ? a : b;
        if (rename(from, to)) die("rename %s -> %s", from, to);
        if (fsync(dfd)) die("fsync %s", parent);
        lat[i] = now_s() - s;
    }
    double t1 = now_s();
    printf("{\"count\": %llu, \"total_s\": %.6f, \"renames_per_s\": %.3f, \"latency_us\": [", count, t1 - t0,
           (double)count / (t1 - t0));
    for (unsigned long long i = 0; i < count; i++) printf("%s%.1f", i ? ", " : "", lat[i] * 1e6);
    printf("]}\n");
    return 0;
}
