// The runtime's Job layout, checked before the pool's hook (pool.c) is set: on a probe task that
// the runtime itself enqueued, every word the hook and the request table read is compared with what
// the runtime says or did (swift_task_getJobTaskId's ID, the job kind, the probe's priority, the
// dispatch queue kind the runtime's own enqueue wrote, an invoke function in libswift_Concurrency's
// code). The first mismatch is kept, said once, and takes the hook off for good.

#define _GNU_SOURCE
#include "stallcapture_pool.h"

#if defined(STALLMON_LINUX)

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "pool.h"
#include "requests.h"

enum { LAYOUT_UNCHECKED, LAYOUT_VERIFIED, LAYOUT_MISMATCH };
_Atomic int stallmon_runtime_layout_state;
// Why the layout was refused: written once, by the probe that found the first mismatch.
static char layout_problem[256];
static _Atomic int layout_problem_claimed;
static _Atomic int layout_problem_ready;
// The test seam (stallmon_pool_simulate_layout_mismatch): the check that is to find a difference.
static _Atomic int simulated_mismatch;

enum { CHECK_NONE, CHECK_TASK_ID, CHECK_JOB_KIND, CHECK_PRIORITY, CHECK_QUEUE_KIND, CHECK_INVOKE, CHECK_COUNT };
static const char *const check_names[CHECK_COUNT] = {
    [CHECK_TASK_ID] = "task-id", [CHECK_JOB_KIND] = "job-kind", [CHECK_PRIORITY] = "priority",
    [CHECK_QUEUE_KIND] = "queue-kind", [CHECK_INVOKE] = "invoke",
};

static void refuse_layout(int check, const char *format, ...) __attribute__((format(printf, 2, 3)));
static void refuse_layout(int check, const char *format, ...) {
    atomic_store_explicit(&stallmon_runtime_layout_state, LAYOUT_MISMATCH, memory_order_seq_cst);
    int expected = 0;
    if (atomic_compare_exchange_strong(&layout_problem_claimed, &expected, 1)) {
        int used = snprintf(layout_problem, sizeof layout_problem, "%s: ", check_names[check]);
        va_list arguments;
        va_start(arguments, format);
        vsnprintf(layout_problem + used, sizeof layout_problem - (size_t)used, format, arguments);
        va_end(arguments);
        atomic_store_explicit(&layout_problem_ready, 1, memory_order_release);
    }
    // A hook set after an earlier probe passed comes off: nothing is to read jobs any more.
    stallmon_pool_uninstall();
}

// Whether the found value of `check` is to be taken as different (the test seam).
static inline int simulated(int check) {
    return atomic_load_explicit(&simulated_mismatch, memory_order_relaxed) == check;
}

struct code_search {
    uintptr_t address;
    uintptr_t base;
    int executable;
};

static int find_code(struct dl_phdr_info *info, size_t size, void *context) {
    (void)size;
    struct code_search *search = context;
    if (info->dlpi_addr != search->base) return 0;
    for (int index = 0; index < info->dlpi_phnum; index++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[index];
        uintptr_t start = info->dlpi_addr + header->p_vaddr;
        if (header->p_type == PT_LOAD && (header->p_flags & PF_X) && search->address >= start &&
            search->address < start + header->p_memsz) {
            search->executable = 1;
        }
    }
    return 1;
}

// Whether `function` lies in the code of the object that holds swift_task_getJobTaskId
// (libswift_Concurrency.so): the same object, and an executable segment of it. Takes the loader's
// lock (dladdr1, dl_iterate_phdr): at check time only, in a probe task, never on a job's path.
static int in_runtime_code(void *function, const char **found_in) {
    Dl_info runtime, found;
    struct link_map *runtime_map = NULL, *found_map = NULL;
    *found_in = "no object";
    if (dladdr1((void *)swift_task_getJobTaskId, &runtime, (void **)&runtime_map, RTLD_DL_LINKMAP) == 0 ||
        dladdr1(function, &found, (void **)&found_map, RTLD_DL_LINKMAP) == 0) {
        return 0;
    }
    if (found.dli_fname != NULL) *found_in = found.dli_fname;
    if (found_map == NULL || found_map != runtime_map) return 0;
    struct code_search search = {.address = (uintptr_t)function, .base = found_map->l_addr};
    dl_iterate_phdr(find_code, &search);
    return search.executable;
}

