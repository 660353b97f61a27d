// Swift's cooperative pool: the global concurrent executor's jobs, timed on the threads that run them.
//
// On Linux the runtime enqueues a global job with dispatch_async_f(queue, job, __swift_run_job),
// where `queue` is one of its own concurrent queues ("Swift global concurrent queue", one per
// priority, as wide as the machine has CPUs) and __swift_run_job calls the job's invoke function
// from its class metadata. Nothing is called when a job starts or ends. swift_task_enqueueGlobal_hook
// (a data symbol of libswift_Concurrency.so) replaces the enqueue: the hook here makes the same
// dispatch_async_f call on the same queue, with a trampoline in place of __swift_run_job that stamps
// the start and end of the job into its thread's slot around the same invoke call. The queue, and
// so the QoS, the width and the threads, are the runtime's; only the function differs.
//
// The queue of each priority is learned from inside a job of that priority running on it
// (stallmon_pool_learn_queue, called by probe tasks before the hook is set): the runtime keeps its
// queues to itself. A job whose priority's queue is unknown goes to the runtime's own enqueue,
// untimed (counted). A queue with another label means another global executor is installed: it is
// not learned, and its jobs keep going to the runtime.
//
// The runtime is asked, not assumed. The same probes check, on their own task, every word of the
// runtime's Job that the hook and the request table rely on against what the runtime says or did
// itself (pool_layout.c): the ID swift_task_getJobTaskId gives, the job kind, the priority the probe
// was made with, the dispatch queue kind the runtime's own enqueue wrote, and an invoke function in
// libswift_Concurrency.so's code. The hook is set only once a probe passed and none failed; a
// mismatch found later takes it off again. Until then nothing reads a job's memory (requests.c asks
// stallmon_runtime_layout_verified).
//
// The hot path, per job: one thread-local load, one clock read (vDSO; a second only at the end of a
// job that became a stall), three relaxed or release stores into the thread's own cache line and
// loads of the park flag and the watch. No lock, no system call, no allocation (a thread's first
// job claims a slot with one compare-and-swap per slot it tries).
//
// Installing the hook is the monitor's start for an async service (`cooperative_pool`, on there by
// default) or the service's explicit choice; linking the library sets nothing.

#define _GNU_SOURCE
#include "stallcapture_pool.h"

#if defined(STALLMON_LINUX)

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>

#include "pool.h"
#include "requests.h"

// libdispatch (linked by every Swift program that uses concurrency) and the Swift runtime. Weak:
// without them nothing is installed.
typedef struct dispatch_queue_s *dispatch_queue_t;
extern void dispatch_async_f(dispatch_queue_t queue, void *context, void (*work)(void *)) __attribute__((weak));
extern dispatch_queue_t dispatch_get_current_queue(void) __attribute__((weak));
extern const char *dispatch_queue_get_label(dispatch_queue_t queue) __attribute__((weak));

static const char runtime_queue_label[] = "Swift global concurrent queue";

typedef void (*job_invoke)(void *job, void *unused, unsigned flags) __attribute__((swiftcall));
typedef void (*enqueue_original)(void *job) __attribute__((swiftcall));

typedef struct {
    // Written by the slot's thread on every job; read by the watchdog.
    _Atomic uint64_t start_ns;
    _Atomic uint64_t sequence;
    _Atomic pid_t tid;
    _Atomic(void *) job;  // the running job, for the request it serves (requests.c)
    // The running job's Flags and ID word (at 32), read as it starts, while it surely lives: a
    // task's ID for the request table's lookups, which never read a job's memory themselves.
    _Atomic uint64_t job_flags_id;
    // Written by the watchdog, rarely: on a cache line of its own so that the thread's stores above
    // do not bounce it.
    _Atomic uint64_t watch_sequence __attribute__((aligned(64)));
    _Atomic uint64_t watched_end_ns;
    // The latest watched job that ended, kept after the watchdog is done with it: its span's
    // `stall` event takes the stall's true end from here (requests).
    _Atomic uint64_t last_watched_start_ns;
    _Atomic uint64_t last_watched_end_ns;
} __attribute__((aligned(64))) pool_slot;

static pool_slot slots[STALLMON_POOL_MAX_THREADS];
static _Atomic int slot_count;
static _Atomic(dispatch_queue_t) queues[PRIORITY_COUNT];
static _Atomic uint64_t untimed_jobs;
static _Atomic uint64_t untimed_threads;
static _Atomic unsigned latest_unknown_priority;

