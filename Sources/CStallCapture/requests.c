// The requests in flight (see stallcapture_requests.h): a table of slots, each either a span's own
// registration (the owner: its key, a registration number, its depth and its task's ID) or an alias
// (a task made or woken by a request's task: the task's address and ID, pointing at the owner's slot
// and registration number). An alias is a task's only: the pool hook makes none for an actor's job
// or another executor's, and one whose address now holds another task (its ID differs) is ignored.
//
// A key is looked for in the WINDOW slots from its hash: a registration takes the first free one
// (or an alias's whose owner is gone, or a span's that a task at this address never ended), else a
// live alias's, else refuses (counted). A span's start registers and its end withdraws; the pool
// hook makes aliases, while a task's span may be open (one word says so, which the pool's watchdog
// clears by a sweep of the table: see stallmon_request_sweep); the watchdog reads.
//
// What a span says (its name, attributes, trace; a wrapped tracer's span) is kept by the caller
// (StallMonitorTracing), in storage of its own per slot, made by the slot's first span and reused by
// every later one: after the first spans, a span allocates nothing. A reader copies it under the
// slot's lock, checking that the slot still holds the registration it found; a span takes the lock
// to add attributes. A span's start writes its parts unlocked, before it publishes its registration,
// once the lock is free (readers of the slot's last registration are done): the one wait, the time
// of a reader's copy.
//
// Task memory is read only once the runtime's layout was checked against the runtime
// (stallmon_runtime_layout_verified), and only while the task surely lives: a task's ID when it
// registers a span of its own, or as it is enqueued (the pool hook) or started (the trampoline keeps
// it for the watchdog). A lookup of a task that is not the caller's takes its ID from the pool
// thread that runs it, never from its memory; where no live record has it (a task the main thread
// runs), the lookup goes by the address alone.
//
// A child of fork() has one thread: a slot lock held at the fork by another thread would be held
// for good, and a slot claimed but not yet published would stay so. The child's handler
// (after_fork_in_child) frees them and withdraws those slots' registrations, whose parts may be
// half written.

#define _GNU_SOURCE
#include "requests.h"
#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/random.h>

enum {
    WINDOW = 4,
    SLOT_MASK = STALLMON_REQUEST_SLOTS - 1,
    // A link: the aliased task's ID (32 bits), the owner's registration number (its low 18 bits)
    // and the owner's slot (14 bits).
    LINK_SLOT_BITS = 14,
    LINK_SEQUENCE_BITS = STALLMON_REQUEST_SEQUENCE_BITS,
    // The runtime's Job (see pool.h): its kind in the low byte of Flags at 32 (0: a task), and its
    // ID at 36 (stallmon_live_task_id: a task's, unique while it lives). Read only once verified.
    JOB_KIND_OFFSET = 32,
};
_Static_assert((STALLMON_REQUEST_SLOTS & (STALLMON_REQUEST_SLOTS - 1)) == 0, "a power of two");
_Static_assert(STALLMON_REQUEST_SLOTS <= (1 << LINK_SLOT_BITS), "a slot index fits a link");
#define SEQUENCE_MASK ((1ULL << LINK_SEQUENCE_BITS) - 1)

typedef struct {
    _Atomic uint64_t key;       // 0: free
    _Atomic uint64_t sequence;  // an owner's registration number once published; 0 otherwise
    uint64_t registrations;     // the slot's last registration number (links keep its low bits)
    _Atomic uint32_t depth;     // an owner's spans around it: the innermost of a key is the deepest
    _Atomic uint32_t task_id;   // an owner under a task: the task's ID
    _Atomic uint64_t link;      // an alias: task ID, owner's registration number and slot; 0 otherwise
    _Atomic(void *) parts;      // the caller's storage for the slot's spans, once made
    _Atomic uint32_t lock;      // over the parts
} __attribute__((aligned(64))) request_slot;

static request_slot slots[STALLMON_REQUEST_SLOTS];
// Set by the first registration, never cleared: until then the lookups return at once.
static _Atomic int used;

