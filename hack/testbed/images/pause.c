/*
 * pause - the pod sandbox's init process for real test-bed nodes: holds the pod's namespaces,
 * reaps orphans and exits on SIGINT/SIGTERM. Built static so its image needs no libc.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
    (void)sig;
    _exit(0);
}

static void on_child(int sig)
{
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

int main(void)
{
    struct sigaction stop = {.sa_handler = on_stop};
    struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &stop, NULL) || sigaction(SIGTERM, &stop, NULL) ||
        sigaction(SIGCHLD, &child, NULL))
        return 1;
    for (;;)
        pause();
}
