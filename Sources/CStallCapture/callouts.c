// Where CoreFoundation calls out, learned without its symbols.
//
// A stall report names its callout kind from the frames of the functions CF calls out through
// (__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__ and its siblings). Those are local
// symbols, in `.symtab` only, and a stripped libFoundation has none. So a probe run at start()
// calls back into the functions below once per kind, and each records the return address of its
// call site in CoreFoundation: a sampled stack that holds that return address called out there.
// The main queue needs no probe: libdispatch exports _dispatch_main_queue_callback_4CF.

#define _GNU_SOURCE
#define UNW_LOCAL_ONLY
#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <dlfcn.h>
#include <link.h>
#include <libunwind.h>
#include <stdatomic.h>

static _Atomic uintptr_t sites[STALLMON_CALLOUT_SITE_COUNT];

// The load address of the image that holds CFRunLoopRunSpecific (libFoundation on Linux).
static void *run_loop_image(void) {
    void *anchor = dlsym(RTLD_DEFAULT, "CFRunLoopRunSpecific");
    Dl_info info;
    if (anchor == NULL || dladdr(anchor, &info) == 0) return NULL;
    return info.dli_fbase;
}

void stallmon_callout_site_record(stallmon_callout_site kind) {
    if ((unsigned)kind >= STALLMON_CALLOUT_SITE_COUNT) return;
    void *image = run_loop_image();
    if (image == NULL) return;
    // This function, the probe callback (and a block's thunks), then the call site in CF.
    void *frames[12];
    int count = unw_backtrace(frames, 12);
    for (int i = 1; i < count; i++) {
        Dl_info info;
        if (dladdr(frames[i], &info) != 0 && info.dli_fbase == image) {
            atomic_store_explicit(&sites[kind], (uintptr_t)frames[i], memory_order_release);
            return;
        }
    }
}

uintptr_t stallmon_callout_site_address(stallmon_callout_site kind) {
    if ((unsigned)kind >= STALLMON_CALLOUT_SITE_COUNT) return 0;
    return atomic_load_explicit(&sites[kind], memory_order_acquire);
}

void stallmon_probe_timer(void *timer, void *info) {
    (void)timer;
    (void)info;
    stallmon_callout_site_record(STALLMON_CALLOUT_SITE_TIMER);
}

void stallmon_probe_source0(void *info) {
    (void)info;
    stallmon_callout_site_record(STALLMON_CALLOUT_SITE_SOURCE0);
}

void stallmon_probe_observer(void *observer, uintptr_t activity, void *info) {
    (void)observer;
    (void)activity;
    (void)info;
    stallmon_callout_site_record(STALLMON_CALLOUT_SITE_OBSERVER);
}

int stallmon_exported_function_range(const char *name, uintptr_t *start, uintptr_t *end) {
    void *address = dlsym(RTLD_DEFAULT, name);
    if (address == NULL) return 0;
    Dl_info info;
    const ElfW(Sym) *symbol = NULL;
    if (dladdr1(address, &info, (void **)&symbol, RTLD_DL_SYMENT) == 0 || symbol == NULL || symbol->st_size == 0) {
        return 0;
    }
    *start = (uintptr_t)address;
    *end = (uintptr_t)address + symbol->st_size;
    return 1;
}

#endif  // STALLMON_LINUX