// Whether a task's span may be open now (the pool hook inherits from tasks only, and returns at
// once while none is: see stallmon_request_sweep). A count of the spans open would say it exactly,
// but every span's start and end would then write one cache line that all CPUs share; this line is
// written only when it changes: by the first span to start after a sweep cleared it, and by the
// sweeps. Past MAYBE_OPEN, the state is a sweep's own (2 + its ticket) while it looks.
enum { NONE_OPEN = 0, MAYBE_OPEN = 1, FIRST_SWEEP = 2 };
static struct {
    _Atomic uint64_t state;
    _Atomic uint64_t tickets;  // sweeps that found MAYBE_OPEN and took a ticket
    _Atomic uint64_t sweeps;   // sweeps that looked at the table
} __attribute__((aligned(64))) open_spans;
static _Atomic uint64_t refused;
static _Atomic uint64_t inherited;

static inline unsigned home(uint64_t key) {
    return (unsigned)(((key >> 4) * 0x9E3779B97F4A7C15ULL) >> 40) & SLOT_MASK;
}

static inline request_slot *at(unsigned home_index, int step) { return &slots[(home_index + step) & SLOT_MASK]; }

static inline uint64_t link_of(unsigned index, uint64_t sequence, uint32_t task_id) {
    return (uint64_t)task_id << (LINK_SLOT_BITS + LINK_SEQUENCE_BITS) | (sequence & SEQUENCE_MASK) << LINK_SLOT_BITS |
           index;
}

static inline unsigned link_slot(uint64_t link) { return (unsigned)(link & ((1u << LINK_SLOT_BITS) - 1)); }
static inline uint64_t link_sequence(uint64_t link) { return (link >> LINK_SLOT_BITS) & SEQUENCE_MASK; }
static inline uint32_t link_task_id(uint64_t link) { return (uint32_t)(link >> (LINK_SLOT_BITS + LINK_SEQUENCE_BITS)); }

// Whether an owner has `sequence` published now (its low bits, as a link keeps them).
static inline bool published(request_slot *slot, uint64_t sequence) {
    uint64_t now = atomic_load_explicit(&slot->sequence, memory_order_acquire);
    return now != 0 && (now & SEQUENCE_MASK) == sequence;
}

// Whether `link` still names a published owner.
static inline bool link_valid(uint64_t link) {
    return link != 0 && published(&slots[link_slot(link)], link_sequence(link));
}

// Whether `job`, which lives (it is being enqueued), is a task. Never, while the layout is unverified.
static inline bool is_task(const void *job) {
    return stallmon_runtime_layout_verified() && *((const uint8_t *)job + JOB_KIND_OFFSET) == 0;
}

// Whether a registration or alias made for a task of ID `recorded` may be the task of ID `id` now:
// either unknown (0) matches.
static inline bool same_task(uint32_t recorded, uint32_t id) { return recorded == 0 || id == 0 || recorded == id; }

// Frees an alias: one whose owner is gone, or (`evict`) any. Its link is cleared first, by
// compare-and-swap: the one who clears it frees the key, and a waker that would point the alias
// elsewhere fails its own swap.
static bool free_alias(request_slot *slot, bool evict) {
    if (atomic_load_explicit(&slot->sequence, memory_order_acquire) != 0) return false;
    uint64_t link = atomic_load_explicit(&slot->link, memory_order_acquire);
    if (link == 0 || (!evict && link_valid(link))) return false;
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
    if (cached_tid == 0) cached_tid = stallmon_gettid();
    return stallmon_request_thread_key(cached_tid);
}

// Frees the slot of a span that a task at `key` registered and never ended, once another task
// (`id`, read by the new task itself) lives at that address. Only the new task does, for its own
// address.
static bool free_stale_owner(request_slot *slot, uint64_t key, uint32_t id) {
    if (id == 0 || atomic_load_explicit(&slot->key, memory_order_acquire) != key) return false;
    uint64_t sequence = atomic_load_explicit(&slot->sequence, memory_order_acquire);
    uint32_t recorded = atomic_load_explicit(&slot->task_id, memory_order_relaxed);
    if (sequence == 0 || recorded == 0 || recorded == id) return false;
    if (!atomic_compare_exchange_strong_explicit(&slot->sequence, &sequence, 0, memory_order_seq_cst,
                                                 memory_order_relaxed)) {
        return false;
    }
    atomic_store_explicit(&slot->key, 0, memory_order_release);
    return true;
}

