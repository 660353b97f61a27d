// What the watchdogs, the sampler and the reporting thread read of threads and clocks: the
// monotonic and boot clocks, a thread's id, name, timer slack and CPU clock, the real-time signal
// range, and the signal mask the monitor's own threads are made with. None of it runs on a watched
// loop's hot path.

#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

static inline uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

uint64_t stallmon_now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
uint64_t stallmon_boottime_ns(void) { return clock_ns(CLOCK_BOOTTIME); }
pid_t stallmon_gettid(void) { return (pid_t)syscall(SYS_gettid); }

void stallmon_set_timer_slack(unsigned long nanoseconds) { prctl(PR_SET_TIMERSLACK, nanoseconds, 0, 0, 0); }
void stallmon_set_thread_name(const char *name) { prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0); }

int64_t stallmon_thread_cpu_ns(pid_t tid) {
    // The kernel's per-thread CPU clock id (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)):
    // valid for any thread of the calling process.
    clockid_t clock = (clockid_t)((~(unsigned)tid << 3) | 4 | 2);
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/// Every asynchronous signal: all but SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS and SIGABRT,
/// which stay deliverable (a fault in the monitor's own code is still the program's crash).
static void async_signals(sigset_t *set) {
    sigfillset(set);
    static const int synchronous[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t i = 0; i < sizeof synchronous / sizeof synchronous[0]; i++) sigdelset(set, synchronous[i]);
}

// glibc 2.32 and later: the new thread's mask, set by pthread_create itself.
extern int pthread_attr_setsigmask_np(pthread_attr_t *attr, const sigset_t *sigmask) __attribute__((weak));

typedef struct {
    void (*body)(void *);
    void *context;
    char name[16];
    int block_first;  // the mask could not be set by pthread_create
} thread_start;

static void *run_thread(void *argument) {
    thread_start start = *(thread_start *)argument;
    free(argument);
    if (start.block_first) {
        sigset_t set;
        async_signals(&set);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
    }
    prctl(PR_SET_NAME, (unsigned long)start.name, 0, 0, 0);
    start.body(start.context);
    return NULL;
}

int stallmon_thread_spawn(const char *name, size_t stack_size, void (*body)(void *), void *context) {
    thread_start *start = calloc(1, sizeof *start);
    if (start == NULL) return ENOMEM;
    start->body = body;
    start->context = context;
    strncpy(start->name, name, sizeof start->name - 1);
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    if (stack_size > 0) pthread_attr_setstacksize(&attributes, stack_size);
    sigset_t set;
    async_signals(&set);
    start->block_first = pthread_attr_setsigmask_np == NULL || pthread_attr_setsigmask_np(&attributes, &set) != 0;
    pthread_t thread;
    int rc = pthread_create(&thread, &attributes, run_thread, start);
    pthread_attr_destroy(&attributes);
    if (rc != 0) free(start);
    return rc;
}

int stallmon_sigrtmin(void) { return SIGRTMIN; }
int stallmon_sigrtmax(void) { return SIGRTMAX; }

#endif  // STALLMON_LINUX
