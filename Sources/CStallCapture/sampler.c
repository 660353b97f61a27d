// Sampling a thread's stack: the thread copies, the watchdog unwinds.
//
// The watchdog queues a signal to the stalled thread with rt_tgsigqueueinfo, carrying a slot index,
// the thread's entry in the slot and a generation. The handler runs no unwinder and takes no lock:
// it claims the slot with one compare-and-swap over generation and state, copies the interrupted
// registers and a bounded window of the stack into the slot (one pread of /proc/self/mem, which the
// kernel copies from mapped memory only: an address past the stack's mapping ends the copy, never
// faults), and posts a semaphore. The watchdog then unwinds the copy with libunwind's remote
// interface (remote_unwind.c), over a module table read from /proc/self/maps (modules.c): nothing
// on either side calls dl_iterate_phdr or takes the dynamic loader's lock, so a thread interrupted
// inside dlopen, dlclose or a C++ throw cannot wedge itself or the watchdog.
//
// The window starts at the interrupted sp and ends at the thread's stack top where that is known
// before any signal (glibc places a thread's descriptor, pthread_self(), above its stack; the main
// thread's stack ends at __libc_stack_end), and at most STACK_WINDOW bytes above sp.
//
// The watchdog waits for the post with a timeout; when it gives up it abandons the request with a
// compare-and-swap on the same word, so a handler that runs late finds nothing to write into, and
// a later request (another generation, perhaps for another thread) is never answered by it. Signals
// sent and taken are counted per thread: a thread that has not taken its last signal (it blocks the
// signal, or is stopped) gets no new one, so real-time signals never pile up in its queue. The
// kernel is asked before that refusal stands: a signal no longer pending for the thread (its
// SigPnd) went elsewhere, to a handler the program put in and took out again or to a sanitizer
// that keeps one per number, and is not waited for again: the thread is signalled afresh.
//
// A signal handler ends some system calls with EINTR whatever SA_RESTART says (nanosleep, poll,
// epoll_wait, select, timed waits: signal(7)). So a thread that /proc/self/task/<tid>/syscall shows
// inside a system call is not signalled: blocked.c unwinds it in place (remote_unwind.c) from the
// stack pointer and program counter the kernel shows. And the signal is sent only while its disposition
// is still stallmon's handler, checked just before each send: a program that reset it to SIG_DFL
// would be killed by it, one that ignores it or handles it itself would lose it or run its own code.

#define _GNU_SOURCE
#include "stallcapture.h"
#include "stallcapture_threadview.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <ucontext.h>

#include "blocked.h"
#include "perf.h"
#include "requests.h"
#include "sampler.h"
#include "unwind.h"

enum { SLOT_COUNT = 32 };

/// The most of a stack a handler copies above the interrupted sp. Deeper stacks are reported
/// truncated; a Swift or C frame is rarely over 200 bytes, async functions keep theirs on the heap.
enum { STACK_WINDOW = 32 * 1024 };

// The low byte of a slot's word; the generation of the request is the rest.
enum {
    SLOT_FREE = 0,      // not claimed by any monitor
    SLOT_IDLE = 1,      // claimed, no request outstanding
    SLOT_REQUESTED = 2, // signal sent, handler not yet run
    SLOT_WRITING = 3,   // handler is copying into it
    SLOT_DONE = 4,      // handler finished
    SLOT_ABANDONED = 5, // watchdog stopped waiting
};

static inline uint64_t slot_word(uint64_t generation, int state) { return (generation << 8) | (uint64_t)state; }
static inline int word_state(uint64_t word) { return (int)(word & 0xff); }

/// Threads of one slot with an entry of their own: the loops of a large event loop group.
enum { SIGNALLED_COUNT = 64 };

/// Perf events one slot (one watchdog) holds at once: threads stalled at the same time.
enum { PERF_EVENTS_PER_SLOT = 4 };

/// The signals one thread was sent and took, by the generation of the request each carried: the
/// thread still has one pending while `sent` is greater than `taken`.
typedef struct {
    _Atomic pid_t tid;
    _Atomic uint64_t sent;
    _Atomic uint64_t taken;
} signalled_t;