// Takes a slot for `key` in its window: returns its index, or -1. A free slot has no link. A span
// (`evict`) takes an alias's slot when the window has no other: aliases are the best effort.
static int claim(uint64_t key, bool evict) {
    unsigned base = home(key);
    bool task = evict && (key & 1) == 0;
    uint32_t id = task ? stallmon_live_task_id((const void *)(uintptr_t)key) : 0;
    for (int pass = 0; pass < (evict ? 2 : 1); pass++) {
        for (int step = 0; step < WINDOW; step++) {
            request_slot *slot = at(base, step);
            uint64_t seen = atomic_load_explicit(&slot->key, memory_order_acquire);
            if (seen != 0 && !free_alias(slot, pass == 1) && !(task && free_stale_owner(slot, key, id))) continue;
            seen = 0;
            // Sequentially consistent: see the span's store of MAYBE_OPEN after it, in
            // stallmon_request_register.
            if (atomic_compare_exchange_strong_explicit(&slot->key, &seen, key, memory_order_seq_cst,
                                                        memory_order_relaxed)) {
                return (int)((base + step) & SLOT_MASK);
            }
        }
    }
    return -1;
}

static inline void back_off(int spins);
static void watch_forks(void);
static pthread_once_t forks_watched = PTHREAD_ONCE_INIT;

int stallmon_request_register(uint64_t key, uint32_t depth, uint64_t *sequence, void **parts) {
    if (key == 0) return -1;
    if (__builtin_expect(!atomic_load_explicit(&used, memory_order_relaxed), 0)) {
        pthread_once(&forks_watched, watch_forks);
    }
    int index = claim(key, true);
    if (index < 0) {
        atomic_fetch_add_explicit(&refused, 1, memory_order_relaxed);
        return -1;
    }
    // A task's span, its slot claimed (a sequentially consistent swap): a sweep that starts after
    // this load sees the claim; one that started before it has put its own state, which this store
    // turns back, and the sweep's swap of its state to NONE_OPEN then fails.
    if ((key & 1) == 0 && atomic_load_explicit(&open_spans.state, memory_order_seq_cst) != MAYBE_OPEN) {
        atomic_store_explicit(&open_spans.state, MAYBE_OPEN, memory_order_seq_cst);
    }
    request_slot *slot = &slots[index];
    uint64_t number = (slot->registrations + 1) & ((1ULL << STALLMON_REQUEST_NUMBER_BITS) - 1);
    if ((number & SEQUENCE_MASK) == 0) number++;
    slot->registrations = number;
    atomic_store_explicit(&slot->depth, depth, memory_order_relaxed);
    atomic_store_explicit(&slot->task_id, (key & 1) == 0 ? stallmon_live_task_id((const void *)(uintptr_t)key) : 0,
                          memory_order_relaxed);
    *sequence = number;
    *parts = atomic_load_explicit(&slot->parts, memory_order_acquire);
    // Readers that found the slot's last registration copy its parts under the lock: done once it
    // is free, and later ones see this registration unpublished. Sequentially consistent, as the
    // withdrawal's swap of the sequence, a reader's lock and its load of the sequence are: either
    // this load sees the reader's lock, or the reader sees the sequence withdrawn (a reader's store
    // to the lock and its load of the sequence could otherwise be reordered, on arm64).
    for (int spins = 0; atomic_load_explicit(&slot->lock, memory_order_seq_cst) != 0; spins++) back_off(spins);
    return index;
}

static bool find_owner(uint64_t key, uint32_t id, stallmon_request_found *found);

int stallmon_request_register_current(uint64_t *key, stallmon_request_found *around, uint64_t *sequence,
                                      void **parts) {
    uint64_t current = stallmon_request_current_key();
    *key = current;
    around->slot = -1;
    around->depth = 0;
    around->sequence = 0;
    bool inside = (current & 1) == 0 && atomic_load_explicit(&used, memory_order_acquire) &&
                  find_owner(current, stallmon_live_task_id((const void *)(uintptr_t)current), around);
    return stallmon_request_register(current, inside ? around->depth + 1 : 0, sequence, parts);
}

