/*
 * manyfiles._dents: the native listing core.
 *
 * A directory is read with getdents64(2) into a caller-chosen buffer (default 1 MiB)
 * instead of readdir(3)'s ~32 KiB, which matters on network filesystems where every
 * batch is a round trip.  The GIL is released during each syscall, and the fast
 * paths (count, write_names) release it for the whole loop and create no Python
 * object per entry.
 *
 * Only syscalls and buffer parsing live here: paths, sorting, error wording and
 * recursion are the Python side's (manyfiles/listing.py).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdint.h>
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

/* A 255-byte name needs 19 header bytes + 256 (with NUL), padded to 8: 280. */
#define MIN_BUFSIZE 280
#define DEFAULT_BUFSIZE (1 << 20)
#define OUT_BUFSIZE (256 * 1024)

/* Test hook: report every d_type as DT_UNKNOWN, as sshfs, NFSv3 READDIR and XFS
 * ftype=0 do, so the fstatat fallback is exercised on any filesystem. */
static int force_unknown = 0;

typedef struct {
    /* filters; pattern pointers borrow from Python bytes objects kept alive by the caller */
    const char **include;
    Py_ssize_t n_include;
    const char **exclude;
    Py_ssize_t n_exclude;
    unsigned types;   /* bit (1 << DT_x) per wanted type; 0 = all */
    int resolve;      /* resolve DT_UNKNOWN with fstatat */
} Filter;

typedef struct {
    int fd;
    char *buf;
    size_t size;
    PyObject *path;    /* for error messages; may be NULL */
    PyObject *batches; /* list to append (start_ns, dur_ns, nbytes, nentries) to; may be NULL */
    /* batch accounting, flushed by record_batch() */
    int64_t t0, dur;
    long nbytes;
    long nentries;
} Reader;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static unsigned char type_from_mode(mode_t m) {
    switch (m & S_IFMT) {
    case S_IFREG: return DT_REG;
    case S_IFDIR: return DT_DIR;
    case S_IFLNK: return DT_LNK;
    case S_IFBLK: return DT_BLK;
    case S_IFCHR: return DT_CHR;
    case S_IFIFO: return DT_FIFO;
    case S_IFSOCK: return DT_SOCK;
    default: return DT_UNKNOWN;
    }
}

/* Reads the next batch into r->buf (GIL released).  Returns bytes read, 0 at the end,
 * -1 with errno set.  EINVAL means "buffer too small for the next record": grow and retry. */
static long read_batch_nogil(Reader *r) {
    for (;;) {
        r->t0 = r->batches ? now_ns() : 0;
        long n = syscall(SYS_getdents64, r->fd, r->buf, r->size);
        if (r->batches) r->dur = now_ns() - r->t0;
        if (n >= 0) {
            r->nbytes = n;
            return n;
        }
        if (errno == EINTR) continue;
        if (errno == EINVAL && r->size < (1u << 26)) {
            char *bigger = realloc(r->buf, r->size * 2);
            if (!bigger) { errno = ENOMEM; return -1; }
            r->buf = bigger;
            r->size *= 2;
            continue;
        }
        return -1;
    }
}

static long read_batch(Reader *r) {
    long n;
    Py_BEGIN_ALLOW_THREADS
    n = read_batch_nogil(r);
    Py_END_ALLOW_THREADS
    if (n < 0) PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, r->path);
    return n;
}

static int record_batch(Reader *r) {
    if (!r->batches || r->nbytes == 0) return 0;
    PyObject *t = Py_BuildValue("(LLll)", (long long)r->t0, (long long)r->dur, r->nbytes, r->nentries);
    if (!t) return -1;
    int rc = PyList_Append(r->batches, t);
    Py_DECREF(t);
    r->nentries = 0;
    return rc;
}

static int is_dot(const char *name) {
    return name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0));
}

