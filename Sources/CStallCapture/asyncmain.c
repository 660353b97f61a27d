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
// Installing it is the service's explicit choice (StallMonitor.start(.asyncMain)); linking the
// library changes nothing.

#include "stallcapture.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>

// The runtime calls the hook with the Swift calling convention: the original drain and an override
// the hook may ignore (the runtime passes NULL).
typedef void (*drain_original)(void) __attribute__((swiftcall));

static _Atomic(stallmon_main_loop_fn) main_loop;

__attribute__((swiftcall)) static void drain_on_main_run_loop(drain_original original, void *compat_override) {
    (void)compat_override;
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
    atomic_compare_exchange_strong(&main_loop, &expected_loop, run);
    void *expected = NULL;
    if (__atomic_compare_exchange_n(hook, &expected, ours, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return 0;
    return expected == ours ? 0 : -EBUSY;
}
