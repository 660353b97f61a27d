#include "stallwatch.h"

#if defined(STALLMON_LINUX)

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

extern const unsigned char stallwatch_ticks_object[];
extern const unsigned long stallwatch_ticks_object_size;

struct stallwatch {
    struct bpf_object *object;
    struct bpf_link *links[16];
    int link_count;
    int watched_fd;
    int ticks_fd;
    /// The `user_registers` iterator, NULL where the kernel refused it (another architecture, a
    /// kernel without bpf_task_pt_regs or task iterators by TID).
    struct bpf_program *registers;
    // stallwatch_read's batch buffers, grown to the largest capacity asked; `batching` 0 once the
    // kernel refused a batch lookup (then one lookup per entry).
    uint32_t *keys;
    struct stallwatch_tick *values;
    int buffer_capacity;
    int batching;
};

/// libbpf's last warning, for stallwatch_open's failure. libbpf calls its print function on the
/// thread that calls it, and stallwatch_open is serialized by its one owner.
static char stallwatch_libbpf_last[256];

/// libbpf's messages: the last warning or error kept (its first line), its debug chatter dropped.
static int stallwatch_libbpf_print(enum libbpf_print_level level, const char *format, va_list arguments) {
    if (level == LIBBPF_DEBUG) return 0;
    vsnprintf(stallwatch_libbpf_last, sizeof stallwatch_libbpf_last, format, arguments);
    stallwatch_libbpf_last[strcspn(stallwatch_libbpf_last, "\n")] = 0;
    return 0;
}

static void stallwatch_fail(stallwatch_failure *failure, stallwatch_step step, int error, const char *detail) {
    failure->step = step;
    failure->error = error < 0 ? -error : error;
    snprintf(failure->detail, sizeof failure->detail, "%s", detail ? detail : "");
    snprintf(failure->libbpf_message, sizeof failure->libbpf_message, "%s", stallwatch_libbpf_last);
}

/// Whether tracepoint `name` (`syscalls/sys_enter_epoll_wait`) is there to attach to, in tracefs
/// where libbpf looks for it.
static int stallwatch_tracepoint_exists(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/sys/kernel/tracing/events/%s", name);
    if (access(path, F_OK) == 0) return 1;
    snprintf(path, sizeof path, "/sys/kernel/debug/tracing/events/%s", name);
    return access(path, F_OK) == 0;
}

/// The system call tracepoints are there to attach to: tracefs is mounted where libbpf looks.
static int stallwatch_has_tracefs(void) { return stallwatch_tracepoint_exists("syscalls/sys_enter_epoll_wait"); }

/// Leaves out the programs of tracepoints this kernel does not have: epoll_pwait2 came with Linux
/// 5.11, and a kernel may be built without io_uring. The others are there wherever the program
/// can load.
static void stallwatch_skip_missing_tracepoints(struct bpf_object *object) {
    struct bpf_program *program;
    bpf_object__for_each_program(program, object) {
        const char *section = bpf_program__section_name(program);
        if (strncmp(section, "tracepoint/", 11) == 0 && !stallwatch_tracepoint_exists(section + 11)) {
            bpf_program__set_autoload(program, false);
        }
    }
}

static int stallwatch_is_iterator(const struct bpf_program *program) {
    return strncmp(bpf_program__section_name(program), "iter/", 5) == 0;
}

/// Opens the embedded object into `watch->object` and loads it, its iterator too when
/// `with_registers`. 0, or -1 with `failure` filled (`watch->object` NULL when it did not open).
static int stallwatch_load(stallwatch *watch, stallwatch_failure *failure, int with_registers) {
    LIBBPF_OPTS(bpf_object_open_opts, options, .object_name = "stallmon_ticks");
    watch->object = bpf_object__open_mem(stallwatch_ticks_object, stallwatch_ticks_object_size, &options);
    long error = libbpf_get_error(watch->object);
    if (error) {
        watch->object = NULL;
        stallwatch_fail(failure, STALLWATCH_STEP_OPEN, (int)error, "embedded object");
        return -1;
    }
    stallwatch_skip_missing_tracepoints(watch->object);
    struct bpf_program *program;
    bpf_object__for_each_program(program, watch->object) {
        if (!with_registers && stallwatch_is_iterator(program)) bpf_program__set_autoload(program, false);
    }
    int loaded = bpf_object__load(watch->object);
    if (loaded) {
        stallwatch_fail(failure, STALLWATCH_STEP_LOAD, loaded, "stallmon_ticks");
        return -1;
    }
    return 0;
}