typedef struct {
    // Generation and state (slot_word): a handler claims the request it was sent for, or nothing.
    _Atomic uint64_t word;
    uint64_t generation;  // the latest request's, owned by the slot's watchdog; never reset
    _Atomic pid_t target;
    // Set when a handler that claimed the slot never finished (see stallmon_sample_stack).
    _Atomic int broken;
    signalled_t signalled[SIGNALLED_COUNT];
    unsigned signalled_next;  // the entry a thread not yet in the table may replace
    // Written by the handler that claimed the request.
    pid_t writer;
    uintptr_t task;  // the Swift task the thread ran (swift_task_getCurrent), 0 outside a task
    uint32_t task_id;  // its ID, read while it surely lived: it ran on this thread
    uint64_t enter_ns;
    uint64_t exit_ns;
    stallmon_captured_registers registers;
    uintptr_t stack_limit;
    ssize_t stack_length;
    sem_t done;
    int prepared;  // its semaphore and perf events are set up (at its first claim)
    // The threads it samples as seen in and out of system calls (blocked.c), owned by the watchdog.
    stallmon_blocked_state blocked;
    // Perf events on stalled threads (perf.c), owned by the watchdog.
    stallmon_perf_event perf[PERF_EVENTS_PER_SLOT];
    uint64_t perf_period_ns;
    // The large buffers last: a slot no monitor claimed stays untouched, zero pages in no one's RSS.
    unsigned char stack[STACK_WINDOW];
    unsigned char perf_record[STALLMON_PERF_RECORD_CAPACITY];  // the newest record, copied out of its ring
} slot_t;

static slot_t slots[SLOT_COUNT];
static _Atomic int slots_initialized;
static _Atomic uint64_t test_handler_delay_ns;
static _Atomic uint64_t handler_runs;
static _Atomic int perf_open_count;

static inline uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

// The top of the main thread's stack as the program started (exported by the dynamic loader).
extern void *__libc_stack_end;

/// The address below which the interrupted thread's stack ends, from `sp`: known without reading
/// any memory but the thread's own descriptor.
static uintptr_t stack_limit(uintptr_t sp) {
    uintptr_t main_top = (uintptr_t)__libc_stack_end;
    // Above __libc_stack_end lie only _start's arguments and the environment.
    if (main_top != 0 && sp < main_top && main_top - sp <= (64u << 20)) return main_top + 256;
    // glibc puts a thread's descriptor at the top of the stack block it allocated (or was given).
    uintptr_t self = (uintptr_t)pthread_self();
    if (sp < self && self - sp <= (1u << 30)) return self;
    return sp + STACK_WINDOW;
}

static void copy_registers(const ucontext_t *uc, stallmon_captured_registers *out) {
#if defined(__x86_64__)
    static const int order[STALLMON_CAPTURED_REGISTER_COUNT] = {
        REG_RAX, REG_RDX, REG_RCX, REG_RBX, REG_RSI, REG_RDI, REG_RBP, REG_RSP, REG_R8,
        REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15, REG_RIP,
    };
    for (int i = 0; i < STALLMON_CAPTURED_REGISTER_COUNT; i++) out->values[i] = (uintptr_t)uc->uc_mcontext.gregs[order[i]];
#else
    // Only x86-64's registers are mapped so far: the unwind reports no stack elsewhere.
    (void)uc;
    memset(out, 0, sizeof *out);
#endif
}

/// Notes that the thread of `entry` took the signal of request `generation`.
static void note_taken(signalled_t *entry, uint64_t generation) {
    uint64_t taken = atomic_load_explicit(&entry->taken, memory_order_relaxed);
    while (taken < generation &&
           !atomic_compare_exchange_weak_explicit(&entry->taken, &taken, generation, memory_order_release,
                                                  memory_order_relaxed)) {
    }
}

