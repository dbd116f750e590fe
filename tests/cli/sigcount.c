/* Test helper for tests/cli (not installed): a CMD that counts the SIGINTs it receives.
 * Usage: sigcount READY STOP OUT - creates READY, waits until STOP exists, writes the count
 * to OUT. The handler runs as soon as a signal arrives (unlike a shell's trap, which waits
 * for the current command), so a signal delivered twice is counted twice. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t count;

static void on_int(int sig)
{
    (void)sig;
    count++;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_int;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0)
        return 3;
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return 4;
    close(fd);
    while (access(argv[2], F_OK) != 0) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    FILE *f = fopen(argv[3], "w");
    if (f == NULL)
        return 5;
    fprintf(f, "%d\n", (int)count);
    return fclose(f) == 0 ? 0 : 6;
}
