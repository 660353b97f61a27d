// The sampling signal: the action stallmon installs for it (sampler.c's handler), what its
// disposition is now (a program may take the signal over at any time: the sampler asks just before
// each send), and what it did to a system call it interrupted.
//
// Runs on the threads that install the monitor and on the watchdog, never in the handler.

#define _GNU_SOURCE
#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "sampler.h"
#include "unwind.h"

static _Atomic int installed_signals[65];

int stallmon_signal_disposition(int signo) {
    struct sigaction current;
    if (sigaction(signo, NULL, &current) != 0) return -1;
    if (current.sa_flags & SA_SIGINFO) {
        return current.sa_sigaction == stallmon_sample_handler ? STALLMON_DISPOSITION_OURS
                                                               : STALLMON_DISPOSITION_FOREIGN;
    }
    if (current.sa_handler == SIG_DFL) return STALLMON_DISPOSITION_DEFAULT;
    if (current.sa_handler == SIG_IGN) return STALLMON_DISPOSITION_IGNORED;
    return STALLMON_DISPOSITION_FOREIGN;
}

int stallmon_signal_in_use(int signo) {
    struct sigaction current;
    if (sigaction(signo, NULL, &current) != 0) return 1;
    if (current.sa_flags & SA_SIGINFO) return current.sa_sigaction != stallmon_sample_handler;
    return current.sa_handler != SIG_DFL;
}

/// Keeps the code of the handler mapped for the life of the process: a library that holds it,
/// loaded with dlopen, would otherwise leave a handler pointing at unmapped code once closed.
static void pin_image(void) {
    Dl_info info;
    if (dladdr((void *)stallmon_sample_handler, &info) == 0 || info.dli_fname == NULL || info.dli_fname[0] == 0) return;
    // RTLD_NOLOAD: the image already loaded, nothing new; RTLD_NODELETE: never unmapped, whatever
    // dlclose is called later. (The main executable needs no pin; one more reference is harmless.)
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

static pthread_once_t pin_once = PTHREAD_ONCE_INIT;

/// The handler's action: the sampling signals block each other while it runs (it never nests in
/// itself), and it runs on the thread's alternate stack where the thread has one.
static void sampling_action(struct sigaction *action) {
    memset(action, 0, sizeof *action);
    action->sa_sigaction = stallmon_sample_handler;
    action->sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&action->sa_mask);
    sigaddset(&action->sa_mask, SIGPROF);
    for (int signo = 1; signo <= 64; signo++) {
        if (atomic_load(&installed_signals[signo])) sigaddset(&action->sa_mask, signo);
    }
}

int stallmon_sampler_install(int signo) {
    if (signo <= 0 || signo > 64) return -EINVAL;
    stallmon_sampler_initialize();
    if (atomic_load(&installed_signals[signo])) return 0;
    if (stallmon_signal_in_use(signo)) return -EBUSY;
    // The handler copies the stack through /proc/self/mem: open before any signal is sent.
    if (stallmon_memory_open() < 0) return -EACCES;
    pthread_once(&pin_once, pin_image);
    atomic_store(&installed_signals[signo], 1);
    struct sigaction action;
    sampling_action(&action);
    if (sigaction(signo, &action, NULL) != 0) {
        int error = errno;
        atomic_store(&installed_signals[signo], 0);
        return -error;
    }
    // The signals installed before it now block this one too, while they are still ours.
    for (int other = 1; other <= 64; other++) {
        if (other == signo || !atomic_load(&installed_signals[other])) continue;
        if (stallmon_signal_disposition(other) != STALLMON_DISPOSITION_OURS) continue;
        sigaction(other, &action, NULL);
    }
    return 0;
}

/// Whether the register copy shows a system call that the signal ended with EINTR: the kernel
/// returns to the instruction after it with -EINTR in the result register (a call it restarts
/// goes back to the instruction itself instead). The code is read through /proc/self/mem.
int stallmon_interrupted_system_call(const stallmon_captured_registers *registers) {
#if defined(__x86_64__)
    if ((long long)registers->values[0] != -EINTR) return 0;  // rax
    unsigned char code[2];
    uintptr_t pc = registers->values[STALLMON_CAPTURED_PC];
    if (pc < 2 || stallmon_memory_read(code, sizeof code, pc - 2) != (ssize_t)sizeof code) return 0;
    return code[0] == 0x0f && code[1] == 0x05;  // syscall
#else
    (void)registers;
    return 0;
#endif
}

#endif  // STALLMON_LINUX