void stallmon_request_publish(int index, uint64_t sequence) {
    if (index < 0 || index >= STALLMON_REQUEST_SLOTS) return;
    atomic_store_explicit(&slots[index].sequence, sequence, memory_order_release);
    if (!atomic_load_explicit(&used, memory_order_relaxed)) atomic_store_explicit(&used, 1, memory_order_release);
}

int stallmon_request_withdraw(int index, uint64_t sequence) {
    if (index < 0 || index >= STALLMON_REQUEST_SLOTS || sequence == 0) return 0;
    request_slot *slot = &slots[index];
    // Aliases of this owner and readers looking for it see it gone from here on; a copy of the span
    // ending it again, or a span ending after its slot was reclaimed, fails here. (Sequentially
    // consistent: see stallmon_request_register.)
    if (!atomic_compare_exchange_strong_explicit(&slot->sequence, &sequence, 0, memory_order_seq_cst,
                                                 memory_order_relaxed)) {
        return 0;
    }
    atomic_store_explicit(&slot->key, 0, memory_order_release);
    return 1;
}

void *stallmon_request_parts(int index) {
    if (index < 0 || index >= STALLMON_REQUEST_SLOTS) return NULL;
    return atomic_load_explicit(&slots[index].parts, memory_order_acquire);
}

void stallmon_request_set_parts(int index, void *parts) {
    if (index < 0 || index >= STALLMON_REQUEST_SLOTS) return;
    atomic_store_explicit(&slots[index].parts, parts, memory_order_release);
}

static inline void back_off(int spins) {
    if (spins < 64) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ volatile("yield");
#endif
    } else {
        sched_yield();
    }
}

void stallmon_request_lock(int index) {
    _Atomic uint32_t *lock = &slots[index & SLOT_MASK].lock;
    for (int spins = 0;; spins++) {
        uint32_t free = 0;
        if (atomic_compare_exchange_weak_explicit(lock, &free, 1, memory_order_seq_cst, memory_order_relaxed)) return;
        back_off(spins);
    }
}


void *stallmon_request_lock_held(int index, uint64_t sequence) {
    if (index < 0 || index >= STALLMON_REQUEST_SLOTS || sequence == 0) return NULL;
    request_slot *slot = &slots[index];
    stallmon_request_lock(index);
    void *parts = atomic_load_explicit(&slot->parts, memory_order_acquire);
    if (parts != NULL && atomic_load_explicit(&slot->sequence, memory_order_seq_cst) == sequence) return parts;
    stallmon_request_unlock(index);
    return NULL;
}

void stallmon_request_unlock(int index) { atomic_store_explicit(&slots[index & SLOT_MASK].lock, 0, memory_order_release); }

// The link of the owner serving `key`: its own innermost registration, else the owner its task
// inherited. For a task's address, `id` is the ID of the task that lives there now, as a live
// record has it (0: unknown), checked against the ID each registration or alias was made with.
static uint64_t find(uint64_t key, uint32_t id) {
    unsigned base = home(key);
    uint64_t best = 0, alias = 0;
    int64_t best_depth = -1;
    for (int step = 0; step < WINDOW; step++) {
        request_slot *slot = at(base, step);
        if (atomic_load_explicit(&slot->key, memory_order_acquire) != key) continue;
        uint64_t sequence = atomic_load_explicit(&slot->sequence, memory_order_acquire);
        if (sequence != 0) {
            // A span that a task never ended, at an address another task has now.
            if ((key & 1) == 0 && !same_task(atomic_load_explicit(&slot->task_id, memory_order_relaxed), id)) continue;
            int64_t depth = atomic_load_explicit(&slot->depth, memory_order_relaxed);
            if (depth > best_depth) {
                best_depth = depth;
                best = link_of((base + step) & SLOT_MASK, sequence, 0);
            }
        } else if (alias == 0 && (key & 1) == 0) {
            uint64_t link = atomic_load_explicit(&slot->link, memory_order_acquire);
            if (link_valid(link) && same_task(link_task_id(link), id)) alias = link;
        }
    }
    return best != 0 ? best : alias;
}

