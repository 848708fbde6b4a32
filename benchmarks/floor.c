/* The physical floor for directory listing: a bare getdents64 loop.
 *
 *   floor [-b BYTES] [-r] [-n REPEAT] DIR
 *
 * Lists DIR with syscall(SYS_getdents64) into a BYTES buffer (default 1 MiB) and counts
 * the entries (without . and ..).  With -r it walks the tree depth-first, single-threaded,
 * opening each subdirectory with openat() relative to its parent (no path building); a
 * DT_UNKNOWN entry is resolved with fstatat() so the walk is right on any filesystem.
 *
 * Prints one line per repetition: "entries=N dirs=D calls=C seconds=S cpu=U", where S
 * (wall) and U (user+sys CPU) are measured inside the process (open .. close), so process
 * start-up is not counted and the floor is as low as it can be.  benchmarks/listing.py compiles this with
 * _common.compile_c and compares everything else against it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

#define MAX_DEPTH 64

static size_t bufsize = 1 << 20;
static char *bufs[MAX_DEPTH + 1];   /* one buffer per depth: a parent's batch stays live while we recurse */
static unsigned long long n_entries, n_dirs, n_calls;
static int failed;

static int is_dot(const char *s) { return s[0] == '.' && (s[1] == 0 || (s[1] == '.' && s[2] == 0)); }

static void list_fd(int fd, int depth, int recursive, const char *label) {
    char *buf = depth <= MAX_DEPTH ? bufs[depth] : NULL;
    int own = 0;
    if (buf == NULL) {
        buf = malloc(bufsize);
        if (buf == NULL) { perror("malloc"); exit(2); }
        if (depth <= MAX_DEPTH) bufs[depth] = buf; else own = 1;
    }
    n_dirs++;
    for (;;) {
        long n = syscall(SYS_getdents64, fd, buf, bufsize);
        n_calls++;
        if (n < 0) { fprintf(stderr, "floor: %s: %s\n", label, strerror(errno)); failed = 1; break; }
        if (n == 0) break;
        for (long off = 0; off < n;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + off);
            off += d->d_reclen;
            if (is_dot(d->d_name)) continue;
            n_entries++;
            if (!recursive) continue;
            int is_dir = d->d_type == DT_DIR;
            if (d->d_type == DT_UNKNOWN) {
                struct stat st;
                is_dir = fstatat(fd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
            }
            if (!is_dir) continue;
            int sub = openat(fd, d->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) { fprintf(stderr, "floor: %s: %s\n", d->d_name, strerror(errno)); failed = 1; continue; }
            list_fd(sub, depth + 1, recursive, d->d_name);
            close(sub);
        }
    }
    if (own) free(buf);
}

static double now(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int recursive = 0, repeat = 1, opt;
    while ((opt = getopt(argc, argv, "b:rn:")) != -1) {
        switch (opt) {
        case 'b': bufsize = strtoull(optarg, NULL, 0); break;
        case 'r': recursive = 1; break;
        case 'n': repeat = atoi(optarg); break;
        default: goto usage;
        }
    }
    if (optind != argc - 1 || bufsize < 280 || repeat < 1) goto usage;
    for (int i = 0; i < repeat; i++) {
        n_entries = n_dirs = n_calls = 0;
        double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        int fd = open(argv[optind], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) { fprintf(stderr, "floor: %s: %s\n", argv[optind], strerror(errno)); return 1; }
        list_fd(fd, 0, recursive, argv[optind]);
        close(fd);
        double t1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_PROCESS_CPUTIME_ID);
        printf("entries=%llu dirs=%llu calls=%llu seconds=%.6f cpu=%.6f\n", n_entries, n_dirs, n_calls,
               t1 - t0, c1 - c0);
        fflush(stdout);
    }
    return failed;
usage:
    fprintf(stderr, "usage: floor [-b BYTES (>= 280)] [-r] [-n REPEAT] DIR\n");
    return 2;
}
