// The sampler under ThreadSanitizer: two watchdogs sample threads that run, a thread that blocks the
// signal and a thread that sleeps, while the process forks. Scripts/tsan-sampler.sh builds it with
// CStallCapture's C files and -fsanitize=thread; any report fails the run (exit 66).

#define _GNU_SOURCE
#include "stallcapture.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static _Atomic int stopping;
static _Atomic pid_t spinners[2];
static _Atomic pid_t blocked_thread;
static int sampling_signal;

static void *spin(void *argument) {
    int index = (int)(intptr_t)argument;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sampling_signal);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    atomic_store(&spinners[index], stallmon_gettid());
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    volatile uint64_t hash = 0;
    while (!atomic_load(&stopping)) {
        for (int i = 0; i < 1000; i++) hash = (hash ^ (uint64_t)i) * 0x100000001b3ULL;
        // An intercepted call: ThreadSanitizer delivers a signal at the next one.
        pthread_mutex_lock(&lock);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

static void *block(void *argument) {
    (void)argument;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sampling_signal);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    atomic_store(&blocked_thread, stallmon_gettid());
    while (!atomic_load(&stopping)) usleep(1000);
    return NULL;
}

typedef struct {
    int rounds;
    int answered;
    int frames;
    int statuses[8];
} watch_result;

static void *watch(void *argument) {
    watch_result *result = argument;
    int slot = stallmon_sampler_slot_claim();
    if (slot < 0) return NULL;
    stallmon_sample sample;
    for (int round = 0; round < result->rounds; round++) {
        pid_t target = round % 3 == 2 ? atomic_load(&blocked_thread) : atomic_load(&spinners[round % 2]);
        stallmon_sample_thread(slot, target, sampling_signal, 64, 20000000, &sample);
        if (sample.status >= 0 && sample.status < 8) result->statuses[sample.status]++;
        if (sample.status == STALLMON_SAMPLE_OK && sample.source == STALLMON_STACK_SIGNAL) {
            result->answered++;
            if (sample.frame_count > result->frames) result->frames = sample.frame_count;
            if (sample.sampled_tid != target) {
                fprintf(stderr, "sample of %d answered by %d\n", (int)target, (int)sample.sampled_tid);
                exit(1);
            }
        }
    }
    stallmon_sampler_slot_release(slot);
    return NULL;
}

int main(void) {
    sampling_signal = stallmon_sigrtmax() - 4;
    if (stallmon_sampler_install(sampling_signal) != 0) {
        fprintf(stderr, "cannot install the sampling handler\n");
        return 1;
    }
    pthread_t threads[3];
    for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, spin, (void *)(intptr_t)i);
    pthread_create(&threads[2], NULL, block, NULL);
    while (!atomic_load(&spinners[0]) || !atomic_load(&spinners[1]) || !atomic_load(&blocked_thread)) usleep(1000);

    watch_result results[2] = {{.rounds = 1500}, {.rounds = 1500}};
    pthread_t watchdogs[2];
    for (int i = 0; i < 2; i++) pthread_create(&watchdogs[i], NULL, watch, &results[i]);
    int forks = 0, failed = 0;
    for (int i = 0; i < 20; i++) {
        usleep(20000);
        pid_t child = fork();
        if (child == 0) _exit(stallmon_module_count() > 0 ? 0 : 3);
        int status = 0;
        if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            forks++;
        } else {
            failed++;
        }
    }
    for (int i = 0; i < 2; i++) pthread_join(watchdogs[i], NULL);
    atomic_store(&stopping, 1);
    for (int i = 0; i < 3; i++) pthread_join(threads[i], NULL);

    int answered = results[0].answered + results[1].answered;
    // ThreadSanitizer holds one pending signal per number and thread while it defers delivery, so
    // about half the samples two watchdogs ask of one thread at once time out under it; without it
    // every running thread answers (the blocked one, a third of the visits, never does).
    // Each watchdog is answered by the threads the other was answered by: a signal lost in the
    // sanitizer's deferral is not waited for again (the kernel's SigPnd no longer has it).
    int passed = (answered >= 600 && results[0].answered >= 300 && results[1].answered >= 300) +
                 (results[0].frames > 2 && results[1].frames > 2) + (failed == 0);
    printf("samples answered %d of %d, deepest %d frames, %d children of fork exited, %d failed\n", answered,
           results[0].rounds + results[1].rounds, results[0].frames > results[1].frames ? results[0].frames : results[1].frames,
           forks, failed);
    for (int i = 0; i < 2; i++) {
        printf("watchdog %d: answered %d, deepest %d frames, statuses", i, results[i].answered, results[i].frames);
        for (int status = 0; status < 8; status++) printf(" %d", results[i].statuses[status]);
        printf("\n");
    }
    printf("%d passed, %d failed\n", passed, 3 - passed);
    return passed == 3 ? 0 : 1;
}
