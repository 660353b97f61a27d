#ifndef STALLMON_STALLCAPTURE_H
#define STALLMON_STALLCAPTURE_H

// The parts of stallmon that run on the monitored thread: the run-loop observer callouts
// (a hot path inside other people's loops) and the sampling signal handler (async-signal-safe).
// Both are C so that nothing on them allocates, locks, retains or releases behind our back.

#include <stdint.h>
#include <sys/types.h>

#include "stallmon_platform.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(STALLMON_LINUX)

// MARK: - Loop state, written by the observer callouts on the monitored thread

/// What the monitored loop is doing since its latest transition.
typedef enum {
    STALLMON_LOOP_UNKNOWN = 0,  ///< No transition seen since the observers were added.
    STALLMON_LOOP_ACTIVE = 1,   ///< Inside a before-sources (from entry or before-timers) or after-waiting window.
    STALLMON_LOOP_ASLEEP = 2,   ///< Waiting for events (after before-waiting).
    STALLMON_LOOP_OUTSIDE = 3,  ///< The outermost run of the loop has exited.
} stallmon_loop_phase;

/// Which window an active loop is in.
typedef enum {
    STALLMON_WINDOW_NONE = 0,
    STALLMON_WINDOW_BEFORE_SOURCES = 1,
    STALLMON_WINDOW_AFTER_WAITING = 2,
} stallmon_window;

/// One transition of the monitored loop.
typedef struct {
    uint64_t sequence;      ///< 1 for the first transition after the observers were added.
    uint64_t timestamp_ns;  ///< CLOCK_MONOTONIC; 0 for idle transitions (asleep, outside) nobody watched.
    uint32_t phase;         ///< stallmon_loop_phase
    uint32_t window;        ///< stallmon_window
    uint32_t depth;         ///< Nesting depth of the run loop (1 = outermost run).
    uint32_t allowed;       ///< Depth of `allowingStall` scopes at the time of the transition.
} stallmon_event;

typedef struct stallmon_loop stallmon_loop;

// MARK: - Loop latency: how long each window (or tick) of a loop lasts

/// Buckets of a latency histogram: below 1,024 ns, then four a power of two (a quarter of the octave
/// wide) up to 2^36 ns; the last one holds everything from 60.1 s on.
enum { STALLMON_LATENCY_BUCKETS = 105 };

/// Window durations of one loop, counted by the loop's thread (one writer: a relaxed load and store
/// per count, no lock, no allocation) and read by anyone without a lock.
typedef struct stallmon_latency stallmon_latency;

stallmon_latency *stallmon_latency_create(void);
void stallmon_latency_free(stallmon_latency *latency);
/// Counts one duration (its single writer only).
void stallmon_latency_record(stallmon_latency *latency, uint64_t ns);
/// Copies the counts (STALLMON_LATENCY_BUCKETS of them) and returns the sum of the durations. Each
/// count is read whole; a window recorded meanwhile may be in some of them and not yet in others.
uint64_t stallmon_latency_read(const stallmon_latency *latency, uint64_t *counts);
/// The bucket a duration falls in.
int stallmon_latency_bucket(uint64_t ns);
/// A bucket's exclusive upper bound in nanoseconds (UINT64_MAX for the last).
uint64_t stallmon_latency_bucket_upper_ns(int index);

/// Called (on the monitored thread) when the loop leaves an idle phase while the watchdog is parked.
typedef void (*stallmon_wake_fn)(void *context);
/// Called once when the loop state is freed, to release `wake_context`.
typedef void (*stallmon_release_fn)(void *context);

/// Creates loop state with a reference count of 1. CFRunLoopObserverContext's retain and release
/// callbacks are stallmon_loop_retain and stallmon_loop_release. CFRunLoopObserverInvalidate
/// releases at once and clears `info` (the callouts then return early) without waiting for a
/// callout already running, so the owner's last release must happen on the monitored thread.
stallmon_loop *stallmon_loop_create(stallmon_wake_fn wake, void *wake_context, stallmon_release_fn release);
const void *stallmon_loop_retain(const void *loop);
void stallmon_loop_release(const void *loop);

/// Has the loop's thread record the duration of every window into a latency histogram owned by
/// the loop state (freed with it). Call it before the observers are added or the drain attached:
/// the loop's thread reads it without synchronization. Returns 0, or -ENOMEM.
int stallmon_loop_enable_latency(stallmon_loop *loop);
/// The loop's latency histogram, NULL unless enabled.
const stallmon_latency *stallmon_loop_latency(const stallmon_loop *loop);