// The watchdog's wait (see stallmon_loop_park in loop.c for the handshake).
static struct {
    _Atomic int parked;
    _Atomic uint32_t word;  // futex: 1 once woken
    _Atomic int asymmetric;  // parking uses membarrier(2): a job start needs only a compiler barrier
} __attribute__((aligned(64))) watchdog;

// Marks a thread that found no free slot, so that it does not look again on every job.
static pool_slot no_slot;
static __thread pool_slot *thread_slot __attribute__((tls_model("initial-exec")));
static pthread_key_t slot_key;
static pthread_once_t slot_key_once = PTHREAD_ONCE_INIT;

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void release_slot(void *value) {
    pool_slot *slot = value;
    if (slot == NULL || slot == &no_slot) return;
    atomic_store_explicit(&slot->start_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->tid, 0, memory_order_release);
}

// A child of fork() has the forking thread alone: the slots of the others name threads that do not
// exist there, and their jobs never end. They are let go, so that a monitor started in the child
// sees no phantom stall; the forking thread keeps its slot, under its new thread ID. The
// watchdog's wait starts over.
static void pool_after_fork_in_child(void) {
    pool_slot *own = thread_slot;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    for (int index = 0; index < STALLMON_POOL_MAX_THREADS; index++) {
        pool_slot *slot = &slots[index];
        if (slot == own) {
            atomic_store_explicit(&slot->tid, tid, memory_order_relaxed);
            continue;
        }
        atomic_store_explicit(&slot->start_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&slot->job, NULL, memory_order_relaxed);
        atomic_store_explicit(&slot->watch_sequence, 0, memory_order_relaxed);
        atomic_store_explicit(&slot->watched_end_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&slot->tid, 0, memory_order_relaxed);
    }
    atomic_store_explicit(&watchdog.parked, 0, memory_order_relaxed);
    atomic_store_explicit(&watchdog.word, 0, memory_order_relaxed);
}