/* Decides whether an entry passes the filter; resolves its type when needed. */
static int keep_entry(const Filter *f, int dirfd, const struct linux_dirent64 *d, unsigned char *type) {
    *type = force_unknown ? DT_UNKNOWN : d->d_type;
    for (Py_ssize_t i = 0; i < f->n_exclude; i++)
        if (fnmatch(f->exclude[i], d->d_name, 0) == 0) return 0;
    if (f->n_include) {
        int matched = 0;
        for (Py_ssize_t i = 0; i < f->n_include && !matched; i++)
            matched = fnmatch(f->include[i], d->d_name, 0) == 0;
        if (!matched) return 0;
    }
    if (*type == DT_UNKNOWN && (f->resolve || f->types)) {
        struct stat st;
        if (fstatat(dirfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) *type = type_from_mode(st.st_mode);
        /* vanished meanwhile: keep it as unknown, like ls */
    }
    return !f->types || (f->types & (1u << *type));
}

/* ---- argument helpers ------------------------------------------------------- */

static int reader_init(Reader *r, int fd, Py_ssize_t bufsize, PyObject *path, PyObject *batches) {
    memset(r, 0, sizeof(*r));
    if (bufsize < MIN_BUFSIZE) bufsize = MIN_BUFSIZE;
    r->fd = fd;
    r->size = (size_t)bufsize;
    r->buf = malloc(r->size);
    r->path = (path == Py_None) ? NULL : path;
    r->batches = (batches == Py_None || batches == NULL) ? NULL : batches;
    if (r->batches && !PyList_Check(r->batches)) {
        free(r->buf);
        PyErr_SetString(PyExc_TypeError, "batches must be a list or None");
        return -1;
    }
    if (!r->buf) { PyErr_NoMemory(); return -1; }
    return 0;
}

/* Fills an array of C strings from a tuple of bytes (borrowed; the tuple outlives the call). */
static int patterns_from(PyObject *seq, const char ***out, Py_ssize_t *n) {
    *out = NULL;
    *n = 0;
    if (seq == NULL || seq == Py_None) return 0;
    if (!PyTuple_Check(seq)) {
        PyErr_SetString(PyExc_TypeError, "patterns must be a tuple of bytes");
        return -1;
    }
    *n = PyTuple_GET_SIZE(seq);
    if (*n == 0) return 0;
    *out = PyMem_Calloc((size_t)*n, sizeof(char *));
    if (!*out) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *b = PyTuple_GET_ITEM(seq, i);
        if (!PyBytes_Check(b)) {
            PyErr_SetString(PyExc_TypeError, "patterns must be bytes");
            return -1;
        }
        (*out)[i] = PyBytes_AS_STRING(b);
    }
    return 0;
}

static int filter_init(Filter *f, PyObject *include, PyObject *exclude, unsigned types, int resolve) {
    memset(f, 0, sizeof(*f));
    f->types = types;
    f->resolve = resolve;
    if (patterns_from(include, &f->include, &f->n_include) < 0) return -1;
    return patterns_from(exclude, &f->exclude, &f->n_exclude);
}

static void filter_free(Filter *f) {
    PyMem_Free(f->include);
    PyMem_Free(f->exclude);
}

static PyObject *make_name(const char *name, int as_bytes) {
    size_t len = strlen(name);
    /* os.listdir's decoding: the filesystem encoding with surrogateescape */
    return as_bytes ? PyBytes_FromStringAndSize(name, (Py_ssize_t)len)
                    : PyUnicode_DecodeFSDefaultAndSize(name, (Py_ssize_t)len);
}

/* ---- list building ------------------------------------------------------------ */

static PyObject *entry_type = NULL;     /* manyfiles.listing.Entry, set by _set_entry_type */
static PyObject *type_letters[256];     /* d_type -> interned one-letter str */

/* Appends the entries of the batch in r->buf to `out`, as names or as Entry tuples. */
static int parse_into(Reader *r, const Filter *f, long n, int as_bytes, int want_entries, PyObject *out) {
    for (long pos = 0; pos < n;) {
        struct linux_dirent64 *d = (struct linux_dirent64 *)(r->buf + pos);
        pos += d->d_reclen;
        unsigned char type;
        if (is_dot(d->d_name) || !keep_entry(f, r->fd, d, &type)) continue;
        PyObject *name = make_name(d->d_name, as_bytes);
        if (!name) return -1;
        PyObject *item = name;
        if (want_entries) {
            /* Entry is a NamedTuple (a tuple subclass without __dict__): fill it directly,
             * as tuple.__new__ would, without the Python-level __new__. */
            PyObject *ino = PyLong_FromUnsignedLongLong(d->d_ino);
            PyTypeObject *t = (PyTypeObject *)entry_type;
            item = ino ? t->tp_alloc(t, 3) : NULL;
            if (!item) {
                Py_DECREF(name);
                Py_XDECREF(ino);
                return -1;
            }
            PyTuple_SET_ITEM(item, 0, name);
            PyTuple_SET_ITEM(item, 1, Py_NewRef(type_letters[type]));
            PyTuple_SET_ITEM(item, 2, ino);
            /* Only a str and two ints inside: it can never be part of a cycle, so keep it
             * away from the cyclic GC, which otherwise walks every entry of a huge listing
             * again and again (CPython untracks such tuples itself, but only later). */
            PyObject_GC_UnTrack(item);
        }
        int rc = PyList_Append(out, item);
        Py_DECREF(item);
        if (rc < 0) return -1;
        r->nentries++;
    }
    return record_batch(r);
}

