/* A client of libamaranth_pg for the mount tests (crates/cli/tests/patchgroups.rs).
 *
 *   pg_client rules DIR    every rule's error through the library; prints "ok"
 *   pg_client hold DIR     engages an atomic group, writes DIR/main from the main thread and
 *                          DIR/thread from a second thread, which also fsyncs it (its FUSE
 *                          requests carry the thread's id: if it were not taken for this process,
 *                          its fsync would wait for the group, this process's, until the group's
 *                          time limit and commit it there), prints "engaged", sleeps until killed
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "amaranth_pg.h"

static int failures;

#define EXPECT(call, want)                                                                         \
    do {                                                                                           \
        errno = 0;                                                                                 \
        long long r_ = (long long)(call);                                                          \
        int e_ = r_ < 0 ? errno : 0;                                                               \
        if (e_ != (want)) {                                                                        \
            fprintf(stderr, "line %d: %s: got %lld errno %d (%s), want errno %d\n", __LINE__,       \
                    #call, r_, e_, strerror(e_), (want));                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void write_file_sync(const char *dir, const char *name, int sync) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "data\n", 5) != 5 || (sync && fsync(fd) != 0) || close(fd) != 0) {
        perror(path);
        exit(2);
    }
}

static void write_file(const char *dir, const char *name) {
    write_file_sync(dir, name, 0);
}

static const char *g_dir;
static void *thread_main(void *arg) {
    (void)arg;
    write_file_sync(g_dir, "thread", 1);
    return NULL;
}

static int rules(const char *dir) {
    int fd = amaranth_pg_open(dir);
    if (fd < 0) {
        perror(dir);
        return 2;
    }
    EXPECT(amaranth_pg_create(fd, 0x40), EINVAL);
    amaranth_pg_t p = amaranth_pg_create(fd, 0), q = amaranth_pg_create(fd, 0);
    if (p <= 0 || q <= 0) {
        perror("create");
        return 2;
    }
    EXPECT(amaranth_pg_engage(fd, p), EINVAL);          /* not released */
    EXPECT(amaranth_pg_add_depend(fd, p, p), EINVAL);   /* on itself */
    EXPECT(amaranth_pg_engage(fd, 999999), ENOENT);     /* not ours */
    EXPECT(amaranth_pg_release(fd, p), 0);
    EXPECT(amaranth_pg_engage(fd, p), 0);
    write_file(dir, "in-p");
    EXPECT(amaranth_pg_add_depend(fd, q, p), EBUSY);    /* p engaged */
    EXPECT(amaranth_pg_abandon(fd, p), EBUSY);
    EXPECT(amaranth_pg_disengage(fd, p), 0);
    EXPECT(amaranth_pg_disengage(fd, p), EINVAL);
    EXPECT(amaranth_pg_add_depend(fd, q, p), 0);
    EXPECT(amaranth_pg_engage(fd, p), EINVAL);          /* sealed */
    EXPECT(amaranth_pg_add_depend(fd, p, q), EINVAL);   /* would be a cycle */
    EXPECT(amaranth_pg_release(fd, q), 0);
    EXPECT(amaranth_pg_engage(fd, q), 0);
    write_file(dir, "in-q");
    EXPECT(amaranth_pg_disengage(fd, q), 0);
    EXPECT(amaranth_pg_sync(fd, q), 0);
    EXPECT(amaranth_pg_sync(fd, 0), 0);
    EXPECT(amaranth_pg_abandon(fd, p), 0);
    EXPECT(amaranth_pg_abandon(fd, q), 0);
    EXPECT(amaranth_pg_abandon(fd, q), ENOENT);
    /* Atomic groups. */
    amaranth_pg_t a = amaranth_pg_create(fd, AMARANTH_PG_ATOMIC);
    amaranth_pg_t b = amaranth_pg_create(fd, AMARANTH_PG_ATOMIC);
    EXPECT(amaranth_pg_release(fd, a), 0);
    EXPECT(amaranth_pg_release(fd, b), 0);
    EXPECT(amaranth_pg_engage(fd, a), 0);
    EXPECT(amaranth_pg_engage(fd, b), EBUSY);           /* one atomic group per process */
    write_file(dir, "in-a");
    EXPECT(amaranth_pg_sync(fd, a), EBUSY);             /* not durable before its commit */
    EXPECT(amaranth_pg_disengage(fd, a), 0);
    EXPECT(amaranth_pg_engage(fd, a), EINVAL);          /* engaged once */
    EXPECT(amaranth_pg_sync(fd, a), 0);
    /* The linear helper. */
    amaranth_pg_t l1 = amaranth_pg_linear(fd, 0);
    write_file(dir, "l1");
    amaranth_pg_t l2 = amaranth_pg_linear(fd, l1);
    write_file(dir, "l2");
    EXPECT(l2 > l1 ? 0 : -1, 0);
    EXPECT(amaranth_pg_disengage(fd, l2), 0);
    EXPECT(amaranth_pg_engage(fd, l1), ENOENT);         /* abandoned by linear */
    /* A descriptor that is not on an Amaranth mount. */
    int other = open("/", O_RDONLY);
    EXPECT(amaranth_pg_create(other, 0), ENOTTY);
    EXPECT(amaranth_pg_sync(fd, 0), 0);
    if (failures)
        return 1;
    puts("ok");
    return 0;
}

static int hold(const char *dir) {
    int fd = amaranth_pg_open(dir);
    amaranth_pg_t a = amaranth_pg_create(fd, AMARANTH_PG_ATOMIC);
    if (fd < 0 || a < 0 || amaranth_pg_release(fd, a) < 0 || amaranth_pg_engage(fd, a) < 0) {
        perror("atomic group");
        return 2;
    }
    write_file(dir, "main");
    g_dir = dir;
    pthread_t t;
    if (pthread_create(&t, NULL, thread_main, NULL) != 0 || pthread_join(t, NULL) != 0)
        return 2;
    puts("engaged");
    fflush(stdout);
    for (;;)
        pause();
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    if (!strcmp(argv[1], "rules"))
        return rules(argv[2]);
    if (!strcmp(argv[1], "hold"))
        return hold(argv[2]);
    return 2;
}
