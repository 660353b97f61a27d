// The main thread of an async @main. On Linux the Swift runtime ends an async main in
// dispatch_main(): the main thread leaves (it waits in sigsuspend for the rest of the process), and
// libdispatch worker threads drain the main queue, so `@MainActor` jobs and `DispatchQueue.main`
// blocks run on whichever worker is free, with real-time signals blocked, and no run loop turns
// for an observer to see. On Darwin the runtime runs the CoreFoundation main run loop instead.
//
// swift_task_asyncMainDrainQueue_hook (a data symbol of libswift_Concurrency.so) replaces that
// drain. The compiler's main() runs the async main's first part on the main thread, up to its first
// suspension, and only then calls swift_task_asyncMainDrainQueue, which reads the hook: a hook set
// by code in that first part is the one used. The hook here runs the main run loop on the main
// thread, as Darwin does; CFRunLoop drains the main queue on Linux too, so main-actor work runs on
// the main thread, inside run-loop callouts the monitor observes.
//
// The run loop costs a main-actor hop about half as much again as the runtime's dispatch_main()
// drain: CFRunLoop's pass around each main-queue callout (modes, observers, timers, sources). The
// light drain does what the run loop does for the main queue and nothing else: it waits on
// libdispatch's main-queue port, the eventfd libdispatch writes when it enqueues on the main queue,
// and calls _dispatch_main_queue_callback_4CF to drain it, both exported by libdispatch for
// CoreFoundation. Main-actor work runs on the main thread as under the run loop; timers and sources
// on RunLoop.main do not fire, as under dispatch_main(). It publishes each drain into the monitor's
// loop directly, without CF observer dispatches.
//
// Installing it is the service's explicit choice (StallMonitor.start(.asyncMain)); linking the
// library changes nothing.

#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

// libdispatch's entry points for CoreFoundation (not in its public headers). Weak: a libdispatch
// without them leaves the light drain to fall back on the runtime's drain.
extern int _dispatch_get_main_queue_port_4CF(void) __attribute__((weak));
extern void _dispatch_main_queue_callback_4CF(void *message) __attribute__((weak));

// The runtime calls the hook with the Swift calling convention: the original drain and an override
// the hook may ignore (the runtime passes NULL).
typedef void (*drain_original)(void) __attribute__((swiftcall));

static _Atomic(stallmon_main_loop_fn) main_loop;
static void (*_Atomic first_suspension)(void);
static _Atomic int suspended_once;

void stallmon_async_main_on_first_suspension(void (*fn)(void)) {
    atomic_store_explicit(&first_suspension, fn, memory_order_release);
}

int stallmon_async_main_has_suspended(void) { return atomic_load_explicit(&suspended_once, memory_order_acquire); }

__attribute__((swiftcall)) static void drain_on_main_run_loop(drain_original original, void *compat_override) {
    (void)compat_override;
    atomic_store_explicit(&suspended_once, 1, memory_order_release);
    void (*suspended)(void) = atomic_exchange_explicit(&first_suspension, NULL, memory_order_acq_rel);
    if (suspended != NULL) suspended();
    stallmon_main_loop_fn run = atomic_load_explicit(&main_loop, memory_order_acquire);
    // Returns only when someone stops the main run loop: the main queue must still be drained, so
    // the runtime's own drain takes over (it never returns).
    if (run != NULL) run();
    original();
}

int stallmon_async_main_run_loop_install(stallmon_main_loop_fn run) {
    void **hook = dlsym(RTLD_DEFAULT, "swift_task_asyncMainDrainQueue_hook");
    if (hook == NULL) return -ENOENT;
    void *ours = (void *)drain_on_main_run_loop;
    stallmon_main_loop_fn expected_loop = NULL;
    if (!atomic_compare_exchange_strong(&main_loop, &expected_loop, run) && expected_loop != run) return -EALREADY;
    void *expected = NULL;
    if (__atomic_compare_exchange_n(hook, &expected, ours, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return 0;
    return expected == ours ? 0 : -EBUSY;
}

static _Atomic(stallmon_loop *) drain_loop;

void stallmon_async_main_drain_attach(stallmon_loop *loop) {
    atomic_store_explicit(&drain_loop, loop, memory_order_release);
}

void stallmon_async_main_light_drain(void) {
    if (_dispatch_get_main_queue_port_4CF == NULL || _dispatch_main_queue_callback_4CF == NULL) return;
    int port = _dispatch_get_main_queue_port_4CF();
    if (port < 0) return;
    struct pollfd wait = {.fd = port, .events = POLLIN};
    for (;;) {
        // The loop is read afresh at each transition and kept through no callout: a main-queue
        // block may stop the monitor and release it.
        stallmon_loop *loop = atomic_load_explicit(&drain_loop, memory_order_acquire);
        if (loop != NULL) stallmon_loop_drain_window_end(loop);
        if (poll(&wait, 1, -1) < 0) continue;  // EINTR: a signal handler ran; wait again
        uint64_t pokes;
        // libdispatch's eventfd is non-blocking; poll said it has a count, and this thread alone reads it.
        (void)!read(port, &pokes, sizeof pokes);
        loop = atomic_load_explicit(&drain_loop, memory_order_acquire);
        if (loop != NULL) stallmon_loop_drain_window_start(loop);
        _dispatch_main_queue_callback_4CF(NULL);
    }
}

#endif  // STALLMON_LINUX
