/* The floor for `shard apply`: the same mkdir + rename system calls with nothing else.
 *
 *   rename_floor [-s] ROOT PLAN
 *
 * PLAN holds one "BUCKET<TAB>NAME" line per file (BUCKET like "ab/cd"), grouped by bucket;
 * benchmarks/shard.py writes it (hashing is not timed: this is a lower bound).  For each new
 * bucket the program creates its levels with mkdirat() (EEXIST ignored) and opens it; each
 * file then moves with renameat(rootfd, NAME, bucketfd, NAME), exactly what manyfiles does
 * per file minus the no-replace check.  With -s it ends with syncfs(), as `shard apply` does
 * before it drops its journal.  Prints "files=N buckets=B seconds=S" (S measured inside the
 * process, plan reading excluded).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int make_bucket(int rootfd, char *rel) {
    /* mkdir each level: "ab", then "ab/cd" */
    for (char *p = rel; ; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdirat(rootfd, rel, 0777) != 0 && errno != EEXIST) {
                perror(rel);
                return -1;
            }
            *p = saved;
            if (saved == '\0')
                break;
        }
    }
    return openat(rootfd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

int main(int argc, char **argv) {
    int do_sync = 0, opt;
    while ((opt = getopt(argc, argv, "s")) != -1) {
        if (opt == 's')
            do_sync = 1;
        else {
            fprintf(stderr, "usage: rename_floor [-s] ROOT PLAN\n");
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "usage: rename_floor [-s] ROOT PLAN\n");
        return 2;
    }
    FILE *plan = fopen(argv[optind + 1], "r");
    if (!plan) {
        perror(argv[optind + 1]);
        return 1;
    }
    /* read the whole plan first so that only the file system work is timed */
    size_t cap = 1 << 20, len = 0;
    char **lines = malloc(cap * sizeof *lines);
    char *line = NULL;
    size_t n = 0;
    ssize_t got;
    while ((got = getline(&line, &n, plan)) > 0) {
        if (line[got - 1] == '\n')
            line[got - 1] = '\0';
        if (len == cap)
            lines = realloc(lines, (cap *= 2) * sizeof *lines);
        lines[len++] = strdup(line);
    }
    fclose(plan);

    int rootfd = open(argv[optind], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) {
        perror(argv[optind]);
        return 1;
    }
    double t0 = now();
    char current[64] = "";
    int bucketfd = -1;
    long buckets = 0;
    for (size_t i = 0; i < len; i++) {
        char *tab = strchr(lines[i], '\t');
        if (!tab)
            continue;
        *tab = '\0';
        char *name = tab + 1;
        if (strcmp(current, lines[i]) != 0) {
            if (bucketfd >= 0)
                close(bucketfd);
            snprintf(current, sizeof current, "%s", lines[i]);
            char rel[64];
            snprintf(rel, sizeof rel, "%s", lines[i]);
            bucketfd = make_bucket(rootfd, rel);
            if (bucketfd < 0) {
                perror(current);
                return 1;
            }
            buckets++;
        }
        if (renameat(rootfd, name, bucketfd, name) != 0) {
            perror(name);
            return 1;
        }
    }
    if (bucketfd >= 0)
        close(bucketfd);
    if (do_sync)
        syncfs(rootfd);
    double t1 = now();
    printf("files=%zu buckets=%ld seconds=%.6f\n", len, buckets, t1 - t0);
    return 0;
}
