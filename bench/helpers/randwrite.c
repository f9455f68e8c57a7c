/*
 * randwrite: the BetrFS random-write microbenchmark (micro/large-file/random_write.c).
 *
 *   randwrite FILE COUNT WRITE_SIZE SEED
 *
 * Opens the existing FILE (size S), seeds glibc random() with SEED (the paper: 42) and issues COUNT
 * pwrites of WRITE_SIZE bytes at offsets ((uint64)random() << 32 | random()) % (S - WRITE_SIZE),
 * then one fsync. glibc's random() is a deterministic additive-feedback generator, so the offset
 * sequence is identical on every file system and run. Prints JSON with the write and fsync times.
 */
#include "common.h"
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: randwrite FILE COUNT WRITE_SIZE SEED\n");
        return 2;
    }
    const char *path = argv[1];
    unsigned long long count = parse_u64(argv[2]);
    size_t wsize = (size_t)parse_u64(argv[3]);
    unsigned seed = (unsigned)parse_u64(argv[4]);
    int fd = open(path, O_WRONLY);
    if (fd < 0) die("open %s", path);
    struct stat st;
    if (fstat(fd, &st)) die("fstat");
    unsigned long long fsize = (unsigned long long)st.st_size;
    if (fsize <= wsize) {
        errno = 0;
        die("file %s is too small (%llu bytes)", path, fsize);
    }
    /* Precompute offsets and payloads so the timed loop is only pwrite(). */
    unsigned long long *offs = malloc(count * sizeof *offs);
    char *payload = xmalloc(count * wsize);
    if (!offs) die("malloc");
    srandom(seed);
    for (unsigned long long i = 0; i < count; i++) {
        unsigned long long hi = (unsigned long long)random(), lo = (unsigned long long)random();
        offs[i] = ((hi << 32) | lo) % (fsize - wsize);
    }
    fill_random(payload, count * wsize);
    double t0 = now_s();
    for (unsigned long long i = 0; i < count; i++) {
        ssize_t n = pwrite(fd, payload + i * wsize, wsize, (off_t)offs[i]);
        if (n != (ssize_t)wsize) die("pwrite at %llu", offs[i]);
    }
    double t1 = now_s();
    if (fsync(fd)) die("fsync");
    double t2 = now_s();
    close(fd);
    printf("{\"count\": %llu, \"write_size\": %zu, \"file_size\": %llu, \"write_s\": %.6f, "
           "\"fsync_s\": %.6f, \"total_s\": %.6f}\n",
           count, wsize, fsize, t1 - t0, t2 - t1, t2 - t0);
    return 0;
}
