// The tick watcher's BPF program: on the system call tracepoints of the waits every event loop and
// run loop on Linux sleeps in (epoll_wait, epoll_pwait, epoll_pwait2, io_uring_enter waiting for
// completions), it records per thread of a watched process when its latest wait began and returned.
// stallmond fills `watched` with the processes' TGIDs and scans `ticks`; a thread out of its wait
// past the threshold is stalled.
//
// Built by Scripts/build-bpf.sh into ../ticks_object.c, which embeds the object; SwiftPM never
// compiles this file (Package.swift excludes the folder). The system call tracepoints' record has
// the tracing ABI's layout (`__syscall_nr` at offset 8, the arguments or the return value from
// offset 16: /sys/kernel/tracing/events/syscalls/*/format). The one kernel structure it reads, a
// task's CPU time, is declared here with preserve_access_index, so libbpf relocates the read
// against the running kernel's BTF (CO-RE) and no generated vmlinux.h is needed. Its own BTF (-g)
// describes its maps, as libbpf requires.
#include <linux/bpf.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

#include "../include/stallwatch_ticks.h"

char LICENSE[] SEC("license") = "GPL";

/// The watched processes, by TGID; stallmond adds and removes them.
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, __u32);
    __type(value, __u8);
} watched SEC(".maps");

/// The loops of the watched processes, by TID.
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct stallwatch_tick);
} ticks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct stallwatch_config);
} config SEC(".maps");

/// The fields of the kernel's task that the program reads, by name: CO-RE finds their offsets in
/// the running kernel's BTF (/sys/kernel/btf/vmlinux).
struct sched_entity {
    __u64 sum_exec_runtime;
} __attribute__((preserve_access_index));

struct task_struct {
    struct sched_entity se;
} __attribute__((preserve_access_index));

/// The calling thread's time on a CPU, as the scheduler last accounted it (at its latest switch or
/// scheduler tick; /proc/PID/task/TID/schedstat shows the same sum).
static __always_inline __u64 cpu_time(void) {
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    return BPF_CORE_READ(task, se.sum_exec_runtime);
}

/// A system call tracepoint's record: the common header, then `__syscall_nr`, then from offset 16
/// the arguments (sys_enter_*) or the return value (sys_exit_*).
struct syscall_enter {
    __u64 common;
    __s32 syscall_nr;
    __s32 pad;
    __u64 args[6];
};

/// The calling thread's TGID and TID as stallmond sees them (in its PID namespace): 0, or -1 for a
/// thread outside that namespace (or before stallmond configured the program).
static __always_inline int current_ids(struct stallwatch_config **settings, __u32 *tgid, __u32 *tid) {
    __u32 zero = 0;
    *settings = bpf_map_lookup_elem(&config, &zero);
    if (!*settings || !(*settings)->pid_namespace_inode) return -1;
    struct bpf_pidns_info ids;
    if (bpf_get_ns_current_pid_tgid((*settings)->pid_namespace_device, (*settings)->pid_namespace_inode, &ids,
                                    sizeof ids))
        return -1;
    *tgid = ids.tgid;
    *tid = ids.pid;
    return 0;
}

/// The wait begins: the thread's tick ends. A thread is a loop from its first wait on.
static __always_inline int wait_begins(void) {
    struct stallwatch_config *settings;
    __u32 tgid, tid;
    if (current_ids(&settings, &tgid, &tid)) return 0;
    if (!bpf_map_lookup_elem(&watched, &tgid)) return 0;
    __u64 now = bpf_ktime_get_ns();
    struct stallwatch_tick *tick = bpf_map_lookup_elem(&ticks, &tid);
    if (!tick) {
        struct stallwatch_tick first = {.wait_start_ns = now, .tgid = tgid, .waits = 1};
        bpf_map_update_elem(&ticks, &tid, &first, BPF_NOEXIST);
        return 0;
    }
    __u64 start = tick->tick_start_ns;
    // A tick ends only once: a wait that begins while the thread is in one (not possible for one
    // thread, but a TID reused by a new thread whose entry was not yet removed) ends nothing.
    if (start > tick->wait_start_ns && now - start >= settings->threshold_ns) {
        tick->long_tick_start_ns = start;
        tick->long_tick_cpu_ns = cpu_time() - tick->tick_start_cpu_ns;
        tick->long_tick_end_ns = now;
    }
    tick->waits += 1;
    tick->wait_start_ns = now;
    return 0;
}

/// The wait returns: a tick begins, for a thread that was in a wait.
static __always_inline int wait_returns(void) {
    struct stallwatch_config *settings;
    __u32 tgid, tid;
    if (current_ids(&settings, &tgid, &tid)) return 0;
    struct stallwatch_tick *tick = bpf_map_lookup_elem(&ticks, &tid);
    if (!tick || tick->wait_start_ns < tick->tick_start_ns) return 0;
    tick->tick_start_cpu_ns = cpu_time();
    tick->tick_start_ns = bpf_ktime_get_ns();
    return 0;
}