void stallmon_sample_handler(int signo, siginfo_t *info, void *context) {
    (void)signo;
    int saved_errno = errno;
    atomic_fetch_add_explicit(&handler_runs, 1, memory_order_relaxed);
    if (info == NULL || info->si_code != SI_QUEUE || info->si_pid != getpid()) goto out;

    uint64_t token = (uint64_t)(uintptr_t)info->si_value.sival_ptr;
    unsigned index = (unsigned)(token & 0xff);
    unsigned entry = (unsigned)((token >> 8) & 0xff);
    uint64_t generation = token >> 16;
    if (index >= SLOT_COUNT || entry >= SIGNALLED_COUNT) goto out;
    slot_t *slot = &slots[index];
    note_taken(&slot->signalled[entry], generation);
    uint64_t requested = slot_word(generation, SLOT_REQUESTED);
    if (atomic_load_explicit(&slot->word, memory_order_acquire) != requested) goto out;
    pid_t self = (pid_t)syscall(SYS_gettid);
    if (atomic_load_explicit(&slot->target, memory_order_relaxed) != self) goto out;
    uint64_t delay = atomic_load_explicit(&test_handler_delay_ns, memory_order_relaxed);
    if (__builtin_expect(delay != 0, 0)) {
        // Tests only: a handler that runs late, between its checks and its claim.
        uint64_t until = monotonic_ns() + delay;
        while (monotonic_ns() < until) {}
    }
    // The one claim: this request's generation, still requested. A late handler of an earlier
    // request, for this thread or another, finds another word and writes nothing.
    uint64_t expected = requested;
    if (!atomic_compare_exchange_strong_explicit(&slot->word, &expected, slot_word(generation, SLOT_WRITING),
                                                 memory_order_acquire, memory_order_relaxed))
        goto out;

    slot->enter_ns = monotonic_ns();
    slot->writer = self;
    copy_registers(context, &slot->registers);
    uintptr_t sp = slot->registers.values[STALLMON_CAPTURED_SP];
    uintptr_t limit = stack_limit(sp);
    size_t length = limit - sp < STACK_WINDOW ? (size_t)(limit - sp) : STACK_WINDOW;
    slot->stack_limit = limit;
    slot->stack_length = stallmon_memory_read(slot->stack, length, sp);
    // A thread-local load in the Swift runtime: which request the interrupted work serves.
    void *task = swift_task_getCurrent != NULL ? swift_task_getCurrent() : NULL;
    slot->task = (uintptr_t)task;
    slot->task_id = task != NULL ? stallmon_live_task_id(task) : 0;
    slot->exit_ns = monotonic_ns();
    atomic_store_explicit(&slot->word, slot_word(generation, SLOT_DONE), memory_order_release);
    sem_post(&slot->done);
out:
    errno = saved_errno;
}

void stallmon_sampler_set_test_delay(uint64_t nanoseconds) {
    atomic_store_explicit(&test_handler_delay_ns, nanoseconds, memory_order_relaxed);
}

// A child of fork() inherits the descriptors and rings of the parent's perf events, which sample the
// parent's threads: it lets them go.
static void sampler_child(void) {
    if (atomic_load(&slots_initialized) != 2) return;
    for (int i = 0; i < SLOT_COUNT; i++) {
        if (!slots[i].prepared) continue;
        for (int j = 0; j < PERF_EVENTS_PER_SLOT; j++) {
            if (slots[i].perf[j].descriptor >= 0) stallmon_perf_event_close(&slots[i].perf[j]);
        }
    }
    atomic_store(&perf_open_count, 0);
}

void stallmon_sampler_initialize(void) {
    int expected = 0;
    if (atomic_load(&slots_initialized) == 2) return;
    if (atomic_compare_exchange_strong(&slots_initialized, &expected, 1)) {
        // The slots' words, targets and flags start as the zeros of static storage (SLOT_FREE);
        // each slot's semaphore and perf events are set up at its first claim.
        stallmon_unwind_register_fork_handlers();
        pthread_atfork(NULL, NULL, sampler_child);
        atomic_store(&slots_initialized, 2);
    } else {
        while (atomic_load(&slots_initialized) != 2) sched_yield();
    }
}

