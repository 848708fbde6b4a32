/* The unlink floor: T pthreads unlinking N pre-created empty files, FxMark-style.
 *
 *   unlink_floor shared  DIR THREADS N   all threads unlink in DIR (FxMark MWUM)
 *   unlink_floor private DIR THREADS N   thread i unlinks in DIR/t<i> (FxMark MWUL)
 *
 * Files are created first (untimed, by the same threads and layout), then every thread
 * unlinks its own N/THREADS names with unlinkat() relative to an open directory fd.
 * Prints one line: "<seconds> <files>" for the unlink phase only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int shared_mode;
static const char *root;
static long per_thread;
static pthread_barrier_t barrier;
static struct timespec t_start, t_end;

static int open_dir(long tid) {
    char path[4096];
    if (shared_mode)
        snprintf(path, sizeof path, "%s", root);
    else {
        snprintf(path, sizeof path, "%s/t%ld", root, tid);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) { perror(path); exit(1); }
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) { perror(path); exit(1); }
    return fd;
}

static void *worker(void *arg) {
    long tid = (long)arg;
    int dfd = open_dir(tid);
    char name[64];
    for (long i = 0; i < per_thread; i++) {
        snprintf(name, sizeof name, "t%ld-%08ld", tid, i);
        int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) { perror(name); exit(1); }
        close(fd);
    }
    pthread_barrier_wait(&barrier);
    if (tid == 0) clock_gettime(CLOCK_MONOTONIC, &t_start);
    pthread_barrier_wait(&barrier);
    for (long i = 0; i < per_thread; i++) {
        snprintf(name, sizeof name, "t%ld-%08ld", tid, i);
        if (unlinkat(dfd, name, 0) != 0) { perror(name); exit(1); }
    }
    pthread_barrier_wait(&barrier);
    if (tid == 0) clock_gettime(CLOCK_MONOTONIC, &t_end);
    if (!shared_mode) {
        char sub[32];
        snprintf(sub, sizeof sub, "t%ld", tid);
        int rfd = open(root, O_RDONLY | O_DIRECTORY);
        unlinkat(rfd, sub, AT_REMOVEDIR);
        close(rfd);
    }
    close(dfd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s shared|private DIR THREADS N\n", argv[0]);
        return 2;
    }
    shared_mode = strcmp(argv[1], "shared") == 0;
    root = argv[2];
    long threads = atol(argv[3]);
    long n = atol(argv[4]);
    if (threads < 1 || n < threads) { fprintf(stderr, "bad THREADS/N\n"); return 2; }
    per_thread = n / threads;
    mkdir(root, 0755);
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    pthread_t *tids = calloc((size_t)threads, sizeof *tids);
    for (long t = 0; t < threads; t++) pthread_create(&tids[t], NULL, worker, (void *)t);
    for (long t = 0; t < threads; t++) pthread_join(tids[t], NULL);
    double secs = (double)(t_end.tv_sec - t_start.tv_sec) + (double)(t_end.tv_nsec - t_start.tv_nsec) / 1e9;
    printf("%.6f %ld\n", secs, per_thread * threads);
    return 0;
}
