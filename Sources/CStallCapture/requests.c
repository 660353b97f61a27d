// The requests in flight (see stallcapture_requests.h): a table of slots, each either a span's own
// registration (the owner: its key, a registration number and the retained record) or an alias (a
// key that inherited an owner: a task made or woken by a request's task, pointing at the owner's
// slot and registration number).
//
// A key is looked for in the STALLMON_REQUEST_WINDOW slots from its hash: a registration takes the
// first free one, or refuses (counted) when the window is full. A span's start registers and its
// end withdraws; the pool hook makes aliases; the watchdog reads. Nobody waits on anybody, but for
// one case: a span that ends while a watchdog retains its record waits for that retain.
//
// The records' lifetimes: the table holds no reference. A reader pins the slot, loads the record
// and tries to retain it (which fails once the record is being deinitialized), then unpins; a
// withdrawal, at the span's end or in its record's deinit, takes the record out and returns only
// once no reader holds a pin (sequentially consistent on both sides, so that either the reader sees
// no record or the withdrawal sees the pin): a record is never freed under a reader.

#define _GNU_SOURCE
#include "requests.h"

#if defined(STALLMON_LINUX)

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>

// The Swift runtime's retain that fails on an object being deinitialized (libswiftCore): a
// reader's +1 on a record it found. It returns the object, or NULL when it failed (its C++
// declaration says bool, but the function returns the pointer: test it as one).
extern void *swift_tryRetain(void *object);

enum {
    WINDOW = 4,
    SLOT_MASK = STALLMON_REQUEST_SLOTS - 1,
    LINK_SLOT_BITS = 16,
};
_Static_assert((STALLMON_REQUEST_SLOTS & (STALLMON_REQUEST_SLOTS - 1)) == 0, "a power of two");
_Static_assert(STALLMON_REQUEST_SLOTS <= (1 << LINK_SLOT_BITS), "a slot index fits a link");

typedef struct {
    _Atomic uint64_t key;       // 0: free
    _Atomic uint64_t sequence;  // an owner's registration number in this slot once published; 0 otherwise
    uint64_t registrations;     // the slot's owners so far: written by its claimer only
    _Atomic uint32_t depth;     // an owner's spans around it: the innermost of a key is the deepest
    _Atomic(void *) record;     // an owner's record (not retained: a reader tries to retain it)
    _Atomic uint64_t link;      // an alias: owner's sequence << 16 | owner's slot; 0 otherwise
    _Atomic uint32_t pins;      // readers retaining the record now
} __attribute__((aligned(64))) request_slot;

static request_slot slots[STALLMON_REQUEST_SLOTS];
// Set by the first registration, never cleared: until then the pool hook and the lookups return at
// once. (A count of the spans open would let them return at once between requests too, but every
// span's start and end would then write one cache line that all CPUs share.)
static _Atomic int used;
static _Atomic uint64_t refused;
static _Atomic uint64_t inherited;

// The latest owner the calling thread registered or found for a task: spares the pool hook a look
// in the table when a request's task enqueues several jobs in a row.
static __thread struct {
    uint64_t key;
    uint64_t link;
} thread_cache __attribute__((tls_model("initial-exec")));

static inline unsigned home(uint64_t key) {
    return (unsigned)(((key >> 4) * 0x9E3779B97F4A7C15ULL) >> 40) & SLOT_MASK;
}

static inline request_slot *at(unsigned home_index, int step) { return &slots[(home_index + step) & SLOT_MASK]; }

static inline uint64_t link_of(unsigned index, uint64_t sequence) {
    return sequence << LINK_SLOT_BITS | index;
}

// Whether `link` still names a published owner.
static inline bool link_valid(uint64_t link) {
    unsigned index = (unsigned)(link & ((1u << LINK_SLOT_BITS) - 1));
    if (link == 0 || index >= STALLMON_REQUEST_SLOTS) return false;
    return atomic_load_explicit(&slots[index].sequence, memory_order_acquire) == link >> LINK_SLOT_BITS;
}

// Frees an alias whose owner is gone. Its link is cleared first, by compare-and-swap: the one who
// clears it frees the key, and a waker that would point the alias elsewhere fails its own swap.
static bool free_stale_alias(request_slot *slot) {
    if (atomic_load_explicit(&slot->sequence, memory_order_acquire) != 0) return false;
    uint64_t link = atomic_load_explicit(&slot->link, memory_order_acquire);
    if (link == 0 || link_valid(link)) return false;
    if (!atomic_compare_exchange_strong_explicit(&slot->link, &link, 0, memory_order_acq_rel, memory_order_relaxed)) {
        return false;
    }
    atomic_store_explicit(&slot->key, 0, memory_order_release);
    return true;
}