int stallmon_sampler_slot_claim(void) {
    stallmon_sampler_initialize();
    for (int i = 0; i < SLOT_COUNT; i++) {
        if (atomic_load(&slots[i].broken)) continue;
        uint64_t expected = atomic_load(&slots[i].word);
        if (word_state(expected) != SLOT_FREE) continue;
        if (atomic_compare_exchange_strong(&slots[i].word, &expected,
                                           slot_word(expected >> 8, SLOT_IDLE))) {
            slots[i].generation = expected >> 8;
            if (!slots[i].prepared) {
                sem_init(&slots[i].done, 0, 0);
                for (int j = 0; j < PERF_EVENTS_PER_SLOT; j++) stallmon_perf_event_init(&slots[i].perf[j]);
                slots[i].perf_period_ns = 20000000;
                slots[i].prepared = 1;
            }
            return i;
        }
    }
    return -1;
}

/// Waits up to `timeout_ns` for the slot to leave SLOT_WRITING; returns 0 when it did.
static int wait_for_writer(slot_t *slot, uint64_t timeout_ns) {
    uint64_t deadline = monotonic_ns() + timeout_ns;
    while (word_state(atomic_load(&slot->word)) == SLOT_WRITING) {
        if (monotonic_ns() >= deadline) return -1;
        sched_yield();
    }
    return 0;
}

void stallmon_sampler_slot_release(int index) {
    if (index < 0 || index >= SLOT_COUNT) return;
    slot_t *slot = &slots[index];
    // A request still outstanding is abandoned first, so a late handler writes nothing.
    uint64_t expected = slot_word(slot->generation, SLOT_REQUESTED);
    atomic_compare_exchange_strong(&slot->word, &expected, slot_word(slot->generation, SLOT_ABANDONED));
    if (atomic_load(&slot->broken)) return;  // a handler is stuck in it: never reuse it
    if (wait_for_writer(slot, 1000000000ULL) != 0) {
        atomic_store(&slot->broken, 1);
        return;
    }
    while (sem_trywait(&slot->done) == 0) {}
    for (int i = 0; i < PERF_EVENTS_PER_SLOT; i++) {
        if (slot->perf[i].descriptor >= 0) {
            stallmon_perf_event_close(&slot->perf[i]);
            atomic_fetch_sub(&perf_open_count, 1);
        }
    }
    stallmon_blocked_forget(&slot->blocked);
    atomic_store(&slot->word, slot_word(slot->generation, SLOT_FREE));
}

static int wait_until(sem_t *semaphore, uint64_t deadline_ns) {
    struct timespec deadline = {
        .tv_sec = (time_t)(deadline_ns / 1000000000ULL),
        .tv_nsec = (long)(deadline_ns % 1000000000ULL),
    };
    for (;;) {
        if (sem_clockwait(semaphore, CLOCK_MONOTONIC, &deadline) == 0) return 0;
        if (errno == EINTR) continue;
        return -1;
    }
}

static int signal_still_pending(pid_t tid, int signo);

/// The thread's entry in the slot's table of signals, or -1 when it has not taken its last signal
/// (or no entry can be had: every one is held by a live thread with a signal pending).
static int signal_entry(slot_t *slot, pid_t tid, int signo, int *pending) {
    *pending = 0;
    for (int i = 0; i < SIGNALLED_COUNT; i++) {
        signalled_t *entry = &slot->signalled[i];
        if (atomic_load(&entry->tid) != tid) continue;
        if (atomic_load(&entry->sent) > atomic_load_explicit(&entry->taken, memory_order_acquire)) {
            if (stallmon_thread_exists(tid) && signal_still_pending(tid, signo) != 0) {
                *pending = 1;
                return -1;
            }
            // A thread that exited with the signal pending took it with it (the id is new), and
            // a signal the thread no longer has pending was taken by something else: the entry
            // starts again.
            atomic_store(&entry->taken, atomic_load(&entry->sent));
        }
        return i;
    }
    // A thread not in the table takes the next entry with no signal pending, or the entry of a
    // thread that has exited.
    for (int pass = 0; pass < 2; pass++) {
        for (int n = 0; n < SIGNALLED_COUNT; n++) {
            unsigned i = (slot->signalled_next + (unsigned)n) % SIGNALLED_COUNT;
            signalled_t *entry = &slot->signalled[i];
            pid_t holder = atomic_load(&entry->tid);
            int outstanding = atomic_load(&entry->sent) > atomic_load_explicit(&entry->taken, memory_order_acquire);
            if (outstanding && (pass == 0 || holder == 0 || stallmon_thread_exists(holder))) continue;
            atomic_store(&entry->taken, atomic_load(&entry->sent));
            atomic_store(&entry->tid, tid);
            slot->signalled_next = i + 1;
            return (int)i;
        }
    }
    return -1;
}