#define COMMON_KWLIST "fd", "bufsize", "as_bytes", "include", "exclude", "types", "resolve", "path", "batches"

typedef struct {
    int fd, as_bytes, resolve;
    Py_ssize_t bufsize;
    unsigned types;
    PyObject *include, *exclude, *path, *batches;
} CommonArgs;

static int parse_common(PyObject *args, PyObject *kw, CommonArgs *a) {
    static char *kwlist[] = {COMMON_KWLIST, NULL};
    a->bufsize = DEFAULT_BUFSIZE;
    a->as_bytes = 0;
    a->types = 0;
    a->resolve = 0;
    a->include = a->exclude = a->path = a->batches = Py_None;
    return PyArg_ParseTupleAndKeywords(args, kw, "i|npOOIpOO:_dents", kwlist, &a->fd, &a->bufsize,
                                       &a->as_bytes, &a->include, &a->exclude, &a->types, &a->resolve,
                                       &a->path, &a->batches);
}

/* Reads the directory to the end (or one batch when `one_batch`), returning a list or,
 * for one_batch at the end of the directory, None. */
static PyObject *collect(PyObject *args, PyObject *kw, int want_entries, int one_batch) {
    CommonArgs a;
    Reader r;
    Filter f;
    if (!parse_common(args, kw, &a)) return NULL;
    if (reader_init(&r, a.fd, a.bufsize, a.path, a.batches) < 0) return NULL;
    PyObject *out = NULL;
    if (filter_init(&f, a.include, a.exclude, a.types, a.resolve) < 0) goto done;
    out = PyList_New(0);
    if (!out) goto done;
    for (;;) {
        long n = read_batch(&r);
        if (n < 0) { Py_CLEAR(out); break; }
        if (n == 0) {
            if (one_batch) { Py_SETREF(out, Py_NewRef(Py_None)); }
            break;
        }
        if (parse_into(&r, &f, n, a.as_bytes, want_entries, out) < 0) { Py_CLEAR(out); break; }
        if (one_batch) break;
    }
done:
    filter_free(&f);
    free(r.buf);
    return out;
}

static PyObject *dents_listdir(PyObject *self, PyObject *args, PyObject *kw) {
    return collect(args, kw, 0, 0);
}

static PyObject *dents_entries(PyObject *self, PyObject *args, PyObject *kw) {
    if (!entry_type) {
        PyErr_SetString(PyExc_RuntimeError, "_set_entry_type() was not called");
        return NULL;
    }
    return collect(args, kw, 1, 0);
}

static PyObject *dents_entries_batch(PyObject *self, PyObject *args, PyObject *kw) {
    if (!entry_type) {
        PyErr_SetString(PyExc_RuntimeError, "_set_entry_type() was not called");
        return NULL;
    }
    return collect(args, kw, 1, 1);
}

/* ---- object-free fast paths: count and write_names ------------------------------ */

typedef struct {
    int out_fd;
    char *buf;
    size_t used;
    const char *prefix;
    size_t prefix_len;
    char sep;
} Writer;

