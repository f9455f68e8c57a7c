/* LD_PRELOAD shim for the imapmove benchmark: on an Amaranth mount, every fsync() and
 * fdatasync() becomes a patchgroup ordering point instead of a wait for the disk. The process
 * works in a chain of patchgroups (Featherstitch's "linear" mode): at each fsync the current
 * group is disengaged and a new one, depending on it, is engaged, so every change made after the
 * fsync reaches the disk after every change made before it, which is what the program's fsync
 * was there to guarantee. The one durable sync happens at the end (the benchmark's client asks
 * for it, `amaranth pg sync`; this shim also syncs its last group at exit).
 *
 * AMARANTH_PG_PATH names any directory on the mount. Without it, or off an Amaranth mount, the
 * calls are passed through unchanged. The current group's id is kept in AMARANTH_PG_GROUP, so a
 * program that executes itself again (Dovecot does, through doveconf) goes on with the same chain:
 * groups belong to the process and survive exec. Dovecot cleans its environment at that exec:
 * its `import_environment` setting must keep LD_PRELOAD, AMARANTH_PG_PATH and AMARANTH_PG_GROUP. Built with clients/libamaranth_pg/amaranth_pg.c:
 *   gcc -O2 -shared -fPIC -I clients/libamaranth_pg -o pgfsync.so pgfsync.c amaranth_pg.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "amaranth_pg.h"

static int ctl = -1;
static amaranth_pg_t cur;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);

/* The current group, for the next program this process executes. */
static void remember(void) {
    char id[24];
    snprintf(id, sizeof id, "%lld", (long long)cur);
    setenv("AMARANTH_PG_GROUP", id, 1);
}

__attribute__((constructor)) static void start(void) {
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    const char *path = getenv("AMARANTH_PG_PATH");
    if (!path || !*path)
        return;
    ctl = amaranth_pg_open(path);
    if (ctl < 0)
        return;
    const char *kept = getenv("AMARANTH_PG_GROUP");
    cur = kept ? atoll(kept) : amaranth_pg_linear(ctl, 0);
    if (cur <= 0) {
        close(ctl);
        ctl = -1;
        return;
    }
    remember();
}

__attribute__((destructor)) static void stop(void) {
    if (ctl < 0)
        return;
    amaranth_pg_disengage(ctl, cur);
    amaranth_pg_sync(ctl, cur);
}

/* An ordering point: the next group depends on everything so far. */
static int order(void) {
    pthread_mutex_lock(&lock);
    amaranth_pg_t next = amaranth_pg_linear(ctl, cur);
    int ok = next > 0;
    if (ok) {
        cur = next;
        remember();
    }
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

int fsync(int fd) {
    if (ctl >= 0 && order() == 0)
        return 0;
    return real_fsync(fd);
}

int fdatasync(int fd) {
    if (ctl >= 0 && order() == 0)
        return 0;
    return real_fdatasync(fd);
}