static __thread pid_t cached_tid __attribute__((tls_model("initial-exec")));

uint64_t stallmon_request_thread_key(pid_t tid) { return (uint64_t)(uint32_t)tid << 1 | 1; }

uint64_t stallmon_request_current_key(void) {
    void *task = swift_task_getCurrent != NULL ? swift_task_getCurrent() : NULL;
    if (task != NULL) return (uint64_t)(uintptr_t)task;
    if (cached_tid == 0) cached_tid = (pid_t)syscall(SYS_gettid);
    return stallmon_request_thread_key(cached_tid);
}

// Takes a slot for `key` in its window: returns its index, or -1. A free slot has no link.
static int claim(uint64_t key) {
    unsigned base = home(key);
    for (int step = 0; step < WINDOW; step++) {
        request_slot *slot = at(base, step);
        uint64_t seen = atomic_load_explicit(&slot->key, memory_order_acquire);
        if (seen != 0 && !free_stale_alias(slot)) continue;
        seen = 0;
        if (atomic_compare_exchange_strong_explicit(&slot->key, &seen, key, memory_order_acq_rel,
                                                    memory_order_relaxed)) {
            return (int)((base + step) & SLOT_MASK);
        }
    }
    return -1;
}

int stallmon_request_register(uint64_t key, void *record, uint32_t depth) {
    if (key == 0 || record == NULL) return -1;
    int index = claim(key);
    if (index < 0) {
        atomic_fetch_add_explicit(&refused, 1, memory_order_relaxed);
        return -1;
    }
    request_slot *slot = &slots[index];
    uint64_t sequence = ++slot->registrations;
    atomic_store_explicit(&slot->depth, depth, memory_order_relaxed);
    atomic_store_explicit(&slot->record, record, memory_order_relaxed);
    atomic_store_explicit(&slot->sequence, sequence, memory_order_release);
    if (!atomic_load_explicit(&used, memory_order_relaxed)) atomic_store_explicit(&used, 1, memory_order_release);
    thread_cache.key = key;
    thread_cache.link = link_of((unsigned)index, sequence);
    return index;
}

void stallmon_request_withdraw(int index) {
    if (index < 0 || index >= STALLMON_REQUEST_SLOTS) return;
    request_slot *slot = &slots[index];
    if (atomic_load_explicit(&slot->sequence, memory_order_relaxed) == 0) return;
    // Aliases of this owner and readers looking for it see it gone from here on.
    atomic_store_explicit(&slot->sequence, 0, memory_order_release);
    atomic_exchange_explicit(&slot->record, NULL, memory_order_seq_cst);
    while (atomic_load_explicit(&slot->pins, memory_order_seq_cst) != 0) sched_yield();
    atomic_store_explicit(&slot->key, 0, memory_order_release);
}

// The link of the owner serving `key`: its own innermost registration, else the owner it inherited.
static uint64_t find(uint64_t key) {
    unsigned base = home(key);
    uint64_t best = 0, alias = 0;
    int64_t best_depth = -1;
    for (int step = 0; step < WINDOW; step++) {
        request_slot *slot = at(base, step);
        if (atomic_load_explicit(&slot->key, memory_order_acquire) != key) continue;
        uint64_t sequence = atomic_load_explicit(&slot->sequence, memory_order_acquire);
        if (sequence != 0) {
            int64_t depth = atomic_load_explicit(&slot->depth, memory_order_relaxed);
            if (depth > best_depth) {
                best_depth = depth;
                best = link_of((base + step) & SLOT_MASK, sequence);
            }
        } else {
            uint64_t link = atomic_load_explicit(&slot->link, memory_order_acquire);
            if (link_valid(link)) alias = link;
        }
    }
    return best != 0 ? best : alias;
}

// Retains the record of the owner `link` names, or returns NULL when it is gone.
static void *retain_owner(uint64_t link) {
    request_slot *slot = &slots[link & ((1u << LINK_SLOT_BITS) - 1)];
    void *record = NULL;
    atomic_fetch_add_explicit(&slot->pins, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&slot->sequence, memory_order_seq_cst) == link >> LINK_SLOT_BITS) {
        record = atomic_load_explicit(&slot->record, memory_order_seq_cst);
        if (record != NULL && swift_tryRetain(record) == NULL) record = NULL;
    }
    atomic_fetch_sub_explicit(&slot->pins, 1, memory_order_seq_cst);
    return record;
}

