/*
 * manyfiles._dents: the native listing core (this file: one directory, and the module).
 *
 * A directory is read with getdents64(2) into a caller-chosen buffer (default 1 MiB)
 * instead of readdir(3)'s ~32 KiB, which matters on network filesystems where every
 * batch is a round trip.  The GIL is released during each syscall, and the fast
 * paths (count, write_names) release it for the whole loop and create no Python
 * object per entry.  Trees are walked by _walk.c; glob patterns are _glob.c's.
 *
 * Only syscalls and buffer parsing live here: sorting, error wording and the public
 * API are the Python side's (manyfiles/listing/).
 *
 * State is per module (PEP 489 multi-phase init + module state): every interpreter
 * that imports the module gets its own Entry type, letters and test knob.
 */
#include "_dents.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define OUT_BUFSIZE (256 * 1024)

typedef struct {
    const GlobSet *include, *exclude; /* borrowed from Glob objects the caller keeps alive */
    unsigned types;   /* bit (1 << DT_x) per wanted type; 0 = all */
    int resolve;      /* resolve DT_UNKNOWN with fstatat */
    int fake_dtype;   /* the d_type override, copied from the module state */
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

ModState *mod_state(PyObject *module) { return (ModState *)PyModule_GetState(module); }

ModState *mod_state_of_type(PyTypeObject *type) { return (ModState *)PyType_GetModuleState(type); }

int read_fake_dtype(ModState *st) { return st->fake_dtype; }

size_t clamp_bufsize(Py_ssize_t bufsize) {
    if (bufsize < MIN_BUFSIZE) return MIN_BUFSIZE;
    if (bufsize > MAX_BUFSIZE) return MAX_BUFSIZE;
    return (size_t)bufsize;
}

int grow_array(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *v = realloc(*p, c * elem);
    if (!v) return -1;
    *p = v;
    *cap = c;
    return 0;
}

int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

unsigned char type_from_mode(mode_t m) {
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

/* ---- the calling thread's getdents buffer ------------------------------------------ */

/* One buffer per OS thread, reused by every call, so listing a directory (or one batch of
 * it: entries_batch) allocates nothing: a fresh 1 MiB malloc per call was both slow and,
 * once glibc raised its mmap threshold, a source of heap fragmentation.  A call holds the
 * buffer only while it runs and never runs Python code that could re-enter this module, so
 * one per thread is enough.  The key is process-wide but holds no Python object. */
#define KEEP_BUFSIZE (4 << 20) /* a bigger buffer is given back after the call */

typedef struct {
    char *p;
    size_t n;
} ThreadBuf;

static pthread_key_t tbuf_key;
static pthread_once_t tbuf_once = PTHREAD_ONCE_INIT;

static void tbuf_free(void *v) {
    ThreadBuf *t = v;
    free(t->p);
    free(t);
}

static void tbuf_init(void) { pthread_key_create(&tbuf_key, tbuf_free); }

/* The thread's buffer, at least `size` bytes (contents not kept); NULL if out of memory. */
static char *thread_buffer(size_t size) {
    pthread_once(&tbuf_once, tbuf_init);
    ThreadBuf *t = pthread_getspecific(tbuf_key);
    if (!t) {
        if (!(t = calloc(1, sizeof(*t)))) return NULL;
        if (pthread_setspecific(tbuf_key, t) != 0) {
            free(t);
            return NULL;
        }
    }
    if (t->n < size) {
        free(t->p);
        t->n = 0;
        if (!(t->p = malloc(size))) return NULL;
        t->n = size;
    }
    return t->p;
}

static void thread_buffer_done(void) {
    ThreadBuf *t = pthread_getspecific(tbuf_key);
    if (t && t->n > KEEP_BUFSIZE) {
        free(t->p);
        t->p = NULL;
        t->n = 0;
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
        if (errno == EINVAL && r->size < MAX_BUFSIZE) {
            char *bigger = thread_buffer(r->size * 2);
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

/* Decides whether an entry passes the filter; resolves its type when needed.  *type is
 * always < N_DTYPES (an out-of-range d_type from a broken filesystem reads as unknown). */
static int keep_entry(const Filter *f, int dirfd, const struct linux_dirent64 *d, unsigned char *type) {
    *type = effective_dtype(f->fake_dtype, d->d_type);
    if (f->exclude || f->include) {
        size_t len = strlen(d->d_name);
        if (f->exclude && globset_match(f->exclude, d->d_name, len, NULL, 0)) return 0;
        if (f->include && !globset_match(f->include, d->d_name, len, NULL, 0)) return 0;
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
    r->fd = fd;
    r->size = clamp_bufsize(bufsize);
    r->path = (path == Py_None) ? NULL : path;
    r->batches = (batches == Py_None || batches == NULL) ? NULL : batches;
    if (r->batches && !PyList_Check(r->batches)) {
        PyErr_SetString(PyExc_TypeError, "batches must be a list or None");
        return -1;
    }
    r->buf = thread_buffer(r->size);
    if (!r->buf) { PyErr_NoMemory(); return -1; }
    return 0;
}

static int filter_init(Filter *f, PyObject *module, PyObject *include, PyObject *exclude, unsigned types,
                       int resolve) {
    ModState *st = mod_state(module);
    memset(f, 0, sizeof(*f));
    f->types = types & ((1u << N_DTYPES) - 1);
    f->resolve = resolve;
    f->fake_dtype = read_fake_dtype(st);
    if (include != NULL && include != Py_None && !(f->include = globset_from_object(include, st))) return -1;
    if (exclude != NULL && exclude != Py_None && !(f->exclude = globset_from_object(exclude, st))) return -1;
    return 0;
}

PyObject *make_name(const char *name, size_t len, int as_bytes) {
    /* os.listdir's decoding: the filesystem encoding with surrogateescape */
    return as_bytes ? PyBytes_FromStringAndSize(name, (Py_ssize_t)len)
                    : PyUnicode_DecodeFSDefaultAndSize(name, (Py_ssize_t)len);
}

/* ---- list building ------------------------------------------------------------ */

/* Appends the entries of the batch in r->buf to `out`, as names or as Entry tuples. */
static int parse_into(ModState *st, Reader *r, const Filter *f, long n, int as_bytes, int want_entries,
                      PyObject *out) {
    for (long pos = 0; pos < n;) {
        struct linux_dirent64 *d = (struct linux_dirent64 *)(r->buf + pos);
        pos += d->d_reclen;
        unsigned char type;
        if (is_dot(d->d_name) || !keep_entry(f, r->fd, d, &type)) continue;
        PyObject *name = make_name(d->d_name, strlen(d->d_name), as_bytes);
        if (!name) return -1;
        PyObject *item = name;
        if (want_entries) {
            /* Entry is a NamedTuple (a tuple subclass without __dict__): fill it directly,
             * as tuple.__new__ would, without the Python-level __new__. */
            PyObject *ino = PyLong_FromUnsignedLongLong(d->d_ino);
            PyTypeObject *t = (PyTypeObject *)st->entry_type;
            item = ino ? t->tp_alloc(t, 3) : NULL;
            if (!item) {
                Py_DECREF(name);
                Py_XDECREF(ino);
                return -1;
            }
            PyTuple_SET_ITEM(item, 0, name);
            PyTuple_SET_ITEM(item, 1, Py_NewRef(st->type_letters[type]));
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
static PyObject *collect(PyObject *module, PyObject *args, PyObject *kw, int want_entries, int one_batch) {
    CommonArgs a;
    Reader r;
    Filter f;
    ModState *st = mod_state(module);
    if (want_entries && !st->entry_type) {
        PyErr_SetString(PyExc_RuntimeError, "set_types() was not called");
        return NULL;
    }
    if (!parse_common(args, kw, &a)) return NULL;
    if (filter_init(&f, module, a.include, a.exclude, a.types, a.resolve) < 0) return NULL;
    if (reader_init(&r, a.fd, a.bufsize, a.path, a.batches) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) {
        thread_buffer_done();
        return NULL;
    }
    for (;;) {
        long n = read_batch(&r);
        if (n < 0) { Py_CLEAR(out); break; }
        if (n == 0) {
            if (one_batch) { Py_SETREF(out, Py_NewRef(Py_None)); }
            break;
        }
        if (parse_into(st, &r, &f, n, a.as_bytes, want_entries, out) < 0) { Py_CLEAR(out); break; }
        if (one_batch) break;
    }
    thread_buffer_done();
    return out;
}

static PyObject *dents_listdir(PyObject *self, PyObject *args, PyObject *kw) {
    return collect(self, args, kw, 0, 0);
}

static PyObject *dents_entries(PyObject *self, PyObject *args, PyObject *kw) {
    return collect(self, args, kw, 1, 0);
}

static PyObject *dents_entries_batch(PyObject *self, PyObject *args, PyObject *kw) {
    return collect(self, args, kw, 1, 1);
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

static PyObject *run_scan(PyObject *module, CommonArgs *a, Writer *w) {
    Reader r;
    Filter f;
    if (filter_init(&f, module, a->include, a->exclude, a->types, a->resolve) < 0) return NULL;
    if (reader_init(&r, a->fd, a->bufsize, a->path, a->batches) < 0) return NULL;
    enum scan_failure failure = FAIL_READ;
    long long total;
    int saved_errno;
    Py_BEGIN_ALLOW_THREADS
    total = scan_nogil(&r, &f, w, &failure);
    saved_errno = errno; /* before free(), which may change it */
    Py_END_ALLOW_THREADS
    thread_buffer_done();
    if (total >= 0) return PyLong_FromLongLong(total);
    errno = saved_errno;
    switch (failure) {
    case FAIL_PYTHON: return NULL;
    case FAIL_WRITE: return PyErr_SetFromErrno(PyExc_OSError);
    default: return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, r.path);
    }
}

static PyObject *dents_count(PyObject *self, PyObject *args, PyObject *kw) {
    CommonArgs a;
    if (!parse_common(args, kw, &a)) return NULL;
    return run_scan(self, &a, NULL);
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
    PyObject *res = run_scan(self, &a, &w);
    free(w.buf);
    return res;
}

/* ---- module -------------------------------------------------------------------- */

static int is_tuple_type(PyObject *t) {
    return PyType_Check(t) && PyType_IsSubtype((PyTypeObject *)t, &PyTuple_Type);
}

/* Registers the tuple subclasses built in C.  Once per module: they are read by walks in
 * progress, so they are never replaced (no object is freed under a reader's feet). */
static PyObject *dentsset_types(PyObject *self, PyObject *args) {
    PyObject *entry, *listing;
    if (!PyArg_ParseTuple(args, "OO:set_types", &entry, &listing)) return NULL;
    if (!is_tuple_type(entry) || !is_tuple_type(listing)) {
        PyErr_SetString(PyExc_TypeError, "Entry and DirListing must be tuple subclasses");
        return NULL;
    }
    ModState *st = mod_state(self);
    if (st->entry_type || st->listing_type) {
        if (st->entry_type == entry && st->listing_type == listing) Py_RETURN_NONE;
        PyErr_SetString(PyExc_RuntimeError, "set_types() was already called with other types");
        return NULL;
    }
    st->entry_type = Py_NewRef(entry);
    st->listing_type = Py_NewRef(listing);
    Py_RETURN_NONE;
}

/* Every d_type reads as ``value`` (0 = DT_UNKNOWN as sshfs, NFSv3 READDIR and XFS ftype=0 send;
 * out of range = garbage), or as the filesystem sent it (None): the tests' way to exercise
 * the fstatat fallback on any filesystem.  Per interpreter, like all the state. */
static PyObject *dents_set_fake_dtype(PyObject *self, PyObject *value) {
    long x = value == Py_None ? -1 : PyLong_AsLong(value);
    if (x == -1 && PyErr_Occurred()) return NULL;
    mod_state(self)->fake_dtype = x < -1 ? -1 : x > 255 ? 255 : (int)x;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"listdir", (PyCFunction)(void (*)(void))dents_listdir, METH_VARARGS | METH_KEYWORDS,
     "listdir(fd, bufsize=1<<20, as_bytes=False, include=None, exclude=None, types=0, resolve=False, "
     "path=None, batches=None) -> list of names (str decoded like os.listdir, or bytes); "
     "include/exclude are Glob objects"},
    {"entries", (PyCFunction)(void (*)(void))dents_entries, METH_VARARGS | METH_KEYWORDS,
     "entries(fd, ...) -> list of Entry(name, type_letter, inode) for the whole directory"},
    {"entries_batch", (PyCFunction)(void (*)(void))dents_entries_batch, METH_VARARGS | METH_KEYWORDS,
     "entries_batch(fd, ...) -> list of Entry for one getdents64 call, or None at the end"},
    {"count", (PyCFunction)(void (*)(void))dents_count, METH_VARARGS | METH_KEYWORDS,
     "count(fd, ...) -> number of entries; no Python object per entry, GIL released throughout"},
    {"write_names", (PyCFunction)(void (*)(void))dents_write_names, METH_VARARGS | METH_KEYWORDS,
     "write_names(fd, out_fd, sep=b'\\n', prefix=b'', bufsize=1<<20, include=None, exclude=None, types=0, "
     "path=None, batches=None) -> count; writes prefix+name+sep per entry straight to out_fd"},
    {"set_types", dentsset_types, METH_VARARGS,
     "set_types(Entry, DirListing): the tuple subclasses built in C (once per interpreter)."},
    {"_set_fake_dtype", dents_set_fake_dtype, METH_O,
     "_set_fake_dtype(value or None): every d_type reads as value (tests: the fstatat fallback)."},
    {NULL, NULL, 0, NULL},
};

static int dents_exec(PyObject *m) {
    ModState *st = mod_state(m);
    st->fake_dtype = -1;
    static const char letters[] = "?pc?d?b?f?l?s???";
    for (int i = 0; i < N_DTYPES; i++) {
        st->type_letters[i] = PyUnicode_FromStringAndSize(&letters[i], 1);
        if (!st->type_letters[i]) return -1;
        PyUnicode_InternInPlace(&st->type_letters[i]);
    }
    if (glob_add_type(m, st) < 0 || walk_add_type(m, st) < 0) return -1;
    if (PyModule_AddFunctions(m, walk_functions) < 0) return -1;
    if (crc_add_functions(m) < 0) return -1;
    if (install_add_functions(m) < 0) return -1;
    if (records_add_functions(m) < 0) return -1;
    if (PyModule_AddIntConstant(m, "MIN_BUFSIZE", MIN_BUFSIZE) < 0) return -1;
    if (PyModule_AddIntConstant(m, "DEFAULT_BUFSIZE", DEFAULT_BUFSIZE) < 0) return -1;
    if (PyModule_AddIntConstant(m, "MAX_BUFSIZE", MAX_BUFSIZE) < 0) return -1;
    static const struct { const char *name; int value; } dt[] = {
        {"DT_UNKNOWN", DT_UNKNOWN}, {"DT_FIFO", DT_FIFO}, {"DT_CHR", DT_CHR}, {"DT_DIR", DT_DIR},
        {"DT_BLK", DT_BLK}, {"DT_REG", DT_REG}, {"DT_LNK", DT_LNK}, {"DT_SOCK", DT_SOCK},
    };
    for (size_t i = 0; i < sizeof(dt) / sizeof(dt[0]); i++)
        if (PyModule_AddIntConstant(m, dt[i].name, dt[i].value) < 0) return -1;
    return 0;
}

static int dents_traverse(PyObject *m, visitproc visit, void *arg) {
    ModState *st = mod_state(m);
    if (!st) return 0;
    Py_VISIT(st->entry_type);
    Py_VISIT(st->listing_type);
    Py_VISIT(st->glob_type);
    Py_VISIT(st->walk_type);
    return 0;
}

static int dents_clear(PyObject *m) {
    ModState *st = mod_state(m);
    if (!st) return 0;
    Py_CLEAR(st->entry_type);
    Py_CLEAR(st->listing_type);
    Py_CLEAR(st->glob_type);
    Py_CLEAR(st->walk_type);
    for (int i = 0; i < N_DTYPES; i++) Py_CLEAR(st->type_letters[i]);
    return 0;
}

static void dents_free(void *m) { dents_clear((PyObject *)m); }

/* Every piece of state is per module and no Python object is touched without the calling
 * thread's interpreter (the walker threads only see C data), hence the two declarations. */
static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, dents_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#if PY_VERSION_HEX >= 0x030D0000
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "manyfiles._dents", "getdents64 listing core (see manyfiles.listing).",
    sizeof(ModState), methods, slots, dents_traverse, dents_clear, dents_free,
};

PyMODINIT_FUNC PyInit__dents(void) { return PyModuleDef_Init(&module); }