stallwatch *stallwatch_open(uint64_t threshold_ns, stallwatch_failure *failure) {
    memset(failure, 0, sizeof *failure);
    stallwatch_libbpf_last[0] = 0;
    libbpf_set_print(stallwatch_libbpf_print);
    if (access("/sys/kernel/btf/vmlinux", R_OK) != 0) {
        stallwatch_fail(failure, STALLWATCH_STEP_BTF, errno, "/sys/kernel/btf/vmlinux");
        return NULL;
    }
    if (!stallwatch_has_tracefs()) {
        stallwatch_fail(failure, STALLWATCH_STEP_TRACEFS, ENOENT, "/sys/kernel/tracing/events/syscalls");
        return NULL;
    }
    stallwatch *watch = calloc(1, sizeof *watch);
    if (watch) watch->batching = 1;
    if (!watch) {
        stallwatch_fail(failure, STALLWATCH_STEP_OPEN, ENOMEM, "");
        return NULL;
    }
    // With the registers iterator first; a kernel that refuses it still gets the tick watcher.
    int loaded = stallwatch_load(watch, failure, 1);
    if (loaded == 0) {
        watch->registers = bpf_object__find_program_by_name(watch->object, "user_registers");
    } else if (watch->object != NULL) {
        bpf_object__close(watch->object);
        watch->object = NULL;
        loaded = stallwatch_load(watch, failure, 0);
    }
    if (loaded) {
        stallwatch_close(watch);
        return NULL;
    }
    watch->watched_fd = bpf_object__find_map_fd_by_name(watch->object, "watched");
    watch->ticks_fd = bpf_object__find_map_fd_by_name(watch->object, "ticks");
    int config_fd = bpf_object__find_map_fd_by_name(watch->object, "config");
    uint32_t zero = 0;
    struct stat namespace;
    if (stat("/proc/self/ns/pid", &namespace) != 0) {
        stallwatch_fail(failure, STALLWATCH_STEP_CONFIG, errno, "/proc/self/ns/pid");
        stallwatch_close(watch);
        return NULL;
    }
    struct stallwatch_config config = {.threshold_ns = threshold_ns,
                                       .pid_namespace_device = (unsigned long long)namespace.st_dev,
                                       .pid_namespace_inode = (unsigned long long)namespace.st_ino};
    if (watch->watched_fd < 0 || watch->ticks_fd < 0 || config_fd < 0
        || bpf_map_update_elem(config_fd, &zero, &config, BPF_ANY) != 0) {
        stallwatch_fail(failure, STALLWATCH_STEP_CONFIG, errno, "config");
        stallwatch_close(watch);
        return NULL;
    }
    struct bpf_program *program;
    bpf_object__for_each_program(program, watch->object) {
        // The iterator is attached to one thread at a time, by stallwatch_blocked_registers.
        if (!bpf_program__autoload(program) || stallwatch_is_iterator(program)) continue;
        struct bpf_link *link = bpf_program__attach(program);
        long error = libbpf_get_error(link);
        if (error || watch->link_count == (int)(sizeof watch->links / sizeof watch->links[0])) {
            if (!error) bpf_link__destroy(link);
            stallwatch_fail(failure, STALLWATCH_STEP_ATTACH, error ? (int)error : E2BIG,
                            bpf_program__section_name(program));
            stallwatch_close(watch);
            return NULL;
        }
        watch->links[watch->link_count++] = link;
    }
    return watch;
}

int stallwatch_watch(stallwatch *watch, uint32_t tgid) {
    uint8_t yes = 1;
    return bpf_map_update_elem(watch->watched_fd, &tgid, &yes, BPF_ANY) ? -errno : 0;
}

int stallwatch_unwatch(stallwatch *watch, uint32_t tgid) {
    return bpf_map_delete_elem(watch->watched_fd, &tgid) ? -errno : 0;
}

int stallwatch_forget(stallwatch *watch, uint32_t tid) {
    return bpf_map_delete_elem(watch->ticks_fd, &tid) ? -errno : 0;
}

int stallwatch_tick_of(stallwatch *watch, uint32_t tid, struct stallwatch_tick *tick) {
    return bpf_map_lookup_elem(watch->ticks_fd, &tid, tick) ? -errno : 0;
}