static void create_slot_key(void) {
    (void)pthread_atfork(NULL, NULL, pool_after_fork_in_child);
    // Registered once per process, as loop.c does; membarrier's registration is idempotent.
    long commands = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    watchdog.asymmetric = commands >= 0 && (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                          syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    (void)pthread_key_create(&slot_key, release_slot);
}

// A thread's first job: claims a free slot, released when the thread exits.
static __attribute__((noinline)) pool_slot *bind_thread(void) {
    pid_t tid = (pid_t)syscall(SYS_gettid);
    for (int index = 0; index < STALLMON_POOL_MAX_THREADS; index++) {
        pid_t expected = 0;
        if (atomic_load_explicit(&slots[index].tid, memory_order_relaxed) != 0) continue;
        if (!atomic_compare_exchange_strong(&slots[index].tid, &expected, tid)) continue;
        int count = atomic_load_explicit(&slot_count, memory_order_relaxed);
        while (count < index + 1 &&
               !atomic_compare_exchange_weak_explicit(&slot_count, &count, index + 1, memory_order_release,
                                                      memory_order_relaxed)) {
        }
        (void)pthread_setspecific(slot_key, &slots[index]);
        thread_slot = &slots[index];
        return thread_slot;
    }
    atomic_fetch_add_explicit(&untimed_threads, 1, memory_order_relaxed);
    thread_slot = &no_slot;
    return &no_slot;
}

static void wake_watchdog(void) {
    if (!atomic_exchange_explicit(&watchdog.parked, 0, memory_order_acq_rel)) return;
    atomic_store_explicit(&watchdog.word, 1, memory_order_release);
    syscall(SYS_futex, &watchdog.word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static inline void invoke(void *job) {
    void *metadata = *(void **)job;
    job_invoke run = *(job_invoke *)((char *)metadata + METADATA_INVOKE_OFFSET);
    run(job, NULL, 0);
}

// The trampoline: what __swift_run_job does, between two stamps. Not static: reports recognize a
// pool job by this frame (STALL_CALLOUT=pool-job), in stripped binaries too.
void stallmon_pool_run_job(void *job) {
    pool_slot *slot = thread_slot;
    if (__builtin_expect(slot == NULL, 0)) slot = bind_thread();
    // A job run inside another (never seen from libdispatch, but cheap to rule out) stays part of it.
    if (slot == &no_slot || atomic_load_explicit(&slot->start_ns, memory_order_relaxed) != 0) {
        invoke(job);
        return;
    }
    uint64_t sequence = atomic_load_explicit(&slot->sequence, memory_order_relaxed) + 1;
    atomic_store_explicit(&slot->job, job, memory_order_relaxed);
    atomic_store_explicit(&slot->job_flags_id, *(const uint64_t *)((const char *)job + JOB_FLAGS_OFFSET),
                          memory_order_relaxed);
    uint64_t start = now_ns();
    // Release: a reader that sees this start sees the job (stallmon_pool_job_of_thread). A plain
    // store on x86-64.
    atomic_store_explicit(&slot->start_ns, start, memory_order_release);
    atomic_store_explicit(&slot->sequence, sequence, memory_order_release);
    if (watchdog.asymmetric) {
        atomic_signal_fence(memory_order_seq_cst);
    } else {
        atomic_thread_fence(memory_order_seq_cst);
    }
    if (__builtin_expect(atomic_load_explicit(&watchdog.parked, memory_order_relaxed), 0)) wake_watchdog();
    invoke(job);
    // Only the end of a job that became a stall is wanted (the watchdog asked for it): the clock is
    // read then only.
    if (__builtin_expect(atomic_load_explicit(&slot->watch_sequence, memory_order_relaxed) == sequence, 0)) {
        uint64_t end = now_ns();
        atomic_store_explicit(&slot->watched_end_ns, end, memory_order_relaxed);
        atomic_store_explicit(&slot->last_watched_end_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&slot->last_watched_start_ns, start, memory_order_release);
        atomic_store_explicit(&slot->last_watched_end_ns, end, memory_order_release);
    }
    atomic_store_explicit(&slot->start_ns, 0, memory_order_release);
}

__attribute__((swiftcall)) static void enqueue_global(void *job, enqueue_original original) {
    // A task made or woken by a request's task serves that request (requests.c): one load while no
    // task's span is open, a lookup of the enqueuing task (a few ns) while one may be.
    stallmon_request_inherit(job);
    unsigned priority = *((const uint8_t *)job + JOB_PRIORITY_OFFSET);
    dispatch_queue_t queue =
        priority < PRIORITY_COUNT ? atomic_load_explicit(&queues[priority], memory_order_acquire) : NULL;
    if (__builtin_expect(queue == NULL, 0)) {
        atomic_fetch_add_explicit(&untimed_jobs, 1, memory_order_relaxed);
        atomic_store_explicit(&latest_unknown_priority, 0x100 | priority, memory_order_relaxed);
        original(job);
        return;
    }
    // As the runtime's swift_dispatchEnqueueGlobal does before its dispatch_async_f.
    *(uintptr_t *)((char *)job + JOB_DISPATCH_QUEUE_OFFSET) = DISPATCH_QUEUE_GLOBAL_EXECUTOR;
    dispatch_async_f(queue, job, stallmon_pool_run_job);
}

static void **hook_address(void) {
#if defined(__x86_64__) || defined(__aarch64__)
    return dlsym(RTLD_DEFAULT, "swift_task_enqueueGlobal_hook");
#else
    return NULL;  // the job layout above is that of 64-bit targets
#endif
}

int stallmon_pool_learn_queue(unsigned priority) {
    if (dispatch_get_current_queue == NULL || dispatch_queue_get_label == NULL || swift_task_getCurrent == NULL)
        return 0;
    void *task = swift_task_getCurrent();
    if (task == NULL) return 0;
    dispatch_queue_t queue = dispatch_get_current_queue();
    const char *label = queue != NULL ? dispatch_queue_get_label(queue) : NULL;
    if (priority >= PRIORITY_COUNT || label == NULL || strcmp(label, runtime_queue_label) != 0) return 0;
    if (!stallmon_pool_check_layout(task, priority)) return STALLMON_POOL_LAYOUT_MISMATCH;
    atomic_store_explicit(&queues[priority], queue, memory_order_release);
    return 1;
}

int stallmon_pool_knows_priority(unsigned priority) {
    return priority < PRIORITY_COUNT && atomic_load_explicit(&queues[priority], memory_order_acquire) != NULL;
}

int stallmon_pool_install(void) {
    void **hook = hook_address();
    if (hook == NULL || dispatch_async_f == NULL) return -ENOENT;
    if (!stallmon_runtime_layout_verified()) return -EPROTO;
    pthread_once(&slot_key_once, create_slot_key);
    void *ours = (void *)enqueue_global;
    void *expected = NULL;
    if (__atomic_compare_exchange_n(hook, &expected, ours, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return 0;
    return expected == ours ? 0 : -EBUSY;
}

void stallmon_pool_uninstall(void) {
    void **hook = hook_address();
    if (hook == NULL) return;
    void *expected = (void *)enqueue_global;
    __atomic_compare_exchange_n(hook, &expected, NULL, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

int stallmon_pool_installed(void) {
    void **hook = hook_address();
    return hook != NULL && __atomic_load_n(hook, __ATOMIC_ACQUIRE) == (void *)enqueue_global;
}

int stallmon_pool_hook_taken(void) {
    void **hook = hook_address();
    if (hook == NULL) return 0;
    void *current = __atomic_load_n(hook, __ATOMIC_ACQUIRE);
    return current != NULL && current != (void *)enqueue_global;
}

// An empty job for stallmon_pool_measure_job_ns: a metadata whose invoke function does nothing.
__attribute__((swiftcall, noinline)) static void empty_invoke(void *job, void *unused, unsigned flags) {
    (void)job;
    (void)unused;
    (void)flags;
    __asm__ volatile("" ::: "memory");
}
static void *empty_metadata[4] = {NULL, NULL, NULL, (void *)empty_invoke};
static void *empty_job[8] = {(void *)empty_metadata};

double stallmon_pool_measure_job_ns(long jobs, int timed) {
    pthread_once(&slot_key_once, create_slot_key);
    uint64_t start = now_ns();
    for (long index = 0; index < jobs; index++) {
        if (timed) {
            stallmon_pool_run_job(empty_job);
        } else {
            invoke(empty_job);
        }
    }
    return jobs > 0 ? (double)(now_ns() - start) / (double)jobs : 0;
}

int stallmon_pool_slot_count(void) { return atomic_load_explicit(&slot_count, memory_order_acquire); }

int stallmon_pool_read(int index, stallmon_pool_job *out) {
    if (index < 0 || index >= STALLMON_POOL_MAX_THREADS) return 0;
    pool_slot *slot = &slots[index];
    uint64_t before = atomic_load_explicit(&slot->sequence, memory_order_acquire);
    out->tid = atomic_load_explicit(&slot->tid, memory_order_acquire);
    out->start_ns = atomic_load_explicit(&slot->start_ns, memory_order_acquire);
    out->sequence = atomic_load_explicit(&slot->sequence, memory_order_acquire);
    // A start stored before its sequence belongs to the next job: read again.
    return out->sequence == before ? 1 : 0;
}

uintptr_t stallmon_pool_job_of_thread(pid_t tid) {
    int count = atomic_load_explicit(&slot_count, memory_order_acquire);
    for (int index = 0; index < count; index++) {
        pool_slot *slot = &slots[index];
        if (atomic_load_explicit(&slot->tid, memory_order_acquire) != tid) continue;
        // The job is stored before its start, and the start is 0 between jobs: a start read first
        // (acquire) that is not 0 comes with its job, unless the thread has moved on since, which
        // the sequence read around them tells.
        uint64_t before = atomic_load_explicit(&slot->sequence, memory_order_acquire);
        uint64_t start = atomic_load_explicit(&slot->start_ns, memory_order_acquire);
        void *job = atomic_load_explicit(&slot->job, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (start == 0 || atomic_load_explicit(&slot->sequence, memory_order_relaxed) != before) return 0;
        return (uintptr_t)job;
    }
    return 0;
}

int stallmon_pool_running_task_id(uintptr_t job, uint32_t *id) {
    if (job == 0) return 0;
    int count = atomic_load_explicit(&slot_count, memory_order_acquire);
    for (int index = 0; index < count; index++) {
        pool_slot *slot = &slots[index];
        if (atomic_load_explicit(&slot->job, memory_order_relaxed) != (void *)job) continue;
        // As stallmon_pool_job_of_thread: the job's words come with its start, checked by the
        // sequence read around them.
        uint64_t before = atomic_load_explicit(&slot->sequence, memory_order_acquire);
        uint64_t start = atomic_load_explicit(&slot->start_ns, memory_order_acquire);
        void *running = atomic_load_explicit(&slot->job, memory_order_relaxed);
        uint64_t word = atomic_load_explicit(&slot->job_flags_id, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (start == 0 || running != (void *)job || atomic_load_explicit(&slot->sequence, memory_order_relaxed) != before) {
            continue;
        }
        if ((uint8_t)word != 0) return 0;  // not a task
        *id = (uint32_t)(word >> 32);
        return 1;
    }
    return 0;
}

uint64_t stallmon_pool_stall_end_of_thread(pid_t tid, uint64_t at_ns) {
    int count = atomic_load_explicit(&slot_count, memory_order_acquire);
    for (int index = 0; index < count; index++) {
        pool_slot *slot = &slots[index];
        if (atomic_load_explicit(&slot->tid, memory_order_acquire) != tid) continue;
        uint64_t end = atomic_load_explicit(&slot->last_watched_end_ns, memory_order_acquire);
        uint64_t start = atomic_load_explicit(&slot->last_watched_start_ns, memory_order_acquire);
        if (end == 0 || atomic_load_explicit(&slot->last_watched_end_ns, memory_order_acquire) != end) return 0;
        return start <= at_ns && at_ns < end ? end : 0;
    }
    return 0;
}

void stallmon_pool_watch(int index, uint64_t sequence) {
    if (index < 0 || index >= STALLMON_POOL_MAX_THREADS) return;
    atomic_store_explicit(&slots[index].watched_end_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&slots[index].watch_sequence, sequence, memory_order_seq_cst);
}

int stallmon_pool_watched_end(int index, uint64_t sequence, uint64_t *end_ns) {
    if (index < 0 || index >= STALLMON_POOL_MAX_THREADS) return 0;
    uint64_t end = atomic_load_explicit(&slots[index].watched_end_ns, memory_order_relaxed);
    if (end == 0 || atomic_load_explicit(&slots[index].watch_sequence, memory_order_relaxed) != sequence) return 0;
    *end_ns = end;
    return 1;
}

uint64_t stallmon_pool_untimed_jobs(void) { return atomic_load_explicit(&untimed_jobs, memory_order_relaxed); }
uint64_t stallmon_pool_untimed_threads(void) { return atomic_load_explicit(&untimed_threads, memory_order_relaxed); }
unsigned stallmon_pool_latest_unknown_priority(void) {
    return atomic_load_explicit(&latest_unknown_priority, memory_order_relaxed);
}

int stallmon_pool_park(void) {
    atomic_store_explicit(&watchdog.parked, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    if (watchdog.asymmetric && syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
        // Refused since registration (a seccomp filter): job starts use fences from now on. One
        // that read the flag without a fence just now may be missed, so this wait is timed.
        watchdog.asymmetric = 0;
        atomic_thread_fence(memory_order_seq_cst);
        return -1;
    }
    return 1;
}

void stallmon_pool_unpark(void) { atomic_store_explicit(&watchdog.parked, 0, memory_order_relaxed); }

int stallmon_pool_wait(uint64_t timeout_ns) {
    struct timespec timeout = {
        .tv_sec = (time_t)(timeout_ns / 1000000000ULL),
        .tv_nsec = (long)(timeout_ns % 1000000000ULL),
    };
    uint64_t deadline = timeout_ns == UINT64_MAX ? UINT64_MAX : now_ns() + timeout_ns;
    while (atomic_load_explicit(&watchdog.word, memory_order_acquire) == 0) {
        long rc = syscall(SYS_futex, &watchdog.word, FUTEX_WAIT_PRIVATE, 0,
                          timeout_ns == UINT64_MAX ? NULL : &timeout, NULL, 0);
        if (rc != 0 && errno == ETIMEDOUT) break;
        if (deadline != UINT64_MAX) {
            uint64_t now = now_ns();
            if (now >= deadline) break;
            timeout.tv_sec = (time_t)((deadline - now) / 1000000000ULL);
            timeout.tv_nsec = (long)((deadline - now) % 1000000000ULL);
        }
    }
    int woken = atomic_exchange_explicit(&watchdog.word, 0, memory_order_acq_rel) != 0;
    atomic_store_explicit(&watchdog.parked, 0, memory_order_relaxed);
    return woken;
}

void stallmon_pool_wake(void) {
    atomic_store_explicit(&watchdog.parked, 1, memory_order_relaxed);
    wake_watchdog();
}

#endif  // STALLMON_LINUX
