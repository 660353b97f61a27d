// The kernel's view of a thread of this process: its small /proc files read and parsed, each
// format in one place (see stallcapture_threadview.h). Paths are built without snprintf's locale
// machinery; a file is read with one open, read and close, into the caller's buffer.
//
// Called on watchdog threads (and by the Swift monitor's setup), never from a signal handler:
// stallmon_sample_handler in sampler.c calls none of it.

#define _GNU_SOURCE
#include "stallcapture_threadview.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/// Builds "/proc/self/task/<tid>/<name>", "/proc/thread-self/<name>" or "/proc/self/<name>" (no
/// "/<name>" when `name` is NULL) into `path`: 0, or -1 when it does not fit.
static int thread_path(pid_t tid, const char *name, char *path, size_t size) {
    if (tid <= 0 && tid != STALLMON_THREAD_SELF && tid != STALLMON_WHOLE_PROCESS) return -1;
    const char *prefix = tid == STALLMON_THREAD_SELF     ? "/proc/thread-self"
                         : tid == STALLMON_WHOLE_PROCESS ? "/proc/self"
                                                         : "/proc/self/task/";
    size_t used = strlen(prefix);
    memcpy(path, prefix, used);
    if (tid != STALLMON_THREAD_SELF && tid != STALLMON_WHOLE_PROCESS) {
        char digits[16];
        int count = 0;
        unsigned value = (unsigned)tid;
        do {
            digits[count++] = (char)('0' + value % 10);
            value /= 10;
        } while (value != 0 && count < (int)sizeof digits);
        while (count > 0) path[used++] = digits[--count];
    }
    size_t rest = name != NULL ? strlen(name) : 0;
    if (used + 1 + rest + 1 > size) return -1;
    if (name != NULL) {
        path[used++] = '/';
        memcpy(path + used, name, rest);
        used += rest;
    }
    path[used] = 0;
    return 0;
}

int stallmon_thread_file_open(pid_t tid, const char *name) {
    char path[96];
    if (thread_path(tid, name, path, sizeof path) != 0) return -1;
    return open(path, O_RDONLY | O_CLOEXEC);
}

ssize_t stallmon_thread_file_read(pid_t tid, const char *name, char *buffer, size_t size) {
    if (size == 0) return -1;
    int descriptor = stallmon_thread_file_open(tid, name);
    if (descriptor < 0) return -1;
    // A proc file is generated whole at its first read; the loop only takes what a short read left.
    size_t length = 0;
    while (length < size - 1) {
        ssize_t got = read(descriptor, buffer + length, size - 1 - length);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        length += (size_t)got;
    }
    close(descriptor);
    buffer[length] = 0;
    return length > 0 ? (ssize_t)length : -1;
}

int stallmon_thread_exists(pid_t tid) {
    char path[96];
    if (thread_path(tid, NULL, path, sizeof path) != 0) return 0;
    return access(path, F_OK) == 0;
}

// MARK: - syscall

static int parse_u64(const char **cursor, uint64_t *value) {
    const char *p = *cursor;
    while (*p == ' ') p++;
    char *end = NULL;
    errno = 0;
    unsigned long long parsed = strtoull(p, &end, 0);
    if (end == p || errno != 0) return 0;
    *value = (uint64_t)parsed;
    *cursor = end;
    return 1;
}

void stallmon_read_syscall(pid_t tid, stallmon_syscall_view *out) {
    memset(out, 0, sizeof *out);
    out->state = -1;
    char buffer[256];
    if (stallmon_thread_file_read(tid, "syscall", buffer, sizeof buffer) < 0) return;
    if (strncmp(buffer, "running", 7) == 0) {
        out->state = 1;
        return;
    }
    if (buffer[0] == '-') {
        out->state = 1;  // "-1 sp pc": blocked, but not in a system call
        return;
    }
    // "nr a1 … a6 sp pc"
    const char *cursor = buffer;
    uint64_t number = 0;
    if (!parse_u64(&cursor, &number)) return;
    out->number = (long)number;
    for (int i = 0; i < 6; i++) {
        if (!parse_u64(&cursor, &out->args[i])) return;
    }
    if (!parse_u64(&cursor, &out->sp) || !parse_u64(&cursor, &out->pc)) return;
    out->state = 0;
}

int stallmon_syscall_is_epoll_wait(long number) {
#if defined(__x86_64__)
    return number == 232 || number == 281 || number == 441;
#elif defined(__aarch64__)
    return number == 22 || number == 441;
#else
    (void)number;
    return 0;
#endif
}

// MARK: - schedstat

/// "<on-cpu ns> <run-queue ns> <timeslices>".
static int parse_schedstat(const char *text, stallmon_schedstat *out) {
    uint64_t fields[3];
    const char *cursor = text;
    for (int i = 0; i < 3; i++) {
        char *end;
        fields[i] = strtoull(cursor, &end, 10);
        if (end == cursor) return -1;
        cursor = end;
    }
    out->cpu_ns = fields[0];
    out->wait_ns = fields[1];
    out->runs = fields[2];
    return 0;
}

int stallmon_read_schedstat(pid_t tid, stallmon_schedstat *out) {
    char text[128];
    if (stallmon_thread_file_read(tid, "schedstat", text, sizeof text) < 0) return -1;
    return parse_schedstat(text, out);
}

int stallmon_pread_schedstat(int descriptor, stallmon_schedstat *out) {
    if (descriptor < 0) return -1;
    char text[128];
    ssize_t count;
    do {
        count = pread(descriptor, text, sizeof text - 1, 0);
    } while (count < 0 && errno == EINTR);
    if (count <= 0) return -1;
    text[count] = 0;
    return parse_schedstat(text, out);
}

// MARK: - status

/// The value of field `name` in the text of a status file: "Name:\tvalue" lines.
static int status_field(const char *text, const char *name, int base, uint64_t *value) {
    size_t length = strlen(name);
    for (const char *line = text; *line != 0;) {
        if (strncmp(line, name, length) == 0 && line[length] == ':') {
            const char *start = line + length + 1;
            char *end;
            unsigned long long parsed = strtoull(start, &end, base);
            if (end == start) return -1;
            *value = (uint64_t)parsed;
            return 1;
        }
        const char *newline = strchr(line, '\n');
        if (newline == NULL) break;
        line = newline + 1;
    }
    return 0;
}

int stallmon_read_status_field(pid_t tid, const char *name, int base, uint64_t *value) {
    char text[4096];
    if (stallmon_thread_file_read(tid, "status", text, sizeof text) < 0) return -1;
    return status_field(text, name, base, value);
}

#endif  // STALLMON_LINUX