int stallwatch_blocked_registers(stallwatch *watch, uint32_t tid, struct stallwatch_user_registers *registers) {
    if (!watch->registers) return -EOPNOTSUPP;
    union bpf_iter_link_info target;
    memset(&target, 0, sizeof target);
    target.task.tid = tid;
    LIBBPF_OPTS(bpf_iter_attach_opts, options, .link_info = &target, .link_info_len = sizeof target);
    struct bpf_link *link = bpf_program__attach_iter(watch->registers, &options);
    long error = libbpf_get_error(link);
    if (error) return (int)error;
    int result = -ENOENT;
    int descriptor = bpf_iter_create(bpf_link__fd(link));
    if (descriptor < 0) {
        result = -errno;
    } else {
        // One record for the one thread; none when it is gone. Room for two, to tell a kernel that
        // does not filter by TID: Linux 5.15 to 6.0 ignore `task.tid` and visit every task, and
        // 6.1 to 6.6 without the fix "bpf: Fix iter/task tid filtering" (6.7, backported to
        // stable kernels) visit only the main thread of the TID's process, so a loop thread, never
        // its process's main thread, gets no record though it lives.
        struct stallwatch_user_registers read_back[2];
        ssize_t got = read(descriptor, read_back, sizeof read_back);
        if (got == (ssize_t)sizeof *registers) {
            *registers = read_back[0];
            result = 0;
        } else if (got < 0) {
            result = -errno;
        } else {
            char path[64];
            snprintf(path, sizeof path, "/proc/%u/syscall", tid);
            if (got > (ssize_t)sizeof *registers || access(path, F_OK) == 0) {
                // This kernel cannot aim the iterator at one thread: the walk from sp and pc alone,
                // without an attach a look for nothing.
                watch->registers = NULL;
                result = -EOPNOTSUPP;
            }
        }
        close(descriptor);
    }
    bpf_link__destroy(link);
    return result;
}

/// One lookup per entry: two system calls each. For kernels that refuse batch lookups of hashes.
static int stallwatch_read_one_by_one(stallwatch *watch, stallwatch_thread *threads, int capacity) {
    int count = 0;
    uint32_t key = 0, next;
    const void *previous = NULL;
    while (count < capacity && bpf_map_get_next_key(watch->ticks_fd, previous, &next) == 0) {
        key = next;
        previous = &key;
        // An entry removed between the two calls (its thread ended) is skipped.
        if (bpf_map_lookup_elem(watch->ticks_fd, &key, &threads[count].tick) == 0) {
            threads[count].tid = key;
            count++;
        }
    }
    return count;
}

int stallwatch_read(stallwatch *watch, stallwatch_thread *threads, int capacity) {
    if (capacity <= 0) return 0;
    if (watch->batching && watch->buffer_capacity < capacity) {
        uint32_t *keys = realloc(watch->keys, (size_t)capacity * sizeof *keys);
        if (keys) watch->keys = keys;
        struct stallwatch_tick *values = realloc(watch->values, (size_t)capacity * sizeof *values);
        if (values) watch->values = values;
        if (keys && values) watch->buffer_capacity = capacity;
    }
    if (!watch->batching || watch->buffer_capacity < capacity) {
        return stallwatch_read_one_by_one(watch, threads, capacity);
    }
    // Every entry in as few system calls as the kernel allows (a bucket at a time at worst): a scan
    // costs the same whatever the number of loops, where one lookup per entry cost two calls each.
    int count = 0;
    uint32_t batch = 0;
    void *in = NULL;
    LIBBPF_OPTS(bpf_map_batch_opts, options);
    while (count < capacity) {
        uint32_t got = (uint32_t)(capacity - count);
        int result = bpf_map_lookup_batch(watch->ticks_fd, in, &batch, watch->keys + count, watch->values + count,
                                          &got, &options);
        int error = result ? errno : 0;
        count += (int)got;
        if (error == ENOENT) break;  // the map's end
        // The next bucket holds more entries than the room left: a larger buffer reads them all.
        if (error == ENOSPC) return -ENOSPC;
        if (error) {
            if (count == 0 && error == EINVAL) {
                watch->batching = 0;
                return stallwatch_read_one_by_one(watch, threads, capacity);
            }
            break;
        }
        in = &batch;
    }
    for (int i = 0; i < count; i++) {
        threads[i].tid = watch->keys[i];
        threads[i].tick = watch->values[i];
    }
    return count;
}

void stallwatch_close(stallwatch *watch) {
    if (!watch) return;
    for (int i = watch->link_count - 1; i >= 0; i--) bpf_link__destroy(watch->links[i]);
    bpf_object__close(watch->object);
    free(watch->keys);
    free(watch->values);
    free(watch);
}

uint64_t stallwatch_now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

#endif
