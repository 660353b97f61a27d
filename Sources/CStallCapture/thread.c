// What the watchdogs, the sampler and the reporting thread read of threads and clocks: the
// monotonic and boot clocks, a thread's id, name, timer slack and CPU clock, and the real-time
// signal range. None of it runs on a watched loop's hot path.

#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <signal.h>
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

int stallmon_sigrtmin(void) { return SIGRTMIN; }
int stallmon_sigrtmax(void) { return SIGRTMAX; }

#endif  // STALLMON_LINUX