/// Asks the observer to record when the window that began at `sequence` ends (0 stops watching).
void stallmon_loop_watch(stallmon_loop *loop, uint64_t sequence);
/// When the watched window has ended and the observer recorded it, stores its end and returns 1.
int stallmon_loop_watched_end(const stallmon_loop *loop, uint64_t sequence, uint64_t *end_ns);

/// CFRunLoopObserver callout for kCFRunLoopEntry | kCFRunLoopBeforeTimers | kCFRunLoopAfterWaiting
/// (lowest order).
/// Its signature matches CFRunLoopObserverCallBack; `info` is the stallmon_loop.
void stallmon_observer_window_start(void *observer, uintptr_t activity, void *info);
/// CFRunLoopObserver callout for kCFRunLoopBeforeWaiting | kCFRunLoopExit (added with the highest order).
void stallmon_observer_window_end(void *observer, uintptr_t activity, void *info);

/// The newest transition. Returns 0 when there is none yet.
int stallmon_loop_latest(const stallmon_loop *loop, stallmon_event *out);
/// The transition that followed `sequence`, if it is still in the ring. Returns 1 when found,
/// 0 when there is none yet, -1 when it has been overwritten.
int stallmon_loop_event_after(const stallmon_loop *loop, uint64_t sequence, stallmon_event *out);

/// Watchdog side of parking: announces that the watchdog is about to wait without a timeout
/// because the loop was idle at `seen_sequence`. Returns 1 when the watchdog should wait
/// (possibly consuming a wake that is already on its way), 0 when the loop moved on meanwhile,
/// -1 when the watchdog must not wait without a timeout (membarrier refused after registration).
int stallmon_loop_park(stallmon_loop *loop, uint64_t seen_sequence);
/// Withdraws a park announcement. Returns 1 when a wake was already sent and must be consumed.
int stallmon_loop_unpark(stallmon_loop *loop);

/// Marks the start and end of work that may block the monitored loop (monitored thread only).
/// Ending a scope starts a fresh window: the time spent inside the scope never counts.
void stallmon_loop_allow_begin(stallmon_loop *loop);
void stallmon_loop_allow_end(stallmon_loop *loop);
uint32_t stallmon_loop_allowed(const stallmon_loop *loop);

#endif  // STALLMON_LINUX

/// SIGRTMIN and SIGRTMAX of this process (glibc reserves the lowest real-time signals). Where there
/// are no real-time signals, glibc's on Linux (34 and 64): configuration names them as the Linux
/// service it is written for will.
int stallmon_sigrtmin(void);
int stallmon_sigrtmax(void);

#if defined(STALLMON_LINUX)

/// CLOCK_MONOTONIC in nanoseconds.
uint64_t stallmon_now_ns(void);
/// CLOCK_BOOTTIME in nanoseconds.
uint64_t stallmon_boottime_ns(void);
/// CPU time consumed so far by thread `tid` of this process, in nanoseconds, or -1.
int64_t stallmon_thread_cpu_ns(pid_t tid);
/// The calling thread's kernel thread id.
pid_t stallmon_gettid(void);
/// Sets the calling thread's timer slack (`prctl(PR_SET_TIMERSLACK)`, variadic in C), so that its
/// timed waits wake when asked rather than up to 50 µs later.
void stallmon_set_timer_slack(unsigned long nanoseconds);
/// Names the calling thread as top -H, ps -L and /proc show it (at most 15 bytes are kept).
void stallmon_set_thread_name(const char *name);

/// Starts a detached thread named `name` (at most 15 bytes are kept) that runs `body(context)` with
/// every asynchronous signal blocked from its first instruction (all but SIGSEGV, SIGBUS, SIGFPE,
/// SIGILL, SIGTRAP, SIGSYS and SIGABRT): the monitor's own threads are made so, and a signal sent to
/// the process is never handled on one of them. `stack_size` 0 takes the default. Returns 0 or an
/// errno.
int stallmon_thread_spawn(const char *name, size_t stack_size, void (*body)(void *), void *context);

// MARK: - Sampling another thread of this process

enum { STALLMON_MAX_FRAMES = 128 };