static int writer_flush(Writer *w) {
    size_t off = 0;
    while (off < w->used) {
        ssize_t k = write(w->out_fd, w->buf + off, w->used - off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        off += (size_t)k;
    }
    w->used = 0;
    return 0;
}

static int writer_put(Writer *w, const char *name) {
    size_t len = strlen(name), need = w->prefix_len + len + 1;
    if (w->used + need > OUT_BUFSIZE && writer_flush(w) < 0) return -1;
    if (need > OUT_BUFSIZE) { errno = ENAMETOOLONG; return -1; }
    memcpy(w->buf + w->used, w->prefix, w->prefix_len);
    memcpy(w->buf + w->used + w->prefix_len, name, len);
    w->buf[w->used + w->prefix_len + len] = w->sep;
    w->used += need;
    return 0;
}

enum scan_failure { FAIL_READ, FAIL_WRITE, FAIL_PYTHON };

/* The whole loop runs without the GIL.  Returns the count, or -1 with *failure saying
 * what failed (errno is set for FAIL_READ and FAIL_WRITE, a Python error for FAIL_PYTHON). */
static long long scan_nogil(Reader *r, const Filter *f, Writer *w, enum scan_failure *failure) {
    long long total = 0;
    for (;;) {
        long n = read_batch_nogil(r);
        if (n < 0) { *failure = FAIL_READ; return -1; }
        if (n == 0) break;
        long kept = 0;
        for (long pos = 0; pos < n;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(r->buf + pos);
            pos += d->d_reclen;
            unsigned char type;
            if (is_dot(d->d_name) || !keep_entry(f, r->fd, d, &type)) continue;
            if (w && writer_put(w, d->d_name) < 0) { *failure = FAIL_WRITE; return -1; }
            kept++;
        }
        total += kept;
        if (r->batches) {
            /* the I/O log wants one record per batch: take the GIL once per batch */
            PyGILState_STATE g = PyGILState_Ensure();
            r->nentries = kept;
            int rc = record_batch(r);
            PyGILState_Release(g);
            if (rc < 0) { *failure = FAIL_PYTHON; return -1; }
        }
    }
    if (w && writer_flush(w) < 0) { *failure = FAIL_WRITE; return -1; }
    return total;
}

static PyObject *run_scan(CommonArgs *a, Writer *w) {
    Reader r;
    Filter f;
    if (reader_init(&r, a->fd, a->bufsize, a->path, a->batches) < 0) return NULL;
    if (filter_init(&f, a->include, a->exclude, a->types, a->resolve) < 0) {
        filter_free(&f);
        free(r.buf);
        return NULL;
    }
    enum scan_failure failure = FAIL_READ;
    long long total;
    Py_BEGIN_ALLOW_THREADS
    total = scan_nogil(&r, &f, w, &failure);
    Py_END_ALLOW_THREADS
    filter_free(&f);
    free(r.buf);
    if (total >= 0) return PyLong_FromLongLong(total);
    switch (failure) {
    case FAIL_PYTHON: return NULL;
    case FAIL_WRITE: return PyErr_SetFromErrno(PyExc_OSError);
    default: return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, r.path);
    }
}

static PyObject *dents_count(PyObject *self, PyObject *args, PyObject *kw) {
    CommonArgs a;
    if (!parse_common(args, kw, &a)) return NULL;
    return run_scan(&a, NULL);
}

static PyObject *dents_write_names(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"fd", "out_fd", "sep", "prefix", "bufsize", "include", "exclude", "types",
                             "path", "batches", NULL};
    CommonArgs a = {.bufsize = DEFAULT_BUFSIZE, .include = Py_None, .exclude = Py_None, .path = Py_None,
                    .batches = Py_None};
    int out_fd;
    char sep = '\n';
    const char *prefix = "";
    Py_ssize_t prefix_len = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ii|cy#nOOIOO:write_names", kwlist, &a.fd, &out_fd, &sep,
                                     &prefix, &prefix_len, &a.bufsize, &a.include, &a.exclude, &a.types,
                                     &a.path, &a.batches))
        return NULL;
    Writer w = {.out_fd = out_fd, .sep = sep, .prefix = prefix, .prefix_len = (size_t)prefix_len};
    w.buf = malloc(OUT_BUFSIZE);
    if (!w.buf) return PyErr_NoMemory();
    PyObject *res = run_scan(&a, &w);
    free(w.buf);
    return res;
}

/* ---- unlink_files: empty a directory of its non-directories ------------------------ */

/* Names kept for Python (subdirectories, failures) while the GIL is released:
 * NUL-terminated in one arena, with the errno that sent them back (0 = directory). */
typedef struct {
    char *arena;
    size_t used, cap;
    struct kept { size_t off; int err; } *items;
    size_t n, ncap;
} Kept;