// The owner serving `key` (see find), with its whole registration number (a link keeps its low
// bits) and depth.
static bool find_owner(uint64_t key, uint32_t id, stallmon_request_found *found) {
    uint64_t link = find(key, id);
    if (link == 0) return false;
    uint64_t sequence = atomic_load_explicit(&slots[link_slot(link)].sequence, memory_order_acquire);
    if (sequence == 0 || (sequence & SEQUENCE_MASK) != link_sequence(link)) return false;
    found->slot = (int32_t)link_slot(link);
    found->sequence = sequence;
    found->depth = atomic_load_explicit(&slots[found->slot].depth, memory_order_relaxed);
    return true;
}

// The ID of the task at `key`, from a record made while it surely lived: the caller's own task, or
// a pool thread's running job (stamped as it started). 0 when none has it.
static uint32_t recorded_task_id(uint64_t key) {
    void *current = swift_task_getCurrent != NULL ? swift_task_getCurrent() : NULL;
    if ((uint64_t)(uintptr_t)current == key) return stallmon_live_task_id(current);
    uint32_t id = 0;
    return stallmon_pool_running_task_id((uintptr_t)key, &id) ? id : 0;
}

int stallmon_request_find(const uint64_t *keys, int count, stallmon_request_found *found) {
    if (!atomic_load_explicit(&used, memory_order_acquire)) return 0;
    for (int i = 0; i < count; i++) {
        if (keys[i] == 0) continue;
        uint32_t id = (keys[i] & 1) == 0 ? recorded_task_id(keys[i]) : 0;
        if (find_owner(keys[i], id, found)) return 1;
    }
    return 0;
}

int stallmon_request_find_task(uint64_t key, uint32_t task_id, stallmon_request_found *found) {
    if (!atomic_load_explicit(&used, memory_order_acquire) || key == 0) return 0;
    return find_owner(key, (key & 1) == 0 ? task_id : 0, found) ? 1 : 0;
}

// `job`, enqueued by the work of `current`, serves the request `current` serves. Only a task's job:
// an actor's job runs whatever tasks the actor has. A task keeps the request it has while that
// request lasts (the first that made or woke it); the request of a task that has ended is not
// passed on to the next one at its address (they differ by ID).
static void inherit_from(uint64_t current, void *job) {
    if (!is_task(job)) return;
    uint64_t owner = find(current, stallmon_live_task_id((const void *)(uintptr_t)current));
    if (owner == 0) return;
    uint32_t id = stallmon_live_task_id(job);
    uint64_t link = link_of(link_slot(owner), link_sequence(owner), id);
    uint64_t key = (uint64_t)(uintptr_t)job;
    unsigned base = home(key);
    for (int step = 0; step < WINDOW; step++) {
        request_slot *slot = at(base, step);
        if (atomic_load_explicit(&slot->key, memory_order_acquire) != key) continue;
        // A task that serves a request of its own keeps it (a span of a task that lived at this
        // address before, never ended, is not this task's).
        if (atomic_load_explicit(&slot->sequence, memory_order_acquire) != 0) {
            if (atomic_load_explicit(&slot->task_id, memory_order_relaxed) == id) return;
            continue;
        }
        uint64_t old = atomic_load_explicit(&slot->link, memory_order_acquire);
        // 0: another waker is making this alias, or it is being freed. The same task, its request
        // still open: it keeps it.
        if (old == 0 || (link_task_id(old) == id && link_valid(old))) return;
        if (atomic_compare_exchange_strong_explicit(&slot->link, &old, link, memory_order_acq_rel,
                                                    memory_order_relaxed) &&
            atomic_load_explicit(&slot->key, memory_order_acquire) != key) {
            // Freed and claimed for another key between the look and the swap: undo.
            uint64_t mine = link;
            atomic_compare_exchange_strong_explicit(&slot->link, &mine, old, memory_order_acq_rel, memory_order_relaxed);
        }
        return;
    }
    int index = claim(key, false);
    if (index < 0) return;
    atomic_store_explicit(&slots[index].link, link, memory_order_release);
    atomic_fetch_add_explicit(&inherited, 1, memory_order_relaxed);
}