/// Result codes of stallmon_sample_thread.
typedef enum {
    STALLMON_SAMPLE_OK = 0,
    STALLMON_SAMPLE_TIMEOUT = 1,        ///< The thread did not run the handler in time.
    STALLMON_SAMPLE_SEND_FAILED = 2,    ///< The signal could not be queued (`error` holds errno).
    STALLMON_SAMPLE_NO_SLOT = 3,        ///< No free sampler slot.
    STALLMON_SAMPLE_UNWIND_FAILED = 4,  ///< The handler copied the stack but the copy could not be unwound.
    /// The program owns the signal now (`disposition` says how); no signal was sent.
    STALLMON_SAMPLE_SIGNAL_TAKEN = 5,
    /// The thread blocks in a system call and its stack could not be unwound from the kernel's
    /// view (`error` holds the libunwind code, or EAGAIN when the thread kept waking up).
    STALLMON_SAMPLE_BLOCKED_UNWIND_FAILED = 6,
    /// The thread runs, but kept blocking in short system calls: a signal would likely land in
    /// the next one, so none was sent.
    STALLMON_SAMPLE_SYSCALL_BUSY = 7,
    /// Only a perf event may sample a running thread (STALLMON_SAMPLE_PERF_ONLY), and the kernel
    /// refused one (stallmon_perf_refusal says why), or the watchdog has as many open as it may.
    STALLMON_SAMPLE_PERF_REFUSED = 8,
} stallmon_sample_status;

/// Where a sample's stack came from.
typedef enum {
    STALLMON_STACK_NONE = 0,
    /// The sampling signal's handler copied the thread's registers and the top of its stack; the
    /// watchdog unwound the copy.
    STALLMON_STACK_SIGNAL = 1,
    STALLMON_STACK_KERNEL = 2,  ///< Unwound in place from the sp and pc /proc shows while it blocks.
    /// A perf event on the thread: the kernel copied its registers and the top of its stack; no
    /// signal was sent. The watchdog unwound the copy.
    STALLMON_STACK_PERF = 3,
} stallmon_stack_source;

/// What the process does with the sampling signal right now.
typedef enum {
    STALLMON_DISPOSITION_OURS = 0,     ///< stallmon's handler.
    STALLMON_DISPOSITION_DEFAULT = 1,  ///< SIG_DFL: a real-time signal would kill the process.
    STALLMON_DISPOSITION_IGNORED = 2,  ///< SIG_IGN: the signal would be discarded.
    STALLMON_DISPOSITION_FOREIGN = 3,  ///< Another handler: it would run the program's code.
} stallmon_disposition;

/// Flags of stallmon_sample_stack.
enum {
    /// Never signal a thread that sits in a system call (a handler would end nanosleep, poll,
    /// epoll_wait, … with EINTR): unwind it in place from the kernel's view instead.
    STALLMON_SAMPLE_SPARE_SYSCALLS = 1,
    /// Never signal at all (the thread blocks the signal, or there is none): only a thread blocked
    /// in a system call is sampled, from the kernel's view.
    STALLMON_SAMPLE_NO_SIGNAL = 2,
    /// A running thread's stack is taken by a perf event on it (perf.c), opened at its stall's first
    /// sample and kept until stallmon_perf_close_thread; where the kernel refuses, by the signal
    /// as without this flag (the refusal holds for the life of the process).
    STALLMON_SAMPLE_PERF = 4,
    /// As STALLMON_SAMPLE_PERF, and never the signal: where the kernel refuses, a running thread
    /// gets no stack (STALLMON_SAMPLE_PERF_REFUSED).
    STALLMON_SAMPLE_PERF_ONLY = 8,
};

/// The steps of a perf event the kernel may refuse.
typedef enum {
    STALLMON_PERF_STEP_OPEN = 1,  ///< perf_event_open
    STALLMON_PERF_STEP_MAP = 2,   ///< mmap of its ring
    /// Not tried: a seccomp filter applies, and might kill the process for the call.
    STALLMON_PERF_STEP_SECCOMP = 3,
} stallmon_perf_step;

/// The errno with which the kernel refused a perf event in this process (the process then samples
/// with the signal for good), and the step in `*step`; 0 while it has not refused.
int stallmon_perf_refusal(int *step);
/// Tests only: the kernel refused (`error`) as if perf_event_open had failed.
void stallmon_perf_refuse_for_tests(int error);
/// Closes the perf event slot `slot` holds on thread `tid`, if any: its stall ended.
void stallmon_perf_close_thread(int slot, pid_t tid);
/// The sampling period of the perf events slot `slot` opens after their first record (the sample
/// interval), in nanoseconds of the thread's CPU time.
void stallmon_sampler_set_perf_period(int slot, uint64_t nanoseconds);
/// Perf events open in this process now (every slot).
int stallmon_perf_open_count(void);
/// Times a sampling handler ran in this process (for tests: a perf-sampled stall sends no signal).
uint64_t stallmon_sampler_handler_runs(void);