// MARK: - The kernel's view of a stalled thread (its /proc files, read and parsed by threadview.c)

/// Whether signal `signo` is pending for thread `tid` (its bit in SigPnd, the thread's own queue,
/// where rt_tgsigqueueinfo puts it): 1 or 0, or -1 when that cannot be read (then it is taken as
/// pending: no signal is added to a queue that cannot be seen).
static int signal_still_pending(pid_t tid, int signo) {
    uint64_t mask;
    if (stallmon_read_status_field(tid, "SigPnd", 16, &mask) != 1) return -1;
    return (mask >> (signo - 1)) & 1ULL ? 1 : 0;
}

void stallmon_sampler_note_running(int index, pid_t tid) {
    if (index < 0 || index >= SLOT_COUNT) return;
    stallmon_blocked_note_running(&slots[index].blocked, tid);
}

// MARK: - Perf events

uint64_t stallmon_sampler_handler_runs(void) { return atomic_load_explicit(&handler_runs, memory_order_relaxed); }
int stallmon_perf_open_count(void) { return atomic_load(&perf_open_count); }

void stallmon_sampler_set_perf_period(int index, uint64_t nanoseconds) {
    if (index < 0 || index >= SLOT_COUNT || nanoseconds == 0) return;
    slots[index].perf_period_ns = nanoseconds;
}

void stallmon_perf_close_thread(int index, pid_t tid) {
    if (index < 0 || index >= SLOT_COUNT) return;
    slot_t *slot = &slots[index];
    for (int i = 0; i < PERF_EVENTS_PER_SLOT; i++) {
        if (slot->perf[i].descriptor >= 0 && slot->perf[i].tid == tid) {
            stallmon_perf_event_close(&slot->perf[i]);
            atomic_fetch_sub(&perf_open_count, 1);
        }
    }
}

/// The slot's perf event on `tid`, opened now if it has none; NULL when the kernel refuses, the
/// thread is gone, or the slot holds as many events as it may.
static stallmon_perf_event *perf_event_for(slot_t *slot, pid_t tid, int forced) {
    stallmon_perf_event *free_event = NULL;
    for (int i = 0; i < PERF_EVENTS_PER_SLOT; i++) {
        if (slot->perf[i].descriptor >= 0 && slot->perf[i].tid == tid) return &slot->perf[i];
        if (slot->perf[i].descriptor < 0 && free_event == NULL) free_event = &slot->perf[i];
    }
    if (free_event == NULL || stallmon_perf_event_open(free_event, tid, slot->perf_period_ns, forced) != 0) {
        return NULL;
    }
    atomic_fetch_add(&perf_open_count, 1);
    return free_event;
}

// MARK: - Sampling

void stallmon_sample_thread(int index, pid_t tid, int signo, int max_frames, uint64_t timeout_ns,
                            stallmon_sample *out) {
    stallmon_sample_stack(index, tid, signo, max_frames, timeout_ns, 0, out);
}