void stallmon_request_inherit(void *job) {
    if (__builtin_expect(atomic_load_explicit(&open_spans.state, memory_order_relaxed) == NONE_OPEN, 1)) return;
    void *task = swift_task_getCurrent != NULL ? swift_task_getCurrent() : NULL;
    if (task == NULL || task == job) return;
    inherit_from((uint64_t)(uintptr_t)task, job);
}

void stallmon_request_inherit_for(uint64_t current, uint64_t job) {
    // As the hook: from a task's work only.
    if (atomic_load_explicit(&open_spans.state, memory_order_relaxed) == NONE_OPEN || current == 0 ||
        (current & 1) != 0 || current == job) {
        return;
    }
    inherit_from(current, (void *)(uintptr_t)job);
}

double stallmon_request_measure_inherit_ns(long jobs, uint64_t current) {
    // Zeroed jobs (tasks, by their kind), 64 bytes apart, as tasks are at least.
    static char fake_jobs[1024 * 64 + 64];
    uintptr_t base = ((uintptr_t)fake_jobs + 63) & ~(uintptr_t)63;
    uint64_t start = stallmon_now_ns();
    for (long i = 0; i < jobs; i++) {
        void *job = (void *)(base + (uintptr_t)(i % 1024) * 64);
        if (current == 0) {
            stallmon_request_inherit(job);
        } else {
            stallmon_request_inherit_for(current, (uint64_t)(uintptr_t)job);
        }
    }
    return jobs > 0 ? (double)(stallmon_now_ns() - start) / (double)jobs : 0;
}

static __thread uint64_t random_state __attribute__((tls_model("initial-exec")));

// splitmix64, from the calling thread's state (seeded from getrandom once per thread).
static inline uint64_t splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t thread_state(void) {
    uint64_t state = random_state;
    if (__builtin_expect(state == 0, 0)) {
        uint64_t seed = 0;
        if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
            seed = stallmon_now_ns() ^ (uint64_t)stallmon_gettid() << 32;
        }
        state = seed | 1;
    }
    return state;
}

static inline uint64_t non_zero(uint64_t *state) {
    uint64_t value;
    do value = splitmix(state);
    while (value == 0);
    return value;
}

void stallmon_request_new_ids(uint64_t *high, uint64_t *low, uint64_t *span) {
    uint64_t state = thread_state();
    if (high != NULL) {
        *high = non_zero(&state);
        *low = non_zero(&state);
    }
    *span = non_zero(&state);
    random_state = state;
}

int stallmon_request_used(void) { return atomic_load_explicit(&used, memory_order_acquire); }

// A task's span's start claims its slot, then sets MAYBE_OPEN unless it is set (both sequentially
// consistent). A sweep swaps MAYBE_OPEN for a state of its own (2 + a ticket: sweeps at once each
// have theirs), looks for a claimed slot of a task's span (not an alias's), and swaps its state for
// what it found. In the single order of those operations, a span whose load came before the sweep's
// first swap has its claim before the sweep's loads, which see it (or its end); a span whose load
// came after it (and read the sweep's state, or another's, or NONE_OPEN, or the MAYBE_OPEN that
// someone stored since) either stores MAYBE_OPEN, and the sweep's last swap fails or comes first,
// or finds MAYBE_OPEN stored after the sweep's first swap, which the sweep's last swap then fails
// on. So the state is NONE_OPEN only while no task's span is open, but for the moment between a
// span's claim and its store, before the span's work runs: the hook, which runs after the span's
// start in the span's task or in one it made, never misses it. A slot of a task that ended without
// ending its span keeps the state MAYBE_OPEN until a span of a task at its address takes it back.
int stallmon_request_sweep(void) {
    uint64_t state = atomic_load_explicit(&open_spans.state, memory_order_relaxed);
    if (state != MAYBE_OPEN) return state != NONE_OPEN;  // none open (one load), or a sweep looks
    uint64_t mine = FIRST_SWEEP + atomic_fetch_add_explicit(&open_spans.tickets, 1, memory_order_relaxed);
    if (!atomic_compare_exchange_strong_explicit(&open_spans.state, &state, mine, memory_order_seq_cst,
                                                 memory_order_relaxed)) {
        return state != NONE_OPEN;
    }
    atomic_fetch_add_explicit(&open_spans.sweeps, 1, memory_order_relaxed);
    bool open = false;
    for (int index = 0; index < STALLMON_REQUEST_SLOTS && !open; index++) {
        request_slot *slot = &slots[index];
        uint64_t key = atomic_load_explicit(&slot->key, memory_order_seq_cst);
        if (key == 0 || (key & 1) != 0) continue;
        // An owner published, or claimed and not yet (or an alias's slot whose link is being set,
        // or freed: taken as open, which errs on the safe side).
        open = atomic_load_explicit(&slot->sequence, memory_order_seq_cst) != 0 ||
               atomic_load_explicit(&slot->link, memory_order_seq_cst) == 0;
    }
    state = mine;
    atomic_compare_exchange_strong_explicit(&open_spans.state, &state, open ? MAYBE_OPEN : NONE_OPEN,
                                            memory_order_seq_cst, memory_order_relaxed);
    return open || state != mine;
}