typedef struct {
    int status;                 ///< stallmon_sample_status
    int error;                  ///< errno for STALLMON_SAMPLE_SEND_FAILED, libunwind code for UNWIND_FAILED
    int frame_count;
    int truncated;              ///< 1 when the stack was deeper than the frames asked for
    uint64_t requested_ns;      ///< CLOCK_MONOTONIC when the signal was sent
    uint64_t handler_enter_ns;  ///< when the handler started on the sampled thread
    uint64_t handler_exit_ns;   ///< when it finished
    int source;                 ///< stallmon_stack_source of `frames`
    int disposition;            ///< stallmon_disposition of the signal when the sample was asked for
    long syscall;               ///< the system call the thread blocked in (STACK_KERNEL), else -1
    int interrupted_syscall;    ///< 1 when the handler found it had ended a system call with EINTR
    int recovered_frame_pointers;  ///< frame pointers a kernel-view unwind had to recover
    int reused;                 ///< 1 when a kernel-view stack was reused: the thread had not run since
    uintptr_t current_task;     ///< STACK_SIGNAL: the Swift task the thread was running, 0 when none
    uint32_t current_task_id;   ///< STACK_SIGNAL: its ID (low 32 bits), read while it ran; 0 when unknown
    pid_t sampled_tid;          ///< STACK_SIGNAL: the thread whose handler answered (the one asked, always)
    int stack_bytes;            ///< STACK_SIGNAL: bytes of stack the handler copied above its sp
    uintptr_t frames[STALLMON_MAX_FRAMES];  ///< frames[0] is the interrupted pc, the rest return addresses
} stallmon_sample;

/// Installs the sampling handler for `signo` (SA_SIGINFO | SA_RESTART | SA_ONSTACK, the other
/// sampling signals blocked while it runs) unless it is installed already. Returns 0, or -errno.
/// Fails with -EBUSY when another handler owns the signal (or it is ignored), with -EACCES when
/// /proc/self/mem, through which the handler copies the stack, cannot be opened.
int stallmon_sampler_install(int signo);

/// Tests only: makes every sampling handler spin this long between its checks and its claim (0:
/// none), as a handler that runs late would.
void stallmon_sampler_set_test_delay(uint64_t nanoseconds);

/// Lists the loaded images from /proc/self/maps (as the unwinder does on a miss) and returns how
/// many have unwind tables. Watchdog side only.
int stallmon_module_count(void);
/// 1 when `signo` has a handler that is not stallmon's (or is ignored), 0 when free or ours.
int stallmon_signal_in_use(int signo);

/// Claims one of the process's sampler slots for a monitor. Returns the slot index, or -1.
int stallmon_sampler_slot_claim(void);
void stallmon_sampler_slot_release(int slot);

/// Samples thread `tid` of this process: queues `signo` to it carrying the slot, waits up to
/// `timeout_ns` for the handler to copy its registers and stack into the slot, and unwinds the
/// copy. Never hangs: a thread that has the signal blocked or never runs gives
/// STALLMON_SAMPLE_TIMEOUT, and is sent no other signal until it has taken that one. Sends nothing
/// when the signal is no longer stallmon's (STALLMON_SAMPLE_SIGNAL_TAKEN). The same as
/// stallmon_sample_stack without flags: a thread in a system call is signalled too.
void stallmon_sample_thread(int slot, pid_t tid, int signo, int max_frames, uint64_t timeout_ns,
                            stallmon_sample *out);

/// Samples thread `tid`'s stack. A thread blocked in a system call is unwound in place from the
/// kernel's view when `flags` has STALLMON_SAMPLE_SPARE_SYSCALLS or the signal is no longer
/// stallmon's; otherwise the thread is signalled as stallmon_sample_thread does.
///
/// With STALLMON_SAMPLE_SPARE_SYSCALLS, a running thread that blocked since the previous look (or
/// within a 200 µs watch) is not signalled either (STALLMON_SAMPLE_SYSCALL_BUSY). The last check
/// and the signal are a few microseconds apart: a thread that had not blocked for a whole sample
/// interval and enters a system call within them still gets the signal there
/// (`interrupted_syscall` then says so when the call ended with EINTR).
void stallmon_sample_stack(int slot, pid_t tid, int signo, int max_frames, uint64_t timeout_ns, int flags,
                           stallmon_sample *out);

/// Notes, on the watchdog, that thread `tid` runs as a window of its loop starts: a sample at the
/// threshold that finds it has not blocked since may signal it without first watching it for
/// 200 µs (see stallmon_sample_stack).
void stallmon_sampler_note_running(int slot, pid_t tid);

/// What the process does with `signo` now: a stallmon_disposition, or -1 when it cannot be read.
int stallmon_signal_disposition(int signo);

