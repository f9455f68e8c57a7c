/* What a wake-up across CPUs costs on this machine, without FUSE: two threads pass a turn back and
 * forth through a futex, each pinned (to CPUs 0 and 1, or both to CPU 0 with `local`), and every round
 * trip (two wake-ups) is timed. Every 100 round trips the caller sleeps 50 µs, as a program between
 * calls would, so that an idle CPU may halt. With `spin`, a SCHED_IDLE thread spins on each CPU (it
 * keeps the CPU out of its idle loop, yet any woken task preempts it).
 *
 *   gcc -O2 -pthread -o /tmp/wakeup bench/tools/wakeup.c
 *   /tmp/wakeup [cross|local] [spin] [ROUND_TRIPS]
 *
 * Prints the round trip's median, 90th and 99th percentiles and mean in µs. docs/BENCHMARKS.md,
 * "An idle vCPU's wake-up", has what it measured with idle vCPUs halting at once and polling first
 * (/sys/module/haltpoll/parameters/guest_halt_poll_ns). */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic int turn; /* 0: the caller's turn, 1: the server's */
static _Atomic int stop_spinning;
static int rounds = 20000;
static int server_cpu = 1;

static void wait_while(_Atomic int *a, int v) {
    while (atomic_load(a) == v)
        syscall(SYS_futex, a, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}
static void wake(_Atomic int *a) { syscall(SYS_futex, a, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0); }
static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (pthread_setaffinity_np(pthread_self(), sizeof s, &s) != 0) {
        fprintf(stderr, "cannot pin to CPU %d\n", cpu);
        exit(1);
    }
}
static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *server(void *arg) {
    (void)arg;
    pin(server_cpu);
    for (int i = 0; i < rounds; i++) {
        wait_while(&turn, 0);
        atomic_store(&turn, 0);
        wake(&turn);
    }
    return NULL;
}

static void *spinner(void *arg) {
    pin((int)(intptr_t)arg);
    struct sched_param p = {0};
    if (sched_setscheduler(0, SCHED_IDLE, &p) != 0)
        perror("SCHED_IDLE");
    while (!atomic_load(&stop_spinning))
        __builtin_ia32_pause();
    return NULL;
}

int main(int argc, char **argv) {
    int spin = 0;
    const char *mode = "cross";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "local")) {
            server_cpu = 0;
            mode = "local";
        } else if (!strcmp(argv[i], "cross")) {
            server_cpu = 1;
        } else if (!strcmp(argv[i], "spin")) {
            spin = 1;
        } else if (atoi(argv[i]) > 0) {
            rounds = atoi(argv[i]);
        } else {
            fprintf(stderr, "usage: %s [cross|local] [spin] [ROUND_TRIPS]\n", argv[0]);
            return 2;
        }
    }
    pthread_t spinners[2], t;
    if (spin)
        for (int c = 0; c < 2; c++)
            pthread_create(&spinners[c], NULL, spinner, (void *)(intptr_t)c);
    pin(0);
    double *lat = malloc(sizeof(double) * rounds);
    if (!lat)
        return 1;
    pthread_create(&t, NULL, server, NULL);
    usleep(1000);
    for (int i = 0; i < rounds; i++) {
        double t0 = now_ns();
        atomic_store(&turn, 1);
        wake(&turn);
        wait_while(&turn, 1);
        lat[i] = now_ns() - t0;
        if (i % 100 == 99)
            usleep(50);
    }
    pthread_join(t, NULL);
    atomic_store(&stop_spinning, 1);
    if (spin)
        for (int c = 0; c < 2; c++)
            pthread_join(spinners[c], NULL);
    qsort(lat, rounds, sizeof(double), by_value);
    double sum = 0;
    for (int i = 0; i < rounds; i++)
        sum += lat[i];
    printf("%s%s: round trip µs median %.1f p90 %.1f p99 %.1f mean %.1f (%d round trips)\n", mode,
           spin ? " spin" : "", lat[rounds / 2] / 1e3, lat[rounds * 9 / 10] / 1e3,
           lat[rounds * 99 / 100] / 1e3, sum / rounds / 1e3, rounds);
    free(lat);
    return 0;
}
