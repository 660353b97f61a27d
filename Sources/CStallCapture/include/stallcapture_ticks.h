#ifndef STALLMON_STALLCAPTURE_TICKS_H
#define STALLMON_STALLCAPTURE_TICKS_H

// Event loops that tell us when a tick ends (SwiftNIO's metrics delegate; ticks.c), and the
// watchdog's wait on their epoll descriptors (watch.c). Whether such a loop is idle in epoll_wait
// comes from the kernel's view of its thread (stallcapture_threadview.h).

#include "stallcapture.h"

#include <stdint.h>
#include <sys/types.h>

#include "stallmon_platform.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(STALLMON_LINUX)

/// What the loop thread publishes at the end of every tick; read by the watchdog.
typedef struct stallmon_ticks stallmon_ticks;

/// Creates tick state (zeroed) for one loop thread, or NULL. Freed with stallmon_ticks_free once
/// no thread is bound to it any more.
stallmon_ticks *stallmon_ticks_create(void);
void stallmon_ticks_free(stallmon_ticks *ticks);

/// Binds the calling thread to `ticks` (NULL unbinds): stallmon_tick on this thread then counts
/// into it.
void stallmon_ticks_bind(stallmon_ticks *ticks);

/// Has the loop thread count each tick's duration (its end less its start) into a latency
/// histogram owned by `ticks` (freed with it). Call it before a thread is bound. Returns 0 or -ENOMEM.
int stallmon_ticks_enable_latency(stallmon_ticks *ticks);
/// The tick-duration histogram, NULL unless enabled.
const stallmon_latency *stallmon_ticks_latency(const stallmon_ticks *ticks);

/// Loop thread, at the end of every tick that began at `start_ns`: two relaxed loads, two stores
/// (one release), no system call, no lock, no allocation; with a latency histogram, two loads and
/// two stores more. Does nothing on a thread that is not bound.
void stallmon_tick(uint64_t start_ns, uint64_t end_ns);

/// A heartbeat: the watchdog hands it to a loop that has no tick delegate (any SwiftNIO group), and
/// the loop runs it between its work items. It counts as a tick that ended now: it proves that the
/// loop got past whatever it ran before. Call it on the loop's thread, the only writer of `ticks`
/// besides stallmon_tick on the same thread. One clock read, two loads, two stores.
void stallmon_ticks_beat(stallmon_ticks *ticks);
/// 1 once stallmon_tick (a metrics delegate) has counted a tick into `ticks`: the loop's ticks are
/// known exactly and need no heartbeat.
int stallmon_ticks_delegated(const stallmon_ticks *ticks);

/// The number of ticks so far and the end of the latest (0 before the first).
uint64_t stallmon_ticks_sequence(const stallmon_ticks *ticks);
uint64_t stallmon_ticks_latest_end(const stallmon_ticks *ticks);

/// Asks the loop to record the end of the first tick after `sequence` (0 stops watching).
void stallmon_ticks_watch(stallmon_ticks *ticks, uint64_t sequence);
/// When that tick has ended, stores its end and returns 1; 0 otherwise.
int stallmon_ticks_watched_end(const stallmon_ticks *ticks, uint64_t sequence, uint64_t *end_ns);

// MARK: - The watchdog's wait: an io_uring whose poll requests watch the loops' epoll descriptors

/// A poll of an epoll descriptor completes with the wakeup itself: io_uring takes the event mask
/// from the wakeup and does not poll the descriptor again, so a loop that consumes its events
/// before the watchdog runs is still seen waking. (A nested epoll instance or poll(2) checks the
/// descriptor again when the watcher runs, and then misses such a wakeup.)
typedef struct stallmon_watch stallmon_watch;

/// Creates the ring (room for `entries` pending polls) or returns NULL and stores errno in `error`
/// (ENOSYS or EPERM where io_uring is unavailable or disabled).
stallmon_watch *stallmon_watch_create(unsigned entries, int *error);
void stallmon_watch_free(stallmon_watch *watch);
/// Submits a one-shot poll for readability of `fd` under `key`. Returns 0 or -errno.
int stallmon_watch_poll(stallmon_watch *watch, int fd, uint64_t key);
/// Waits until a poll completes, at most `timeout_ns` (UINT64_MAX: without limit), then stores the
/// keys of the completed polls (at most `capacity`). Returns their number (0 after a timeout or an
/// interruption) or -errno.
int stallmon_watch_wait(stallmon_watch *watch, uint64_t timeout_ns, uint64_t *keys, int capacity);

/// An eventfd (close-on-exec, non-blocking) to wake the watchdog with, or -errno.
int stallmon_eventfd_create(void);
/// Makes the eventfd readable.
void stallmon_eventfd_signal(int fd);

#endif  // STALLMON_LINUX

#ifdef __cplusplus
}
#endif

#endif
