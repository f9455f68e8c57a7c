/* libamaranth_pg: thin wrappers over the patchgroup ioctls (see amaranth_pg.h). */
#define _GNU_SOURCE
#include "amaranth_pg.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* Appends one line to $AMARANTH_PG_TRACE (if set) for a call and its result. */
static void trace(const char *call, int64_t a, int64_t b, int64_t result, int err) {
    const char *path = getenv("AMARANTH_PG_TRACE");
    if (!path || !*path)
        return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char line[160];
    int n;
    if (result < 0)
        n = snprintf(line, sizeof line, "%d %s %" PRId64 " %" PRId64 " -> -1 %s\n", (int)getpid(),
                     call, a, b, strerrorname_np(err) ? strerrorname_np(err) : "?");
    else
        n = snprintf(line, sizeof line, "%d %s %" PRId64 " %" PRId64 " -> %" PRId64 "\n",
                     (int)getpid(), call, a, b, result);
    if (n > 0) {
        ssize_t w = write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
    }
    close(fd);
}

static int64_t call(int fd, unsigned long cmd, const char *name, int64_t group, int64_t other,
                    uint32_t flags) {
    struct amaranth_pg_args args = {0};
    if (group < 0 || other < 0) {
        errno = EINVAL;
        trace(name, group, other, -1, errno);
        return -1;
    }
    args.group = (uint64_t)group;
    args.other = (uint64_t)other;
    args.flags = flags;
    int64_t r = ioctl(fd, cmd, &args);
    int err = errno;
    if (r == 0 && cmd == AMARANTH_PG_IOC_CREATE)
        r = (int64_t)args.group;
    trace(name, group, other, r, err);
    errno = err;
    return r < 0 ? -1 : r;
}

int amaranth_pg_open(const char *path) {
    if (!path)
        path = getenv("AMARANTH_PG_PATH");
    if (!path || !*path)
        path = ".";
    return open(path, O_RDONLY | O_CLOEXEC);
}

amaranth_pg_t amaranth_pg_create(int fd, int flags) {
    if (flags < 0) {
        errno = EINVAL;
        return -1;
    }
    return call(fd, AMARANTH_PG_IOC_CREATE, "create", 0, 0, (uint32_t)flags);
}

int amaranth_pg_add_depend(int fd, amaranth_pg_t after, amaranth_pg_t before) {
    return (int)call(fd, AMARANTH_PG_IOC_DEPEND, "add_depend", after, before, 0);
}

int amaranth_pg_release(int fd, amaranth_pg_t g) {
    return (int)call(fd, AMARANTH_PG_IOC_RELEASE, "release", g, 0, 0);
}

int amaranth_pg_engage(int fd, amaranth_pg_t g) {
    return (int)call(fd, AMARANTH_PG_IOC_ENGAGE, "engage", g, 0, 0);
}

int amaranth_pg_disengage(int fd, amaranth_pg_t g) {
    return (int)call(fd, AMARANTH_PG_IOC_DISENGAGE, "disengage", g, 0, 0);
}

int amaranth_pg_sync(int fd, amaranth_pg_t g) {
    return (int)call(fd, AMARANTH_PG_IOC_SYNC, "sync", g, 0, 0);
}

int amaranth_pg_abandon(int fd, amaranth_pg_t g) {
    return (int)call(fd, AMARANTH_PG_IOC_ABANDON, "abandon", g, 0, 0);
}

amaranth_pg_t amaranth_pg_linear(int fd, amaranth_pg_t prev) {
    if (prev > 0 && amaranth_pg_disengage(fd, prev) < 0 && errno != EINVAL)
        return -1;
    amaranth_pg_t g = amaranth_pg_create(fd, 0);
    if (g < 0)
        return -1;
    if ((prev > 0 && amaranth_pg_add_depend(fd, g, prev) < 0) || amaranth_pg_release(fd, g) < 0 ||
        amaranth_pg_engage(fd, g) < 0) {
        int err = errno;
        amaranth_pg_abandon(fd, g);
        errno = err;
        return -1;
    }
    if (prev > 0)
        amaranth_pg_abandon(fd, prev);
    return g;
}
