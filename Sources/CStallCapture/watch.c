// The watchdog's wait for event loops: an io_uring whose one-shot poll requests watch the loops'
// epoll descriptors (raw system calls: no liburing needed), and the eventfd that wakes it. A poll
// of an epoll descriptor completes with the wakeup itself, so a loop that consumes its events
// before the watchdog runs is still seen waking (see stallcapture_ticks.h).

#define _GNU_SOURCE
#include "stallcapture_ticks.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>

struct stallmon_watch {
    int fd;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_ring, *cq_ring;
    size_t sq_size, cq_size, sqes_size;
    unsigned sq_entries;
};

stallmon_watch *stallmon_watch_create(unsigned entries, int *error) {
    struct io_uring_params params;
    memset(&params, 0, sizeof params);
    int fd = (int)syscall(__NR_io_uring_setup, entries, &params);
    if (fd < 0) {
        *error = errno;
        return NULL;
    }
    stallmon_watch *watch = calloc(1, sizeof *watch);
    if (watch == NULL) {
        close(fd);
        *error = ENOMEM;
        return NULL;
    }
    watch->fd = fd;
    watch->sq_entries = params.sq_entries;
    watch->sq_size = params.sq_off.array + params.sq_entries * sizeof(unsigned);
    watch->cq_size = params.cq_off.cqes + params.cq_entries * sizeof(struct io_uring_cqe);
    int single = (params.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single) {
        if (watch->cq_size > watch->sq_size) watch->sq_size = watch->cq_size;
        watch->cq_size = 0;
    }
    watch->sq_ring = mmap(NULL, watch->sq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                          IORING_OFF_SQ_RING);
    watch->cq_ring = single ? watch->sq_ring
                            : mmap(NULL, watch->cq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                                   IORING_OFF_CQ_RING);
    watch->sqes_size = params.sq_entries * sizeof(struct io_uring_sqe);
    watch->sqes = mmap(NULL, watch->sqes_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (watch->sq_ring == MAP_FAILED || watch->cq_ring == MAP_FAILED || watch->sqes == MAP_FAILED) {
        *error = errno;
        stallmon_watch_free(watch);
        return NULL;
    }
    char *sq = watch->sq_ring;
    char *cq = watch->cq_ring;
    watch->sq_head = (unsigned *)(sq + params.sq_off.head);
    watch->sq_tail = (unsigned *)(sq + params.sq_off.tail);
    watch->sq_mask = (unsigned *)(sq + params.sq_off.ring_mask);
    watch->sq_array = (unsigned *)(sq + params.sq_off.array);
    watch->cq_head = (unsigned *)(cq + params.cq_off.head);
    watch->cq_tail = (unsigned *)(cq + params.cq_off.tail);
    watch->cq_mask = (unsigned *)(cq + params.cq_off.ring_mask);
    watch->cqes = (struct io_uring_cqe *)(cq + params.cq_off.cqes);
    return watch;
}

void stallmon_watch_free(stallmon_watch *watch) {
    if (watch == NULL) return;
    if (watch->sqes != NULL && watch->sqes != MAP_FAILED) munmap(watch->sqes, watch->sqes_size);
    if (watch->cq_ring != NULL && watch->cq_ring != MAP_FAILED && watch->cq_ring != watch->sq_ring)
        munmap(watch->cq_ring, watch->cq_size);
    if (watch->sq_ring != NULL && watch->sq_ring != MAP_FAILED) munmap(watch->sq_ring, watch->sq_size);
    close(watch->fd);
    free(watch);
}

int stallmon_watch_poll(stallmon_watch *watch, int fd, uint64_t key) {
    unsigned tail = *watch->sq_tail;
    unsigned head = __atomic_load_n(watch->sq_head, __ATOMIC_ACQUIRE);
    if (tail - head >= watch->sq_entries) return -EBUSY;
    unsigned index = tail & *watch->sq_mask;
    struct io_uring_sqe *sqe = &watch->sqes[index];
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = IORING_OP_POLL_ADD;
    sqe->fd = fd;
    sqe->poll32_events = POLLIN;
    sqe->user_data = key;
    watch->sq_array[index] = index;
    __atomic_store_n(watch->sq_tail, tail + 1, __ATOMIC_RELEASE);
    for (;;) {
        long submitted = syscall(__NR_io_uring_enter, watch->fd, 1, 0, 0, NULL, 0);
        if (submitted == 1) return 0;
        if (submitted < 0 && errno == EINTR) continue;
        return submitted < 0 ? -errno : -EAGAIN;
    }
}

static int reap(stallmon_watch *watch, uint64_t *keys, int capacity) {
    int count = 0;
    unsigned head = *watch->cq_head;
    unsigned tail = __atomic_load_n(watch->cq_tail, __ATOMIC_ACQUIRE);
    while (head != tail && count < capacity) {
        keys[count++] = watch->cqes[head & *watch->cq_mask].user_data;
        head++;
    }
    __atomic_store_n(watch->cq_head, head, __ATOMIC_RELEASE);
    return count;
}

int stallmon_watch_wait(stallmon_watch *watch, uint64_t timeout_ns, uint64_t *keys, int capacity) {
    int ready = reap(watch, keys, capacity);
    if (ready > 0 || timeout_ns == 0) return ready;
    struct __kernel_timespec timeout = {
        .tv_sec = (long long)(timeout_ns / 1000000000ULL),
        .tv_nsec = (long long)(timeout_ns % 1000000000ULL),
    };
    struct io_uring_getevents_arg argument;
    memset(&argument, 0, sizeof argument);
    argument.ts = timeout_ns == UINT64_MAX ? 0 : (uint64_t)(uintptr_t)&timeout;
    long rc = syscall(__NR_io_uring_enter, watch->fd, 0, 1, IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
                      &argument, sizeof argument);
    if (rc < 0 && errno != ETIME && errno != EINTR) return -errno;
    return reap(watch, keys, capacity);
}

int stallmon_eventfd_create(void) {
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return fd < 0 ? -errno : fd;
}

void stallmon_eventfd_signal(int fd) {
    uint64_t one = 1;
    ssize_t written = write(fd, &one, sizeof one);
    (void)written;
}

#endif  // STALLMON_LINUX