/// Unwinds a thread of this process that is blocked in the kernel, from the user stack pointer and
/// program counter /proc shows for it (remote_unwind.c). Returns 0 with at least one frame, or a
/// negative libunwind code. `recovered` counts frame pointers it had to recover.
int stallmon_unwind_blocked(uintptr_t sp, uintptr_t pc, int max_frames, uintptr_t *frames, int *frame_count,
                            int *truncated, int *recovered);

// MARK: - Callout sites, for stacks without CoreFoundation's symbols (callouts.c)

/// The kinds of callout a probe run learns the call site of.
typedef enum {
    STALLMON_CALLOUT_SITE_TIMER = 0,
    STALLMON_CALLOUT_SITE_SOURCE0 = 1,
    STALLMON_CALLOUT_SITE_OBSERVER = 2,
    STALLMON_CALLOUT_SITE_BLOCK = 3,
    STALLMON_CALLOUT_SITE_COUNT = 4,
} stallmon_callout_site;

/// Called from a probe callback: records the return address of the nearest caller inside the
/// image that holds CFRunLoopRunSpecific, the call site of this kind of callout.
void stallmon_callout_site_record(stallmon_callout_site kind);
/// The recorded call site of `kind`, 0 when none was recorded.
uintptr_t stallmon_callout_site_address(stallmon_callout_site kind);
/// Probe callbacks with the signatures of CFRunLoopTimerCallBack, a source0's perform and
/// CFRunLoopObserverCallBack; each records its call site.
void stallmon_probe_timer(void *timer, void *info);
void stallmon_probe_source0(void *info);
void stallmon_probe_observer(void *observer, uintptr_t activity, void *info);
/// The address range of an exported function (from the dynamic symbol table, which stripping
/// keeps). Returns 0 when it is not found or has no size.
int stallmon_exported_function_range(const char *name, uintptr_t *start, uintptr_t *end);

// MARK: - The main thread of an async @main

/// Runs the main run loop until it is stopped (CFRunLoopRun, passed in from Swift).
typedef void (*stallmon_main_loop_fn)(void);

/// Sets `swift_task_asyncMainDrainQueue_hook` so that, once an async main first suspends, the main
/// thread runs `run` (the CoreFoundation main run loop, which drains the main queue) instead of
/// `dispatch_main()`, as on Darwin. If `run` returns, the runtime's own drain takes over. Effective
/// only when called on the main thread before the async main first suspends (the runtime reads the
/// hook then). Returns 0 (also when it is installed already), -ENOENT when the Swift runtime has
/// no such hook, -EBUSY when someone else's hook is set.
/// -EALREADY when an earlier call installed a different `run` (the first choice stays).
int stallmon_async_main_run_loop_install(stallmon_main_loop_fn run);

/// Has the async main's drain call `fn` once, on the main thread, when main() first suspends and
/// before the drain begins (NULL: call nothing). The cooperative pool's hook is set then rather than
/// at start(), so that a service that makes SwiftNIO's event loops the global executor in main()'s
/// synchronous part, before or after it starts the monitor, keeps them.
void stallmon_async_main_on_first_suspension(void (*fn)(void));
/// 1 once the async main's drain has begun (main() has suspended): a callback set now would never run.
int stallmon_async_main_has_suspended(void);

/// The light drain of the main queue: the main thread waits on libdispatch's main-queue port (an
/// eventfd) with poll(2) and drains the main queue with `_dispatch_main_queue_callback_4CF`, the two
/// entry points libdispatch exports for CoreFoundation, with no run loop around them. Each drain is a
/// window of the loop attached with ``stallmon_async_main_drain_attach``. Never returns (pass it to
/// ``stallmon_async_main_run_loop_install``); if the port cannot be had, it returns and the runtime's
/// own drain takes over.
void stallmon_async_main_light_drain(void);

/// Has the light drain publish its windows into `loop` (NULL: into none). The drain reads the
/// pointer before each transition and keeps it through no callout: a loop detached here may be
/// released in a main-queue block, or on the main thread between drains.
void stallmon_async_main_drain_attach(stallmon_loop *loop);

/// Window transitions of a loop that a drain runs by itself, without CFRunLoop observers: the start
/// of an after-waiting window (before its callouts), and going back to waiting for events.
/// Call them on the thread that runs the loop.
void stallmon_loop_drain_window_start(stallmon_loop *loop);
void stallmon_loop_drain_window_end(stallmon_loop *loop);

#endif  // STALLMON_LINUX

#ifdef __cplusplus
}
#endif

#endif
