// A plain C service with an epoll loop and no stallmon in it: what stallmond's tick watcher watches
// from outside in the tests. Its loop thread (named `epoll-loop`) waits in epoll_wait, 20 ms at a
// time, on its standard input; each line read there is one command, run inside the loop's tick:
//
//   spin MS    burns the CPU for MS milliseconds
//   sleep MS   sleeps MS milliseconds in nanosleep (blocked in a system call)
//   lock MS    waits MS milliseconds for a mutex another thread holds (blocked in futex)
//   spinsleep MS  a stall that moves on: burns the CPU for 200 ms (past a 100 ms threshold, where
//              it is first seen), then sleeps in nanosleep for the rest of MS
//   ticks N    N quick ticks of 200 us on the CPU each, between waits that return at once (a busy
//              server's loop: epoll_wait with a zero timeout, then the work it found)
//   die MS     burns the CPU for MS milliseconds, then ends the process inside that tick
//   quit       ends the process
//
// With `--io-uring` as its argument the loop (named `uring-loop`) waits in io_uring_enter instead,
// for a poll of its standard input (no 20 ms timeout: it sleeps until a command comes).
//
// Commands can also come as the one argument, `COMMAND:MS,COMMAND:MS,…` (a service under systemd
// has no input to read): run one per tick, the first two seconds after the start, then one every
// 600 ms; the process ends two seconds after the last.
//
// After each command it prints `done COMMAND MS TID START_NS END_NS CPU_NS`: the loop thread's TID,
// the CLOCK_MONOTONIC times its wait returned with the command and it was about to wait again, and
// the CPU time the thread took between the two (CLOCK_THREAD_CPUTIME_ID): the tick's truth to
// compare a report with. At start it prints `ready PID TID`.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static uint64_t clock_ns(clockid_t clock) {
    struct timespec now;
    clock_gettime(clock, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

static uint64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t handoff_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t handoff = PTHREAD_COND_INITIALIZER;
static int holding;

/// Holds `held` for the milliseconds it is given.
static void *hold(void *argument) {
    long milliseconds = (long)(intptr_t)argument;
    pthread_mutex_lock(&held);
    pthread_mutex_lock(&handoff_lock);
    holding = 1;
    pthread_cond_signal(&handoff);
    pthread_mutex_unlock(&handoff_lock);
    struct timespec pause = {milliseconds / 1000, (milliseconds % 1000) * 1000000};
    nanosleep(&pause, NULL);
    pthread_mutex_unlock(&held);
    return NULL;
}

static void spin_ns(uint64_t nanoseconds) {
    uint64_t end = now_ns() + nanoseconds;
    volatile uint64_t sum = 0;
    while (now_ns() < end) sum += 1;
}

static void run(int epoll, const char *command, long milliseconds) {
    if (strcmp(command, "spin") == 0) {
        spin_ns((uint64_t)milliseconds * 1000000u);
    } else if (strcmp(command, "die") == 0) {
        spin_ns((uint64_t)milliseconds * 1000000u);
        exit(0);
    } else if (strcmp(command, "ticks") == 0) {
        for (long tick = 0; tick < milliseconds; tick++) {
            struct epoll_event ready;
            epoll_wait(epoll, &ready, 1, 0);
            spin_ns(200000);
        }
    } else if (strcmp(command, "sleep") == 0) {
        struct timespec pause = {milliseconds / 1000, (milliseconds % 1000) * 1000000};
        while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {}
    } else if (strcmp(command, "spinsleep") == 0) {
        spin_ns(200000000u);
        long rest = milliseconds > 200 ? milliseconds - 200 : 0;
        struct timespec pause = {rest / 1000, (rest % 1000) * 1000000};
        while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {}
    } else if (strcmp(command, "lock") == 0) {
        // The holder takes the mutex first (the handoff), and the loop waits for it in futex.
        pthread_t holder;
        holding = 0;
        pthread_create(&holder, NULL, hold, (void *)(intptr_t)milliseconds);
        pthread_mutex_lock(&handoff_lock);
        while (!holding) pthread_cond_wait(&handoff, &handoff_lock);
        pthread_mutex_unlock(&handoff_lock);
        pthread_mutex_lock(&held);
        pthread_mutex_unlock(&held);
        pthread_join(holder, NULL);
    }
}

/// The commands of the argument, and when the next is due.
static char *script;
static uint64_t script_due;
/// When the process ends: two seconds after the last command, so that its last stall is seen
/// ending while it lives.
static uint64_t script_end;

/// Runs the argument's next command if it is due: 1 when one ran.
static int run_script(int epoll) {
    if (script_end && now_ns() >= script_end) exit(0);
    if (!script || !*script || now_ns() < script_due) return 0;
    uint64_t start = now_ns(), start_cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    char command[16] = "";
    long milliseconds = 0;
    sscanf(script, "%15[^:]:%ld", command, &milliseconds);
    char *comma = strchr(script, ',');
    script = comma ? comma + 1 : script + strlen(script);
    run(epoll, command, milliseconds);
    printf("done %s %ld %d %llu %llu %llu\n", command, milliseconds, gettid(), (unsigned long long)start,
           (unsigned long long)now_ns(), (unsigned long long)(clock_ns(CLOCK_THREAD_CPUTIME_ID) - start_cpu));
    fflush(stdout);
    script_due = now_ns() + 600000000u;
    if (!*script) script_end = now_ns() + 2000000000u;
    return 1;
}

/// An io_uring of its own, set up with the raw system calls (no liburing here).
static struct {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail;
    struct io_uring_sqe *sqes;
} uring = {.fd = -1};

static void uring_setup(void) {
    struct io_uring_params parameters;
    memset(&parameters, 0, sizeof parameters);
    uring.fd = (int)syscall(SYS_io_uring_setup, 4, &parameters);
    if (uring.fd < 0) {
        perror("io_uring_setup");
        exit(1);
    }
    size_t sq_size = parameters.sq_off.array + parameters.sq_entries * sizeof(unsigned);
    size_t cq_size = parameters.cq_off.cqes + parameters.cq_entries * sizeof(struct io_uring_cqe);
    char *sq = mmap(NULL, sq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, uring.fd, IORING_OFF_SQ_RING);
    char *cq = mmap(NULL, cq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, uring.fd, IORING_OFF_CQ_RING);
    uring.sqes = mmap(NULL, parameters.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_POPULATE, uring.fd, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || uring.sqes == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    uring.sq_tail = (unsigned *)(sq + parameters.sq_off.tail);
    uring.sq_mask = (unsigned *)(sq + parameters.sq_off.ring_mask);
    uring.sq_array = (unsigned *)(sq + parameters.sq_off.array);
    uring.cq_head = (unsigned *)(cq + parameters.cq_off.head);
    uring.cq_tail = (unsigned *)(cq + parameters.cq_off.tail);
}

/// Submits a poll of standard input and waits for it in one io_uring_enter, as a loop on io_uring
/// does; its completions are consumed.
static void uring_wait_for_input(void) {
    unsigned tail = *uring.sq_tail;
    unsigned index = tail & *uring.sq_mask;
    struct io_uring_sqe *entry = &uring.sqes[index];
    memset(entry, 0, sizeof *entry);
    entry->opcode = IORING_OP_POLL_ADD;
    entry->fd = 0;
    entry->poll32_events = POLLIN;
    uring.sq_array[index] = index;
    __atomic_store_n(uring.sq_tail, tail + 1, __ATOMIC_RELEASE);
    while (syscall(SYS_io_uring_enter, uring.fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0 && errno == EINTR) {}
    __atomic_store_n(uring.cq_head, __atomic_load_n(uring.cq_tail, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
}

static void *loop(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), uring.fd >= 0 ? "uring-loop" : "epoll-loop");
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = 0};
    // With a script, standard input is not read (a service's is /dev/null, which epoll refuses).
    if (epoll < 0 || (!script && epoll_ctl(epoll, EPOLL_CTL_ADD, 0, &event) != 0)) {
        perror("epoll");
        exit(1);
    }
    printf("ready %d %d\n", getpid(), gettid());
    fflush(stdout);
    char buffer[4096];
    size_t used = 0;
    for (;;) {
        struct epoll_event ready;
        int count = 1;
        if (uring.fd >= 0) {
            uring_wait_for_input();
        } else {
            count = epoll_wait(epoll, &ready, 1, 20);
        }
        uint64_t start = now_ns();
        uint64_t start_cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        if (count <= 0) {
            run_script(epoll);
            continue;
        }
        ssize_t length = read(0, buffer + used, sizeof buffer - 1 - used);
        if (length <= 0) exit(0);
        used += (size_t)length;
        buffer[used] = 0;
        char *line = buffer, *newline;
        while ((newline = strchr(line, '\n'))) {
            *newline = 0;
            char command[16] = "";
            long milliseconds = 0;
            sscanf(line, "%15s %ld", command, &milliseconds);
            if (strcmp(command, "quit") == 0) exit(0);
            run(epoll, command, milliseconds);
            printf("done %s %ld %d %llu %llu %llu\n", command, milliseconds, gettid(), (unsigned long long)start,
                   (unsigned long long)now_ns(), (unsigned long long)(clock_ns(CLOCK_THREAD_CPUTIME_ID) - start_cpu));
            fflush(stdout);
            line = newline + 1;
        }
        used = strlen(line);
        memmove(buffer, line, used);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--io-uring") == 0) {
        uring_setup();
    } else if (argc > 1) {
        script = argv[1];
        script_due = now_ns() + 2000000000u;
    }
    pthread_t thread;
    pthread_create(&thread, NULL, loop, NULL);
    pthread_join(thread, NULL);
    return 0;
}
