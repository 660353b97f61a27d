// stallmond: blocks SIGHUP, then becomes the daemon (stallmond-daemon, beside this file) by exec,
// same process, same arguments.
//
// SIGHUP's default action ends a process, and `systemctl reload` may send one at any moment after
// exec. The daemon is a Swift program: before its first instruction the dynamic loader maps and
// relocates some 34 libraries (the Swift runtime and Foundation most of it), 6-10 ms on a loaded
// two-core machine, and the libraries' initializers follow; even its .preinit_array comes too late.
// This program is static and links no Swift (Package.swift: -static-executable -nostartfiles), so
// it blocks SIGHUP a few tenths of a millisecond after exec. The mask survives exec and every
// thread the daemon creates inherits it: a SIGHUP that comes while the daemon starts stays pending
// until its dispatch source reads it (a reload), and never ends it. One that comes before this
// program's first instruction ends it: no program can catch that one.

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char daemon_name[] = "stallmond-daemon";

/// The daemon's path: this executable's directory (/proc/self/exe, else argv[0]) and its name; the
/// name alone, looked up in PATH, when neither has a directory.
static int daemon_path(const char *program, char *path, size_t size) {
    ssize_t length = readlink("/proc/self/exe", path, size - 1);
    if (length >= (ssize_t)size - 1) return -1;  // cut short: no path to trust
    if (length > 0) {
        path[length] = '\0';
    } else if (program != NULL && strlen(program) < size) {
        strcpy(path, program);
    } else {
        path[0] = '\0';
    }
    char *slash = strrchr(path, '/');
    size_t directory = slash == NULL ? 0 : (size_t)(slash - path) + 1;
    if (directory + sizeof daemon_name > size) return -1;
    memcpy(path + directory, daemon_name, sizeof daemon_name);
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    sigset_t hang_up;
    sigemptyset(&hang_up);
    sigaddset(&hang_up, SIGHUP);
    sigprocmask(SIG_BLOCK, &hang_up, NULL);

    char path[PATH_MAX];
    if (daemon_path(argv[0], path, sizeof path) != 0) {
        fprintf(stderr, "stallmond: cannot name %s: the path is too long\n", daemon_name);
        return 126;
    }
    // The file beside this one, never a shell's reading of it (execvp runs a file the kernel
    // refuses as a script); a bare name only when this file's own path has no directory.
    if (strchr(path, '/') != NULL) {
        execv(path, argv);
    } else {
        execvp(path, argv);
    }
    int error = errno;
    fprintf(stderr, "stallmond: cannot run %s: %s\n", path, strerror(error));
    // As env(1) and nohup(1): 127 when the program is not there, 126 when it cannot be run.
    return error == ENOENT ? 127 : 126;
}
