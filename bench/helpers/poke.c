/*
 * poke: the clone benchmark's small-write step: write LEN bytes at a pseudo-random offset into
 * every regular file under DIR, then syncfs(DIR) + fsync(DIR) (see sync_fs_of). Timed by the helper.
 *
 *   poke DIR LEN SEED
 *
 * Prints JSON: files touched, seconds for the writes, seconds for the syncfs.
 */
#include "common.h"
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

static size_t g_len;
static uint64_t g_rng;
static unsigned long long g_files;
static char g_buf[4096];

static uint64_t next_rand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static int visit(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)ftw;
    if (type != FTW_F || !S_ISREG(st->st_mode)) return 0;
    int fd = open(path, O_WRONLY);
    if (fd < 0) die("open %s", path);
    off_t max = st->st_size > (off_t)g_len ? st->st_size - (off_t)g_len : 0;
    off_t off = max ? (off_t)(next_rand() % (uint64_t)max) : 0;
    if (pwrite(fd, g_buf, g_len, off) != (ssize_t)g_len) die("pwrite %s", path);
    if (close(fd)) die("close %s", path);
    g_files++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: poke DIR LEN SEED\n");
        return 2;
    }
    g_len = (size_t)parse_u64(argv[2]);
    g_rng = parse_u64(argv[3]) * 0x9E3779B97F4A7C15ull + 1;
    if (g_len > sizeof g_buf) die("LEN too large");
    fill_random(g_buf, g_len);
    double t0 = now_s();
    if (nftw(argv[1], visit, 64, FTW_PHYS)) die("nftw %s", argv[1]);
    double t1 = now_s();
    int dfd = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (dfd < 0) die("open %s", argv[1]);
    sync_fs_of(dfd, argv[1]);
    double t2 = now_s();
    printf("{\"files\": %llu, \"write_s\": %.6f, \"syncfs_s\": %.6f, \"total_s\": %.6f}\n", g_files, t1 - t0, t2 - t1,
           t2 - t0);
    return 0;
}