void *stallmon_request_acquire(const uint64_t *keys, int count) {
    if (!atomic_load_explicit(&used, memory_order_acquire)) return NULL;
    for (int i = 0; i < count; i++) {
        if (keys[i] == 0) continue;
        uint64_t link = find(keys[i]);
        if (link == 0) continue;
        void *record = retain_owner(link);
        if (record != NULL) return record;
    }
    return NULL;
}

// `job`, enqueued by the work of `current`, serves the request `current` serves.
static void inherit_from(uint64_t current, void *job) {
    uint64_t link = thread_cache.key == current ? thread_cache.link : 0;
    if (!link_valid(link)) {
        link = find(current);
        thread_cache.key = current;
        thread_cache.link = link;
        if (link == 0) return;
    }
    uint64_t key = (uint64_t)(uintptr_t)job;
    unsigned base = home(key);
    for (int step = 0; step < WINDOW; step++) {
        request_slot *slot = at(base, step);
        if (atomic_load_explicit(&slot->key, memory_order_acquire) != key) continue;
        // A job that serves a request of its own keeps it; an alias follows its latest waker.
        if (atomic_load_explicit(&slot->sequence, memory_order_acquire) != 0) return;
        uint64_t old = atomic_load_explicit(&slot->link, memory_order_acquire);
        // 0: another waker is making this alias, or it is being freed.
        if (old != 0 && old != link) {
            atomic_compare_exchange_strong_explicit(&slot->link, &old, link, memory_order_acq_rel, memory_order_relaxed);
        }
        return;
    }
    int index = claim(key);
    if (index < 0) return;
    atomic_store_explicit(&slots[index].link, link, memory_order_release);
    atomic_fetch_add_explicit(&inherited, 1, memory_order_relaxed);
}

void stallmon_request_inherit(void *job) {
    if (__builtin_expect(!atomic_load_explicit(&used, memory_order_relaxed), 1)) return;
    void *task = swift_task_getCurrent != NULL ? swift_task_getCurrent() : NULL;
    if (task == NULL || task == job) return;
    inherit_from((uint64_t)(uintptr_t)task, job);
}

void stallmon_request_inherit_for(uint64_t current, uint64_t job) {
    if (!atomic_load_explicit(&used, memory_order_relaxed) || current == 0 || current == job) return;
    inherit_from(current, (void *)(uintptr_t)job);
}

double stallmon_request_measure_inherit_ns(long jobs, uint64_t current) {
    // Jobs never dereferenced: addresses 64 bytes apart, as tasks are at least.
    static char fake_jobs[64];
    uintptr_t base = (uintptr_t)fake_jobs & ~(uintptr_t)63;
    uint64_t start = 0, end = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    start = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    for (long i = 0; i < jobs; i++) {
        void *job = (void *)(base + (uintptr_t)(i % 1024) * 64);
        if (current == 0) {
            stallmon_request_inherit(job);
        } else if (atomic_load_explicit(&used, memory_order_relaxed)) {
            inherit_from(current, job);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    end = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    return jobs > 0 ? (double)(end - start) / (double)jobs : 0;
}

static __thread uint64_t random_state __attribute__((tls_model("initial-exec")));

uint64_t stallmon_request_random(void) {
    if (__builtin_expect(random_state == 0, 0)) {
        uint64_t seed = 0;
        if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            seed = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 32 ^ (uint64_t)syscall(SYS_gettid) << 16;
        }
        random_state = seed | 1;
    }
    // splitmix64
    uint64_t z = (random_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

int stallmon_request_used(void) { return atomic_load_explicit(&used, memory_order_acquire); }

int64_t stallmon_request_live(void) {
    int64_t count = 0;
    for (int index = 0; index < STALLMON_REQUEST_SLOTS; index++) {
        if (atomic_load_explicit(&slots[index].sequence, memory_order_relaxed) != 0) count++;
    }
    return count;
}
uint64_t stallmon_request_refused(void) { return atomic_load_explicit(&refused, memory_order_relaxed); }
uint64_t stallmon_request_inherited(void) { return atomic_load_explicit(&inherited, memory_order_relaxed); }

#endif  // STALLMON_LINUX