SEC("tracepoint/syscalls/sys_enter_epoll_wait")
int enter_epoll_wait(struct syscall_enter *context) { return wait_begins(); }

SEC("tracepoint/syscalls/sys_exit_epoll_wait")
int exit_epoll_wait(void *context) { return wait_returns(); }

SEC("tracepoint/syscalls/sys_enter_epoll_pwait")
int enter_epoll_pwait(struct syscall_enter *context) { return wait_begins(); }

SEC("tracepoint/syscalls/sys_exit_epoll_pwait")
int exit_epoll_pwait(void *context) { return wait_returns(); }

SEC("tracepoint/syscalls/sys_enter_epoll_pwait2")
int enter_epoll_pwait2(struct syscall_enter *context) { return wait_begins(); }

SEC("tracepoint/syscalls/sys_exit_epoll_pwait2")
int exit_epoll_pwait2(void *context) { return wait_returns(); }

/// io_uring_enter(fd, to_submit, min_complete, flags, …) waits only with IORING_ENTER_GETEVENTS
/// and min_complete > 0; a call that only submits is work inside the tick.
SEC("tracepoint/syscalls/sys_enter_io_uring_enter")
int enter_io_uring_enter(struct syscall_enter *context) {
    __u64 min_complete = context->args[2];
    __u64 flags = context->args[3];
    if (!(flags & 1) || (__u32)min_complete == 0) return 0;
    return wait_begins();
}

SEC("tracepoint/syscalls/sys_exit_io_uring_enter")
int exit_io_uring_enter(void *context) { return wait_returns(); }

/// A thread of a watched process ends: its loop is gone. Inside a tick past the threshold (a
/// service killed while it stalls: by its watchdog, by an operator), the exit ends that tick, and
/// the entry stays for stallmond to read; any other is removed.
SEC("tracepoint/sched/sched_process_exit")
int thread_exits(void *context) {
    struct stallwatch_config *settings;
    __u32 tgid, tid;
    if (current_ids(&settings, &tgid, &tid)) return 0;
    if (!bpf_map_lookup_elem(&watched, &tgid)) return 0;
    struct stallwatch_tick *tick = bpf_map_lookup_elem(&ticks, &tid);
    if (!tick) return 0;
    __u64 now = bpf_ktime_get_ns();
    __u64 start = tick->tick_start_ns;
    if (start > tick->wait_start_ns && now - start >= settings->threshold_ns) {
        tick->long_tick_start_ns = start;
        tick->long_tick_cpu_ns = cpu_time() - tick->tick_start_cpu_ns;
        tick->long_tick_end_ns = now;
        tick->exit_ns = now;
        return 0;
    }
    bpf_map_delete_elem(&ticks, &tid);
    return 0;
}

// MARK: - A blocked thread's registers

/// The user registers the kernel saves at the top of a task's kernel stack when it enters the
/// kernel (x86-64's `struct pt_regs`, by field name: CO-RE finds them in the running kernel's BTF;
/// on another architecture the names do not resolve and stallmond loads the program without this
/// iterator).
struct pt_regs___x86_64 {
    unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, ip, sp;
} __attribute__((preserve_access_index));

struct bpf_iter_meta {
    struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__task {
    struct bpf_iter_meta *meta;
    struct task_struct *task;
} __attribute__((preserve_access_index));

/// Writes the user registers of the task the iterator visits: stallmond attaches it to one thread
/// (the link's `task.tid`, in stallmond's PID namespace) that sits blocked in a system call, for
/// the callee-saved registers (rbp above all) that /proc/PID/task/TID/syscall does not give: with
/// them the unwinding goes on through frame-pointer frames to the thread's start. Reads only; the
/// thread is not stopped.
SEC("iter/task")
int user_registers(struct bpf_iter__task *context) {
    struct task_struct *task = context->task;
    if (!task) return 0;
    struct pt_regs___x86_64 *registers = (struct pt_regs___x86_64 *)bpf_task_pt_regs(task);
    if (!registers) return 0;
    struct stallwatch_user_registers out = {
        .dwarf = {BPF_CORE_READ(registers, ax), BPF_CORE_READ(registers, dx), BPF_CORE_READ(registers, cx),
                  BPF_CORE_READ(registers, bx), BPF_CORE_READ(registers, si), BPF_CORE_READ(registers, di),
                  BPF_CORE_READ(registers, bp), BPF_CORE_READ(registers, sp), BPF_CORE_READ(registers, r8),
                  BPF_CORE_READ(registers, r9), BPF_CORE_READ(registers, r10), BPF_CORE_READ(registers, r11),
                  BPF_CORE_READ(registers, r12), BPF_CORE_READ(registers, r13), BPF_CORE_READ(registers, r14),
                  BPF_CORE_READ(registers, r15)},
        .pc = BPF_CORE_READ(registers, ip),
    };
    bpf_seq_write(context->meta->seq, &out, sizeof out);
    return 0;
}
