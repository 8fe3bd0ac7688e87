// The cost of waking a thread on this machine: two threads pass a byte
// back and forth over pipes (one round trip = two wake-ups), first
// wherever the scheduler puts them, then, run under `taskset -c 0`, on one
// CPU. On a VM whose idle vCPUs halt, a wake-up on another CPU costs an
// inter-processor interrupt through the hypervisor; BENCHMARKS.md ("A
// follower's commit on the next entries") compares the two.
//
//   cc -O2 -pthread scripts/wakeup-floor.c -o /tmp/wakeup-floor
//   /tmp/wakeup-floor; taskset -c 0 /tmp/wakeup-floor
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static int there[2], back[2];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *echo(void *arg) {
    char c;
    (void)arg;
    while (read(there[0], &c, 1) == 1)
        if (write(back[1], &c, 1) != 1)
            break;
    return NULL;
}

int main(void) {
    pthread_t t;
    char c = 0;
    const int n = 20000;
    if (pipe(there) || pipe(back) || pthread_create(&t, NULL, echo, NULL))
        return 1;
    double start = now();
    for (int i = 0; i < n; i++)
        if (write(there[1], &c, 1) != 1 || read(back[0], &c, 1) != 1)
            return 1;
    printf("pipe round trip between two threads: %.1f us\n", (now() - start) * 1e6 / n);
    return 0;
}