static int kept_add(Kept *k, const char *name, int err) {
    size_t len = strlen(name) + 1;
    if (k->used + len > k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 65536;
        while (cap < k->used + len) cap *= 2;
        char *a = realloc(k->arena, cap);
        if (!a) return -1;
        k->arena = a;
        k->cap = cap;
    }
    if (k->n == k->ncap) {
        size_t ncap = k->ncap ? k->ncap * 2 : 256;
        struct kept *it = realloc(k->items, ncap * sizeof(*it));
        if (!it) return -1;
        k->items = it;
        k->ncap = ncap;
    }
    memcpy(k->arena + k->used, name, len);
    k->items[k->n].off = k->used;
    k->items[k->n].err = err;
    k->n++;
    k->used += len;
    return 0;
}

struct slot { uint64_t ino; struct linux_dirent64 *d; };

static int by_inode(const void *a, const void *b) {
    uint64_t x = ((const struct slot *)a)->ino, y = ((const struct slot *)b)->ino;
    return (x > y) - (x < y);
}

/* Unlinks every non-directory of the batch, in inode order (as GNU rm does for big
 * directories: the inode table is then read sequentially).  Directories, and entries
 * whose unlink failed, go to `kept`.  Returns the number unlinked, or -1 (ENOMEM). */
static long unlink_batch(int fd, char *buf, long n, Kept *kept) {
    size_t count = 0;
    for (long pos = 0; pos < n; pos += ((struct linux_dirent64 *)(buf + pos))->d_reclen) count++;
    struct slot *slots = malloc((count ? count : 1) * sizeof(*slots));
    if (!slots) return -1;
    size_t m = 0;
    for (long pos = 0; pos < n;) {
        struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + pos);
        pos += d->d_reclen;
        if (!is_dot(d->d_name)) slots[m++] = (struct slot){d->d_ino, d};
    }
    qsort(slots, m, sizeof(*slots), by_inode);
    long removed = 0;
    for (size_t i = 0; i < m; i++) {
        struct linux_dirent64 *d = slots[i].d;
        unsigned char type = force_unknown ? DT_UNKNOWN : d->d_type;
        int err = 0;
        if (type == DT_DIR) err = EISDIR;
        else if (unlinkat(fd, d->d_name, 0) == 0) { removed++; continue; }
        else err = errno;
        if (err == ENOENT) continue; /* already gone: someone else removed it */
        if (kept_add(kept, d->d_name, err == EISDIR ? 0 : err) < 0) { free(slots); return -1; }
    }
    free(slots);
    return removed;
}

static PyObject *dents_unlink_files(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"fd", "bufsize", "limit", "path", NULL};
    int fd;
    Py_ssize_t bufsize = DEFAULT_BUFSIZE, limit = 0;
    PyObject *path = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|nnO:unlink_files", kwlist, &fd, &bufsize, &limit, &path))
        return NULL;
    Reader r;
    if (reader_init(&r, fd, bufsize, path, Py_None) < 0) return NULL;
    Kept kept = {0};
    long long removed = 0;
    int at_end = 0, read_errno = 0, nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        long n = read_batch_nogil(&r);
        if (n < 0) { read_errno = errno; break; }
        if (n == 0) { at_end = 1; break; }
        long k = unlink_batch(fd, r.buf, n, &kept);
        if (k < 0) { nomem = 1; break; }
        removed += k;
        if (limit > 0 && removed >= limit) break; /* the caller reports progress, then calls again */
    }
    Py_END_ALLOW_THREADS
    free(r.buf);
    PyObject *subdirs = NULL, *failures = NULL, *result = NULL;
    if (nomem) { PyErr_NoMemory(); goto done; }
    if (read_errno) {
        errno = read_errno;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, r.path);
        goto done;
    }
    subdirs = PyList_New(0);
    failures = PyList_New(0);
    if (!subdirs || !failures) goto done;
    for (size_t i = 0; i < kept.n; i++) {
        PyObject *name = make_name(kept.arena + kept.items[i].off, 0);
        if (!name) goto done;
        int rc;
        if (kept.items[i].err == 0) {
            rc = PyList_Append(subdirs, name);
        } else {
            PyObject *t = Py_BuildValue("(Oi)", name, kept.items[i].err);
            rc = t ? PyList_Append(failures, t) : -1;
            Py_XDECREF(t);
        }
        Py_DECREF(name);
        if (rc < 0) goto done;
    }
    result = Py_BuildValue("(LOOO)", removed, at_end ? Py_True : Py_False, subdirs, failures);
done:
    Py_XDECREF(subdirs);
    Py_XDECREF(failures);
    free(kept.arena);
    free(kept.items);
    return result;
}

