/* threads.c: the shim's threads (control server, workers, the drain's synchronize) and its log.
 *
 * Every shim thread blocks every signal except SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT (no
 * signal meant for the program lands on it) and is named GS_THREAD_NAME before its creator goes
 * on, so a freezer that looks right after can tell it from the program's threads.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "threads.h"

void gs_log(const char *fmt, ...)
{
    char line[512];
    int n = snprintf(line, sizeof(line), "[criu-gpushare %d] ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t unused = write(2, line, (size_t)n);
    (void)unused;
}

static void block_signals(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
        sigdelset(&all, fatal[i]);
    pthread_sigmask(SIG_BLOCK, &all, old);
}

struct start {
    void *(*fn)(void *);
    void *arg;
    sem_t *named;
};

static void *trampoline(void *p)
{
    struct start s = *(struct start *)p;
    free(p);
    block_signals(NULL);
    prctl(PR_SET_NAME, GS_THREAD_NAME, 0, 0, 0);
    sem_post(s.named);
    return s.fn(s.arg);
}

int gs_start_thread(void *(*fn)(void *), void *arg)
{
    struct start *s = malloc(sizeof(*s));
    if (!s)
        return -1;
    s->fn = fn;
    s->arg = arg;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    /* Created with signals blocked, so no signal meant for the app lands on it before it runs. */
    sigset_t old;
    block_signals(&old);
    pthread_t t;
    sem_t named;
    sem_init(&named, 0, 0);
    s->named = &named;
    int r = pthread_create(&t, &attr, trampoline, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r == 0) /* the thread carries its name before the caller goes on (a freezer may look) */
        while (sem_wait(&named) && errno == EINTR)
            ;
    sem_destroy(&named);
    pthread_attr_destroy(&attr);
    if (r) {
        free(s);
        return -1;
    }
    return 0;
}
