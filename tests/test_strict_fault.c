// The strict-memory backend catches what it is for (docs/strict_memory.md): the typed copies
// and kernels reach backend memory, a host dereference of it outside a kernel kills the
// process with the handler's message naming the byte and the allocation. Without this test a
// cpu-strict that protected nothing would pass every *_strict test.
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "layers/backend.h"
#include "test_util.h"

// In a child: allocates 100 reals on cpu-strict, and (touch) reads element 2 on the host.
static void child(int touch) {
    moe_backend *be;
    if (moe_backend_create(&be, "cpu-strict", NULL)) _exit(10);
    real host[100], back[100];
    for (int i = 0; i < 100; i++) host[i] = (real)i;
    real *dev = be->alloc(be, sizeof host);
    if (!dev) _exit(11);
    be->copy_to_device(be, dev, host, sizeof host);
    double s;
    be->sum(be, &s, dev, 100); // a kernel reads it
    be->copy_to_host(be, back, dev, sizeof back);
    if (s != 4950 || memcmp(host, back, sizeof host)) _exit(12);
    if (touch) {
        volatile real x = dev[2]; // the host dereference strict mode forbids
        (void)x;
        _exit(13); // not reached
    }
    be->free(be, dev);
    moe_backend_destroy(be);
    _exit(0);
}

// Runs child(touch) in a process of its own; its stderr into err, its wait status returned.
static int run_child(int touch, char *err, size_t cap) {
    int fd[2];
    if (pipe(fd)) exit(2);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        child(touch);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd[0], err + n, cap - 1 - n)) > 0) n += (size_t)r;
    err[n] = 0;
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    return status;
}

int main(void) {
    char err[8192];
    printf("copies and kernels reach cpu-strict memory\n");
    int status = run_child(0, err, sizeof err);
    check_true("exit 0, nothing reported",
               WIFEXITED(status) && WEXITSTATUS(status) == 0 && !err[0]);

    printf("a host read of cpu-strict memory outside a kernel dies, naming the byte\n");
    status = run_child(1, err, sizeof err);
    printf("    -> %.*s", (int)strcspn(err, "\n") + 1, err);
    // SIGSEGV (the default action), or an exit status under ASan, whose report follows ours
    check_true("the process dies (SIGSEGV, or the sanitizer's exit)",
               (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) ||
                   (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 13));
    check_true(
        "the handler's message: byte 8 of an allocation of a page",
        strstr(err, "cpu-strict: the host touched backend memory outside a kernel: address 0x") &&
            (strstr(err, ", byte 8 of an allocation of 4096\n") ||
             strstr(err, ", byte 8 of an allocation of 16384\n") ||
             strstr(err, ", byte 8 of an allocation of 65536\n")));
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