int stallmon_request_may_be_open(void) {
    return atomic_load_explicit(&open_spans.state, memory_order_acquire) != NONE_OPEN;
}

uint64_t stallmon_request_sweeps(void) { return atomic_load_explicit(&open_spans.sweeps, memory_order_relaxed); }

int64_t stallmon_request_live(void) {
    int64_t count = 0;
    for (int index = 0; index < STALLMON_REQUEST_SLOTS; index++) {
        if (atomic_load_explicit(&slots[index].sequence, memory_order_relaxed) != 0) count++;
    }
    return count;
}
uint64_t stallmon_request_refused(void) { return atomic_load_explicit(&refused, memory_order_relaxed); }
uint64_t stallmon_request_inherited(void) { return atomic_load_explicit(&inherited, memory_order_relaxed); }

// MARK: - fork()

// In the child of fork(), on its one thread: every other thread is gone, and with it whatever it
// held. A slot whose lock was held (a reader's copy, a span's attributes, a stalled span's end) is
// unlocked, and its registration withdrawn: its parts may be half written, so they are let go too
// (never read, never reused: the slot's next span makes new ones). A slot claimed and not yet
// published (a span's start, an alias being made or freed) is freed. A sweep that was looking
// leaves the hook's sign set, for the next sweep to clear. The calling thread's thread ID and ID
// generator are its parent's: they start over.
static void after_fork_in_child(void) {
    for (int index = 0; index < STALLMON_REQUEST_SLOTS; index++) {
        request_slot *slot = &slots[index];
        if (atomic_load_explicit(&slot->lock, memory_order_relaxed) != 0) {
            atomic_store_explicit(&slot->sequence, 0, memory_order_relaxed);
            atomic_store_explicit(&slot->link, 0, memory_order_relaxed);
            atomic_store_explicit(&slot->key, 0, memory_order_relaxed);
            atomic_store_explicit(&slot->parts, NULL, memory_order_relaxed);
            atomic_store_explicit(&slot->lock, 0, memory_order_relaxed);
        } else if (atomic_load_explicit(&slot->key, memory_order_relaxed) != 0 &&
                   atomic_load_explicit(&slot->sequence, memory_order_relaxed) == 0 &&
                   atomic_load_explicit(&slot->link, memory_order_relaxed) == 0) {
            atomic_store_explicit(&slot->key, 0, memory_order_relaxed);
        }
    }
    if (atomic_load_explicit(&open_spans.state, memory_order_relaxed) >= FIRST_SWEEP) {
        atomic_store_explicit(&open_spans.state, MAYBE_OPEN, memory_order_relaxed);
    }
    cached_tid = 0;
    random_state = 0;
}

// Registered once, by the first registration (no lock is ever taken before one).
static void watch_forks(void) { (void)pthread_atfork(NULL, NULL, after_fork_in_child); }

void *stallmon_span_calls[STALLMON_SPAN_CALLS];

void stallmon_span_calls_set(uint64_t number, void *calls) {
    if (number < STALLMON_SPAN_CALLS) stallmon_span_calls[number] = calls;
}

#endif  // STALLMON_LINUX