/// Unwinds what the handler copied into the slot (the slot is the watchdog's until it goes idle).
static void unwind_copy(slot_t *slot, int max_frames, stallmon_sample *out) {
    out->source = STALLMON_STACK_SIGNAL;
    out->handler_enter_ns = slot->enter_ns;
    out->handler_exit_ns = slot->exit_ns;
    out->sampled_tid = slot->writer;
    out->current_task = slot->task;
    out->current_task_id = slot->task_id;
    out->stack_bytes = slot->stack_length > 0 ? (int)slot->stack_length : 0;
    out->interrupted_syscall = stallmon_interrupted_system_call(&slot->registers);
    int count = 0, truncated = 0;
    int rc = stallmon_unwind_copied(&slot->registers, slot->stack, (size_t)out->stack_bytes, slot->stack_limit,
                                    max_frames, out->frames, &count, &truncated);
    if (rc != 0) {
        out->status = STALLMON_SAMPLE_UNWIND_FAILED;
        out->error = rc;
        out->frame_count = 0;
        return;
    }
    out->status = STALLMON_SAMPLE_OK;
    out->frame_count = count;
    out->truncated = truncated;
}

void stallmon_sample_stack(int index, pid_t tid, int signo, int max_frames, uint64_t timeout_ns, int flags,
                           stallmon_sample *out) {
    memset(out, 0, offsetof(stallmon_sample, frames));
    out->syscall = -1;
    if (index < 0 || index >= SLOT_COUNT) {
        out->status = STALLMON_SAMPLE_NO_SLOT;
        return;
    }
    slot_t *slot = &slots[index];
    if (max_frames <= 0 || max_frames > STALLMON_MAX_FRAMES) max_frames = STALLMON_MAX_FRAMES;
    long view[9];

    // A perf event takes a running thread's stack with no signal; a thread blocked in a system
    // call is unwound in place, as ever.
    int spare = (flags & STALLMON_SAMPLE_SPARE_SYSCALLS) != 0;
    if (flags & (STALLMON_SAMPLE_PERF | STALLMON_SAMPLE_PERF_ONLY)) {
        int state = stallmon_read_syscall_view(tid, view);
        if (state == 1 && (spare || (flags & STALLMON_SAMPLE_PERF_ONLY))) {
            out->disposition = STALLMON_DISPOSITION_OURS;
            stallmon_blocked_sample(&slot->blocked, tid, view, max_frames, out);
            return;
        }
        if (state != 1) {
            stallmon_perf_event *event = perf_event_for(slot, tid, (flags & STALLMON_SAMPLE_PERF_ONLY) != 0);
            if (event != NULL) {
                out->disposition = STALLMON_DISPOSITION_OURS;
                stallmon_perf_event_sample(event, slot->perf_record, sizeof slot->perf_record, max_frames, timeout_ns,
                                           out);
                return;
            }
            if (flags & STALLMON_SAMPLE_PERF_ONLY) {
                out->status = STALLMON_SAMPLE_PERF_REFUSED;
                out->error = stallmon_perf_refusal(NULL);
                return;
            }
        }
        // Refused by the kernel: the signal, as without perf events.
    }

    // A signal the program took over is never sent: SIG_DFL would kill it, SIG_IGN drops it, and
    // a handler of its own would run its code. A thread blocked in a system call can still be
    // unwound in place.
    out->disposition = (flags & STALLMON_SAMPLE_NO_SIGNAL) ? STALLMON_DISPOSITION_OURS
                                                             : stallmon_signal_disposition(signo);
    if ((flags & STALLMON_SAMPLE_NO_SIGNAL) || out->disposition != STALLMON_DISPOSITION_OURS) {
        if (stallmon_read_syscall_view(tid, view) == 1) {
            stallmon_blocked_sample(&slot->blocked, tid, view, max_frames, out);
        } else {
            out->status = STALLMON_SAMPLE_SIGNAL_TAKEN;
        }
        return;
    }
    if (atomic_load(&slot->broken)) {
        if (spare && stallmon_read_syscall_view(tid, view) == 1) {
            stallmon_blocked_sample(&slot->blocked, tid, view, max_frames, out);
            return;
        }
        out->status = STALLMON_SAMPLE_TIMEOUT;
        out->error = EDEADLK;
        return;
    }
    // The handler copies through /proc/self/mem: a program that closed the descriptor gets a new one.
    if (stallmon_memory_open() < 0) {
        out->status = STALLMON_SAMPLE_SEND_FAILED;
        out->error = EACCES;
        return;
    }
    int pending = 0;
    int entry = signal_entry(slot, tid, signo, &pending);
    if (entry < 0) {
        // The thread has not taken its last signal: it blocks the signal, is stopped, or has not
        // run since. Another would only wait in its queue beside the first.
        if (spare && stallmon_read_syscall_view(tid, view) == 1) {
            stallmon_blocked_sample(&slot->blocked, tid, view, max_frames, out);
            return;
        }
        out->status = STALLMON_SAMPLE_TIMEOUT;
        out->error = pending ? EAGAIN : ENOSPC;
        return;
    }

    uint64_t generation = ++slot->generation;
    atomic_store_explicit(&slot->target, tid, memory_order_relaxed);
    atomic_store_explicit(&slot->word, slot_word(generation, SLOT_REQUESTED), memory_order_release);

    siginfo_t info;
    memset(&info, 0, sizeof info);
    info.si_signo = signo;
    info.si_code = SI_QUEUE;
    info.si_pid = getpid();
    info.si_uid = getuid();
    info.si_value.sival_ptr = (void *)(uintptr_t)((generation << 16) | ((uint64_t)entry << 8) | (uint64_t)index);

    // A thread that keeps blocking in system calls is not signalled, and the last look comes as
    // close to the signal as it can: a thread in a system call is unwound in place instead. What
    // remains is a thread that ran without blocking since the previous look (or through a 200 µs
    // watch) and enters a system call within the next few microseconds; the handler's registers
    // then show that it ended it (`interrupted_syscall`).
    if (spare) {
        int verdict = stallmon_blocked_may_signal(&slot->blocked, tid, view);
        if (verdict != 1) {
            atomic_store(&slot->word, slot_word(generation, SLOT_IDLE));
            if (verdict == 2) {
                stallmon_blocked_sample(&slot->blocked, tid, view, max_frames, out);
            } else {
                out->status = STALLMON_SAMPLE_SYSCALL_BUSY;
            }
            return;
        }
    }
    // The disposition again, just before the send: the program may have taken the signal over
    // while the thread was looked at.
    out->disposition = stallmon_signal_disposition(signo);
    if (out->disposition != STALLMON_DISPOSITION_OURS) {
        atomic_store(&slot->word, slot_word(generation, SLOT_IDLE));
        out->status = STALLMON_SAMPLE_SIGNAL_TAKEN;
        return;
    }
    signalled_t *signalled = &slot->signalled[entry];
    uint64_t previous = atomic_load(&signalled->sent);
    atomic_store(&signalled->sent, generation);
    out->requested_ns = monotonic_ns();
    if (syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, signo, &info) != 0) {
        out->status = STALLMON_SAMPLE_SEND_FAILED;
        out->error = errno;
        atomic_store(&signalled->sent, previous);
        atomic_store(&slot->word, slot_word(generation, SLOT_IDLE));
        return;
    }

    if (wait_until(&slot->done, out->requested_ns + timeout_ns) != 0) {
        uint64_t expected = slot_word(generation, SLOT_REQUESTED);
        if (atomic_compare_exchange_strong(&slot->word, &expected, slot_word(generation, SLOT_ABANDONED))) {
            out->status = STALLMON_SAMPLE_TIMEOUT;
            atomic_store(&slot->word, slot_word(generation, SLOT_IDLE));
            return;
        }
        // The handler claimed the request just in time: it is copying and will post shortly. It
        // takes no lock, but a thread stopped inside it (SIGSTOP) would not finish: even this wait
        // is bounded, and a slot whose handler never finishes is never used again.
        if (wait_until(&slot->done, monotonic_ns() + 1000000000ULL) != 0) {
            atomic_store(&slot->broken, 1);
            out->status = STALLMON_SAMPLE_TIMEOUT;
            out->error = EDEADLK;
            return;
        }
    }
    // One acquire load says what the post already ordered (sem_clockwait is a synchronization
    // point that ThreadSanitizer does not see): the handler's writes happened before.
    (void)atomic_load_explicit(&slot->word, memory_order_acquire);
    unwind_copy(slot, max_frames, out);
    atomic_store(&slot->word, slot_word(generation, SLOT_IDLE));
}

#endif  // STALLMON_LINUX
