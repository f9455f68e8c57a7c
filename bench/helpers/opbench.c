/*
 * opbench: one system call, timed N times on its own, in DIR (for bench/tools/floor.py).
 *
 *   opbench DIR OP N
 *
 * OP is one of:
 *   nop      ioctl(TCGETS) on an open file: FUSE sends IOCTL and Amaranth answers ENOTTY at once,
 *            so this is a bare round trip (the transport's floor)
 *   getattr  statx(AT_STATX_FORCE_SYNC): a GETATTR the daemon answers from its inode table
 *   statfs   statfs(2): a STATFS
 *   open     open(O_RDONLY) of DIR/op.file (the close is not timed)
 *   read     pread 4 KiB from the cached DIR/op.file
 *   stat     stat(DIR/op.file) (warm: no request)
 *   chmod    chmod(DIR/op.file, 0600/0644 alternating)
 *   write    pwrite 4 KiB over DIR/op.file
 *   fsync    pwrite 4 KiB + fsync (only the fsync is timed)
 *   mkdir    mkdir(DIR/d.I)            rmdir  rmdir(DIR/d.I)
 *   create   open(DIR/c.I, O_CREAT|O_EXCL) + close
 *   unlink   unlink(DIR/c.I)           rename rename(DIR/c.I, DIR/c.I.r) (needs create first)
 *   readdir  opendir + readdir to the end + closedir of DIR/rd (32 files)
 *   setup    writes DIR/op.file (1 MiB), fsyncs and reads it (warm), makes DIR/rd; not timed
 * Prints JSON: {"op": ..., "n": N, "mean_ns": ..., "median_ns": ..., "p99_ns": ..., "slow_share": ...,
 * "migrations": ...} (slow_share: the fraction of the total time spent in calls that took over twice
 * the median; migrations: how often the scheduler moved this process to another CPU during the
 * timed calls, from /proc/self/sched, -1 where the kernel does not show it).
 */
#include "common.h"
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <dirent.h>
#include <termios.h>

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static const size_t FSZ = 1 << 20;

/* se.nr_migrations of this process (/proc/self/sched), or -1. */
static long long migrations(void) {
    FILE *f = fopen("/proc/self/sched", "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "se.nr_migrations", 16)) {
            char *colon = strchr(line, ':');
            if (colon) v = atoll(colon + 1);
            break;
        }
    fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: opbench DIR OP N\n");
        return 2;
    }
    const char *dir = argv[1], *op = argv[2];
    unsigned long long n = strtoull(argv[3], NULL, 10);
    char file[4096], path[4200], path2[4300];
    snprintf(file, sizeof file, "%s/op.file", dir);
    char *buf = xmalloc(FSZ);
    fill_random(buf, FSZ);
    if (!strcmp(op, "setup")) {
        int fd = open(file, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) die("open %s", file);
        if (pwrite(fd, buf, FSZ, 0) != (ssize_t)FSZ) die("pwrite");
        if (fsync(fd)) die("fsync");
        if (pread(fd, buf, FSZ, 0) != (ssize_t)FSZ) die("pread");
        close(fd);
        snprintf(path, sizeof path, "%s/rd", dir);
        if (mkdir(path, 0755) && errno != EEXIST) die("mkdir %s", path);
        for (int i = 0; i < 32; i++) {
            snprintf(path2, sizeof path2, "%s/rd/f%02d", dir, i);
            int f = open(path2, O_WRONLY | O_CREAT, 0644);
            if (f < 0) die("open %s", path2);
            close(f);
        }
        printf("{}\n");
        return 0;
    }
    uint64_t *lat = calloc(n ? n : 1, sizeof(uint64_t));
    int fd = open(file, O_RDWR);
    if (fd < 0) die("open %s", file);
    struct stat st;
    struct statx stx;
    struct statfs sfs;
    struct termios tio;
    char kind = !strcmp(op, "mkdir") || !strcmp(op, "rmdir") ? 'd' : 'c';
    long long moved0 = migrations();
    for (unsigned long long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%c.%llu", dir, kind, i);
        uint64_t s = now_ns(), e;
        int rc = 0;
        if (!strcmp(op, "nop")) {
            rc = ioctl(fd, TCGETS, &tio) < 0 && errno == ENOTTY ? 0 : -1;
        } else if (!strcmp(op, "getattr")) {
            rc = statx(fd, "", AT_EMPTY_PATH | AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &stx);
        } else if (!strcmp(op, "statfs")) {
            rc = fstatfs(fd, &sfs);
        } else if (!strcmp(op, "open")) {
            int f = open(file, O_RDONLY);
            e = now_ns();
            if (f < 0) die("open");
            close(f);
            lat[i] = e - s;
            continue;
        } else if (!strcmp(op, "read")) {
            rc = pread(fd, buf, 4096, (off_t)(i % 256) * 4096) == 4096 ? 0 : -1;
        } else if (!strcmp(op, "stat")) {
            rc = stat(file, &st);
        } else if (!strcmp(op, "chmod")) {
            rc = chmod(file, (i % 2) ? 0644 : 0600);
        } else if (!strcmp(op, "write")) {
            rc = pwrite(fd, buf + (i % 16) * 4096, 4096, (off_t)(i % 256) * 4096) == 4096 ? 0 : -1;
        } else if (!strcmp(op, "fsync")) {
            if (pwrite(fd, buf + (i % 16) * 4096, 4096, (off_t)(i % 256) * 4096) != 4096) die("pwrite");
            s = now_ns();
            rc = fsync(fd);
        } else if (!strcmp(op, "mkdir")) {
            rc = mkdir(path, 0755);
        } else if (!strcmp(op, "rmdir")) {
            rc = rmdir(path);
        } else if (!strcmp(op, "create")) {
            int f = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
            rc = f < 0 ? -1 : close(f);
        } else if (!strcmp(op, "unlink")) {
            rc = unlink(path);
        } else if (!strcmp(op, "readdir")) {
            snprintf(path2, sizeof path2, "%s/rd", dir);
            DIR *dp = opendir(path2);
            if (!dp) die("opendir %s", path2);
            int seen = 0;
            while (readdir(dp)) seen++;
            closedir(dp);
            rc = seen == 34 ? 0 : -1;
        } else if (!strcmp(op, "rename")) {
            snprintf(path2, sizeof path2, "%s.r", path);
            rc = rename(path, path2);
        } else {
            fprintf(stderr, "opbench: unknown op %s\n", op);
            return 2;
        }
        e = now_ns();
        if (rc < 0) die("%s %s", op, path);
        lat[i] = e - s;
    }
    long long moved1 = migrations();
    long long moved = moved0 < 0 || moved1 < 0 ? -1 : moved1 - moved0;
    long double sum = 0, slow = 0;
    for (unsigned long long i = 0; i < n; i++) sum += lat[i];
    qsort(lat, n, sizeof *lat, cmp_u64);
    uint64_t median = n ? lat[n / 2] : 0;
    /* the share of the total time spent in calls over twice the median (waits for a CPU, stalls) */
    for (unsigned long long i = 0; i < n; i++)
        if (lat[i] > 2 * median) slow += lat[i];
    printf("{\"op\": \"%s\", \"n\": %llu, \"mean_ns\": %.1f, \"median_ns\": %llu, \"p99_ns\": %llu, "
           "\"slow_share\": %.4f, \"migrations\": %lld}\n",
           op, n, n ? (double)(sum / n) : 0.0, (unsigned long long)median,
           n ? (unsigned long long)lat[(n * 99) / 100] : 0ull, sum > 0 ? (double)(slow / sum) : 0.0,
           moved);
    close(fd);
    return 0;
}
