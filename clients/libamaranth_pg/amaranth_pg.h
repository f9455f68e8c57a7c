/*
 * libamaranth_pg: patchgroups on an Amaranth mount (docs/PATCHGROUPS.md).
 *
 * A patchgroup collects every change your process makes while it is engaged. Declaring
 * amaranth_pg_add_depend(after, before) makes every change of `before` reach the disk before any
 * change of `after`, without waiting for anything: ordering instead of fsync. An atomic group
 * (AMARANTH_PG_ATOMIC) survives a crash whole or not at all.
 *
 * Every call takes a file descriptor of any file or directory on the mount (amaranth_pg_open()),
 * returns 0 (create: the new group, > 0) on success and -1 with errno set on failure:
 *   ENOENT  the group is not one of this process's groups
 *   EINVAL  the rules forbid it (engage before release, engage a group that has afters, depend on
 *           itself, add a before after the release, disengage a group not engaged, unknown flags)
 *   EBUSY   the group is engaged (depend on it, abandon it), or this process has an atomic group
 *           engaged (a second one, or a sync that would have to wait for it)
 *   EMFILE  this process holds too many groups;  ENFILE: the file system has too many
 *   ETIMEDOUT an atomic group outlived its time limit and was committed as it stood
 *   ENOTTY  the descriptor is not on an Amaranth mount
 * A change inside an atomic group fails with EFBIG when the group would grow past its limit, and
 * with ETIMEDOUT after the group's time limit.
 *
 * Groups belong to the calling process, are shared by its threads, are inherited by the
 * processes it starts (seen by the file system after the group was made), and are disengaged and
 * dropped when the process exits.
 *
 * Setting AMARANTH_PG_TRACE=FILE logs every call (pid, call, arguments, result) to FILE.
 */
#ifndef AMARANTH_PG_H
#define AMARANTH_PG_H

#include <stdint.h>
#include <sys/ioctl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the ioctl interface (what the library wraps) ---- */

/* The argument of every patchgroup ioctl (fixed size: FUSE passes restricted ioctls only). */
struct amaranth_pg_args {
    uint64_t group; /* in: the group (create: out, the new group; sync: 0 = everything) */
    uint64_t other; /* in: depend: the group `group` depends on */
    uint32_t flags; /* in: create: 0 or AMARANTH_PG_ATOMIC */
    uint32_t zero;  /* must be 0 */
};

#define AMARANTH_PG_IOC_MAGIC 0xA7
#define AMARANTH_PG_IOC_CREATE _IOWR(AMARANTH_PG_IOC_MAGIC, 1, struct amaranth_pg_args)
#define AMARANTH_PG_IOC_DEPEND _IOWR(AMARANTH_PG_IOC_MAGIC, 2, struct amaranth_pg_args)
#define AMARANTH_PG_IOC_RELEASE _IOWR(AMARANTH_PG_IOC_MAGIC, 3, struct amaranth_pg_args)
#define AMARANTH_PG_IOC_ENGAGE _IOWR(AMARANTH_PG_IOC_MAGIC, 4, struct amaranth_pg_args)
#define AMARANTH_PG_IOC_DISENGAGE _IOWR(AMARANTH_PG_IOC_MAGIC, 5, struct amaranth_pg_args)
#define AMARANTH_PG_IOC_SYNC _IOWR(AMARANTH_PG_IOC_MAGIC, 6, struct amaranth_pg_args)
#define AMARANTH_PG_IOC_ABANDON _IOWR(AMARANTH_PG_IOC_MAGIC, 7, struct amaranth_pg_args)

#define AMARANTH_PG_ATOMIC 1

/* ---- the library ---- */

typedef int64_t amaranth_pg_t;

/* A descriptor to pass to the calls below: `path` is any file or directory on the mount (NULL:
 * $AMARANTH_PG_PATH, else the current directory). -1 with errno on failure. */
int amaranth_pg_open(const char *path);

/* A new group of this process (flags: 0 or AMARANTH_PG_ATOMIC). */
amaranth_pg_t amaranth_pg_create(int fd, int flags);
/* Every change of `before` reaches the disk before any change of `after`. `before` must be
 * engaged nowhere; `after` must not be released yet. `before` can never be engaged again. */
int amaranth_pg_add_depend(int fd, amaranth_pg_t after, amaranth_pg_t before);
/* No more befores for `g`; it may be engaged from now on. */
int amaranth_pg_release(int fd, amaranth_pg_t g);
/* Every change this process makes from now on joins `g` (until disengaged). An atomic group
 * may wait here while another process's atomic group is open. */
int amaranth_pg_engage(int fd, amaranth_pg_t g);
/* Stop adding changes to `g`; the last disengage of an atomic group commits it. */
int amaranth_pg_disengage(int fd, amaranth_pg_t g);
/* Returns once `g` and everything it depends on is on stable storage (`g` 0: everything). */
int amaranth_pg_sync(int fd, amaranth_pg_t g);
/* Drops this process's handle to `g` (its dependencies stay in force). */
int amaranth_pg_abandon(int fd, amaranth_pg_t g);

/* Featherstitch's linear helper: disengages and abandons `prev` (if > 0), and returns a new group
 * that depends on it, released and engaged. -1 with errno on failure. */
amaranth_pg_t amaranth_pg_linear(int fd, amaranth_pg_t prev);

#ifdef __cplusplus
}
#endif

#endif