/* ---- module -------------------------------------------------------------------- */

static PyObject *dents_set_entry_type(PyObject *self, PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "entry type must be a tuple subclass");
        return NULL;
    }
    Py_XSETREF(entry_type, Py_NewRef(type));
    Py_RETURN_NONE;
}

static PyObject *dents_set_force_unknown(PyObject *self, PyObject *flag) {
    int v = PyObject_IsTrue(flag);
    if (v < 0) return NULL;
    force_unknown = v;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"listdir", (PyCFunction)(void (*)(void))dents_listdir, METH_VARARGS | METH_KEYWORDS,
     "listdir(fd, bufsize=1<<20, as_bytes=False, include=None, exclude=None, types=0, resolve=False, "
     "path=None, batches=None) -> list of names (str decoded like os.listdir, or bytes)"},
    {"entries", (PyCFunction)(void (*)(void))dents_entries, METH_VARARGS | METH_KEYWORDS,
     "entries(fd, ...) -> list of Entry(name, type_letter, inode) for the whole directory"},
    {"entries_batch", (PyCFunction)(void (*)(void))dents_entries_batch, METH_VARARGS | METH_KEYWORDS,
     "entries_batch(fd, ...) -> list of Entry for one getdents64 call, or None at the end"},
    {"count", (PyCFunction)(void (*)(void))dents_count, METH_VARARGS | METH_KEYWORDS,
     "count(fd, ...) -> number of entries; no Python object per entry, GIL released throughout"},
    {"write_names", (PyCFunction)(void (*)(void))dents_write_names, METH_VARARGS | METH_KEYWORDS,
     "write_names(fd, out_fd, sep=b'\\n', prefix=b'', bufsize=1<<20, include=None, exclude=None, types=0, "
     "path=None, batches=None) -> count; writes prefix+name+sep per entry straight to out_fd"},
    {"unlink_files", (PyCFunction)(void (*)(void))dents_unlink_files, METH_VARARGS | METH_KEYWORDS,
     "unlink_files(fd, bufsize=1<<20, limit=0, path=None) -> (unlinked, at_end, subdirs, failures): "
     "unlinkat every non-directory of the open directory fd, GIL released, no object per entry; "
     "subdirs are the directory names, failures (name, errno) pairs; with limit > 0 it stops after "
     "the batch that reaches `limit` unlinks (call again to go on)"},
    {"_set_entry_type", dents_set_entry_type, METH_O, "Set the tuple subclass used for entries."},
    {"_set_force_unknown", dents_set_force_unknown, METH_O,
     "Test hook: report every d_type as DT_UNKNOWN (as sshfs/NFSv3 do)."},
    {NULL, NULL, 0, NULL},
};

static int dents_exec(PyObject *m) {
    static const char letters[] = "?pc?d?b?f?l?s";
    for (int i = 0; i < 256; i++) {
        char c = (i < (int)sizeof(letters) - 1) ? letters[i] : '?';
        if (!type_letters[i]) {
            type_letters[i] = PyUnicode_FromStringAndSize(&c, 1);
            if (!type_letters[i]) return -1;
            PyUnicode_InternInPlace(&type_letters[i]);
        }
    }
    if (PyModule_AddIntConstant(m, "MIN_BUFSIZE", MIN_BUFSIZE) < 0) return -1;
    if (PyModule_AddIntConstant(m, "DEFAULT_BUFSIZE", DEFAULT_BUFSIZE) < 0) return -1;
    static const struct { const char *name; int value; } dt[] = {
        {"DT_UNKNOWN", DT_UNKNOWN}, {"DT_FIFO", DT_FIFO}, {"DT_CHR", DT_CHR}, {"DT_DIR", DT_DIR},
        {"DT_BLK", DT_BLK}, {"DT_REG", DT_REG}, {"DT_LNK", DT_LNK}, {"DT_SOCK", DT_SOCK},
    };
    for (size_t i = 0; i < sizeof(dt) / sizeof(dt[0]); i++)
        if (PyModule_AddIntConstant(m, dt[i].name, dt[i].value) < 0) return -1;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, dents_exec},
#if PY_VERSION_HEX >= 0x030D0000
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "manyfiles._dents", "getdents64 listing core (see manyfiles.listing).", 0,
    methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__dents(void) { return PyModuleDef_Init(&module); }