// Checks the words of the running probe task `task` (a job the runtime itself enqueued on its
// global executor, of `priority`) against the runtime. Returns 1, or 0 after refuse_layout.
int stallmon_pool_check_layout(void *task, unsigned priority) {
    if (swift_task_getJobTaskId == NULL) {
        refuse_layout(CHECK_TASK_ID, "the runtime has no swift_task_getJobTaskId to ask");
        return 0;
    }
    const char *job = task;
    uint64_t id = swift_task_getJobTaskId(task);
    uint64_t found_id = (uint64_t)*(const uint32_t *)(job + JOB_FLAGS_OFFSET + 4) |
                        (uint64_t)*(const uint32_t *)(job + TASK_ID_HIGH_OFFSET) << 32;
    if (simulated(CHECK_TASK_ID)) found_id ^= 1;
    if (found_id != id) {
        refuse_layout(CHECK_TASK_ID, "the task ID is expected %llu (swift_task_getJobTaskId's), found %llu at 36 and 0x90",
                      (unsigned long long)id, (unsigned long long)found_id);
        return 0;
    }
    unsigned kind = job[JOB_FLAGS_OFFSET];
    if (simulated(CHECK_JOB_KIND)) kind ^= 1;
    if (kind != 0) {
        refuse_layout(CHECK_JOB_KIND, "a task's job kind at 32 is expected 0, found %u", kind);
        return 0;
    }
    unsigned found_priority = (uint8_t)job[JOB_PRIORITY_OFFSET];
    if (simulated(CHECK_PRIORITY)) found_priority ^= 1;
    if (found_priority != priority) {
        refuse_layout(CHECK_PRIORITY, "the priority at 33 is expected %u (the probe's), found %u", priority,
                      found_priority);
        return 0;
    }
    uintptr_t queue_kind = *(const uintptr_t *)(job + JOB_DISPATCH_QUEUE_OFFSET);
    if (simulated(CHECK_QUEUE_KIND)) queue_kind ^= 1;
    if (queue_kind != DISPATCH_QUEUE_GLOBAL_EXECUTOR) {
        refuse_layout(CHECK_QUEUE_KIND, "the dispatch queue kind at 24 is expected %d (the global executor), found %lu",
                      DISPATCH_QUEUE_GLOBAL_EXECUTOR, (unsigned long)queue_kind);
        return 0;
    }
    void *invoke_function = *(void *const *)(*(const char *const *)job + METADATA_INVOKE_OFFSET);
    if (simulated(CHECK_INVOKE)) invoke_function = (void *)stallmon_pool_run_job;
    const char *found_in;
    if (!in_runtime_code(invoke_function, &found_in)) {
        refuse_layout(CHECK_INVOKE, "the invoke function at metadata+24 is expected in libswift_Concurrency.so's code, "
                      "found %p in %s", invoke_function, found_in);
        return 0;
    }
    int unchecked = LAYOUT_UNCHECKED;
    atomic_compare_exchange_strong(&stallmon_runtime_layout_state, &unchecked, LAYOUT_VERIFIED);
    return 1;
}

int stallmon_pool_layout_verified(void) { return stallmon_runtime_layout_verified(); }

const char *stallmon_pool_layout_problem(void) {
    return atomic_load_explicit(&layout_problem_ready, memory_order_acquire) ? layout_problem : NULL;
}

int stallmon_pool_simulate_layout_mismatch(const char *check) {
    for (int index = CHECK_NONE + 1; index < CHECK_COUNT; index++) {
        if (check != NULL && strcmp(check, check_names[index]) == 0) {
            atomic_store_explicit(&simulated_mismatch, index, memory_order_relaxed);
            return 0;
        }
    }
    return -EINVAL;
}

#endif  // STALLMON_LINUX
