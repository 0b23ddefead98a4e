/* threads.h: the shim's own threads and its log. Layer 0. */
#ifndef GS_THREADS_H
#define GS_THREADS_H

/* The name every shim thread carries (/proc/<pid>/task/<tid>/comm), for freezers to spare. */
#define GS_THREAD_NAME "criu-gpushare"

/* Starts a detached thread that blocks every signal but the fatal ones and is named
 * GS_THREAD_NAME before this returns. 0, or -1. */
int gs_start_thread(void *(*fn)(void *), void *arg);
/* One line on stderr, prefixed with "[criu-gpushare <pid>]". */
void gs_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
