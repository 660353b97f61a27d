#include "stallbench.h"

#include <errno.h>

#if STALLMON_LINUX
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int stallbench_wait_counter(pid_t tid, uint64_t raw_sys_exit) {
    char filter[128];
    int length = 0;
#ifdef SYS_epoll_wait
    length += snprintf(filter + length, sizeof filter - length, "id == %d || ", SYS_epoll_wait);
#endif
    length += snprintf(filter + length, sizeof filter - length, "id == %d", SYS_epoll_pwait);
#ifdef SYS_epoll_pwait2
    snprintf(filter + length, sizeof filter - length, " || id == %d", SYS_epoll_pwait2);
#endif
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_TRACEPOINT;
    attr.config = raw_sys_exit;
    // Counting only (no sample period, no ring buffer); enabled once the filter is in place.
    attr.disabled = 1;
    long descriptor = syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (descriptor < 0) return -errno;
    if (ioctl((int)descriptor, PERF_EVENT_IOC_SET_FILTER, filter) != 0 ||
        ioctl((int)descriptor, PERF_EVENT_IOC_ENABLE, 0) != 0) {
        int error = errno;
        close((int)descriptor);
        return -error;
    }
    return (int)descriptor;
}

int64_t stallbench_counter_read(int descriptor) {
    uint64_t count = 0;
    ssize_t bytes = read(descriptor, &count, sizeof count);
    if (bytes != (ssize_t)sizeof count) return bytes < 0 ? -errno : -EIO;
    return (int64_t)count;
}

static long bpf_call(int command, union bpf_attr *attr) {
    return syscall(SYS_bpf, command, attr, sizeof *attr);
}

int stallbench_bpf_enable_run_time_stats(void) {
    union bpf_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.enable_stats.type = BPF_STATS_RUN_TIME;
    long descriptor = bpf_call(BPF_ENABLE_STATS, &attr);
    return descriptor < 0 ? -errno : (int)descriptor;
}

int64_t stallbench_bpf_next_program(uint32_t after) {
    union bpf_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.start_id = after;
    if (bpf_call(BPF_PROG_GET_NEXT_ID, &attr) < 0) return errno == ENOENT ? 0 : -errno;
    return attr.next_id;
}

int stallbench_bpf_program_stats(uint32_t id, char name[16], uint64_t *run_time_ns, uint64_t *run_count) {
    union bpf_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.prog_id = id;
    long descriptor = bpf_call(BPF_PROG_GET_FD_BY_ID, &attr);
    if (descriptor < 0) return -errno;
    struct bpf_prog_info info;
    memset(&info, 0, sizeof info);
    memset(&attr, 0, sizeof attr);
    attr.info.bpf_fd = (uint32_t)descriptor;
    attr.info.info_len = sizeof info;
    attr.info.info = (uint64_t)(uintptr_t)&info;
    long result = bpf_call(BPF_OBJ_GET_INFO_BY_FD, &attr);
    int error = errno;
    close((int)descriptor);
    if (result < 0) return -error;
    memcpy(name, info.name, 16);
    name[15] = 0;
    *run_time_ns = info.run_time_ns;
    *run_count = info.run_cnt;
    return 0;
}

#else

int stallbench_wait_counter(pid_t tid, uint64_t raw_sys_exit) {
    (void)tid, (void)raw_sys_exit;
    return -ENOSYS;
}

int64_t stallbench_counter_read(int descriptor) {
    (void)descriptor;
    return -ENOSYS;
}

int stallbench_bpf_enable_run_time_stats(void) { return -ENOSYS; }

int64_t stallbench_bpf_next_program(uint32_t after) {
    (void)after;
    return -ENOSYS;
}

int stallbench_bpf_program_stats(uint32_t id, char name[16], uint64_t *run_time_ns, uint64_t *run_count) {
    (void)id, (void)name, (void)run_time_ns, (void)run_count;
    return -ENOSYS;
}

#endif
