/*
 * Shared declarations of the native core (manyfiles._dents): _dents.c (one directory,
 * module init), _glob.c (the one glob rule set), _walk.c (the parallel tree walker) and
 * _remove_tree.c (its remove mode; the two share _walk.h).
 */
#ifndef MANYFILES_DENTS_H
#define MANYFILES_DENTS_H

#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <Python.h>

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

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
/* getdents64 takes an unsigned int count: a buffer of 4 GiB or more is truncated by the
 * kernel (to 0 at exactly 4 GiB: EINVAL).  No filesystem fills more than a few MiB per
 * call anyway, so every buffer is clamped to this. */
#define MAX_BUFSIZE (64 << 20)
/* d_type values we know (DT_UNKNOWN .. DT_WHT = 14); anything else is treated as unknown */
#define N_DTYPES 16

/* Per-module state (one per interpreter that imports the module): nothing is static. */
typedef struct {
    PyObject *entry_type;         /* manyfiles.listing.Entry (a tuple subclass), or NULL */
    PyObject *listing_type;       /* manyfiles.listing.DirListing (a tuple subclass), or NULL */
    PyObject *type_letters[N_DTYPES];  /* d_type -> one-letter str ('?' for unknown values) */
    PyTypeObject *glob_type;
    PyTypeObject *walk_type;
    int fake_dtype;               /* -1, or what every d_type reads as (_set_fake_dtype) */
} ModState;

ModState *mod_state(PyObject *module);
ModState *mod_state_of_type(PyTypeObject *type);
/* The d_type override of _set_fake_dtype(), read at the start of each call (GIL held):
 * -1 when unset (production), else the value every d_type reads as. */
int read_fake_dtype(ModState *st);

/* d_type as the listing should see it (override applied, unknown values mapped to DT_UNKNOWN). */
static inline unsigned char effective_dtype(int fake_dtype, unsigned char d_type) {
    int t = fake_dtype >= 0 ? fake_dtype : d_type;
    return (t >= 0 && t < N_DTYPES) ? (unsigned char)t : DT_UNKNOWN;
}

static inline int is_dot(const char *name) {
    return name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0));
}

unsigned char type_from_mode(mode_t m);
/* Grows *p (an array of `elem`-byte items with *cap of room) to hold `need` items: 0, or -1 (ENOMEM). */
int grow_array(void **p, size_t *cap, size_t need, size_t elem);

/* ---- UTF-8 with surrogateescape ------------------------------------------------------------- */

static inline int utf8_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

/* The code point at s[*i] (advancing *i), exactly as os.fsdecode (Python's UTF-8 decoder
 * with errors="surrogateescape") produces it: a byte that does not start a valid sequence
 * becomes U+DC00 + byte.  Valid UTF-8 never decodes to U+DC80..U+DCFF (surrogates are
 * rejected), so such a code point means "not UTF-8".  Used by the glob matcher (_glob.c)
 * and the JSON writer (_walk.c). */
static inline uint32_t fs_next_char(const unsigned char *s, size_t len, size_t *i) {
    size_t p = *i;
    unsigned char b = s[p];
    if (b < 0x80) {
        *i = p + 1;
        return b;
    }
    size_t left = len - p - 1;
    if (b >= 0xC2 && b <= 0xDF) {
        if (left >= 1 && utf8_cont(s[p + 1])) {
            *i = p + 2;
            return ((uint32_t)(b & 0x1F) << 6) | (s[p + 1] & 0x3F);
        }
    } else if (b >= 0xE0 && b <= 0xEF) {
        if (left >= 2 && utf8_cont(s[p + 1]) && utf8_cont(s[p + 2])) {
            unsigned char b1 = s[p + 1];
            int ok = (b == 0xE0) ? b1 >= 0xA0 : (b == 0xED) ? b1 <= 0x9F : 1;  /* overlong; surrogates */
            if (ok) {
                *i = p + 3;
                return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(b1 & 0x3F) << 6) | (s[p + 2] & 0x3F);
            }
        }
    } else if (b >= 0xF0 && b <= 0xF4) {
        if (left >= 3 && utf8_cont(s[p + 1]) && utf8_cont(s[p + 2]) && utf8_cont(s[p + 3])) {
            unsigned char b1 = s[p + 1];
            int ok = (b == 0xF0) ? b1 >= 0x90 : (b == 0xF4) ? b1 <= 0x8F : 1;  /* overlong; > U+10FFFF */
            if (ok) {
                *i = p + 4;
                return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(b1 & 0x3F) << 12) |
                       ((uint32_t)(s[p + 2] & 0x3F) << 6) | (s[p + 3] & 0x3F);
            }
        }
    }
    *i = p + 1;
    return 0xDC00 + b;
}

size_t clamp_bufsize(Py_ssize_t bufsize);
int64_t now_ns(void);

/* ---- glob (_glob.c) ----------------------------------------------------------------------- */

typedef struct GlobPattern GlobPattern;

/* A compiled set of patterns: "any of them matches".  Immutable once built, so worker
 * threads share it without locks. */
typedef struct {
    GlobPattern **pats;
    Py_ssize_t n;
    int any_slash;   /* some pattern contains '/': it is matched against the relative path */
    int all_slash;
} GlobSet;

/* Matches `name` (and `rel`, the path relative to the walk's root, for patterns with '/';
 * rel may be NULL: then name is used).  Thread-safe, no GIL needed. */
int globset_match(const GlobSet *g, const char *name, size_t name_len, const char *rel, size_t rel_len);
/* The GlobSet inside a manyfiles._dents.Glob object, or NULL with TypeError set. */
const GlobSet *globset_from_object(PyObject *obj, ModState *st);
int glob_add_type(PyObject *module, ModState *st);

/* ---- walker (_walk.c) ----------------------------------------------------------------------- */

int walk_add_type(PyObject *module, ModState *st);
extern PyMethodDef walk_functions[]; /* walk_count, walk_write and remove_tree (_remove_tree.c) */

/* _crc.c: crc64nvme() and crc32c() for s3pull's checks of small objects */
int crc_add_functions(PyObject *module);
/* s3/_install.c: install_small, the small-object sink's one-call install */
int install_add_functions(PyObject *module);

/* cache/_records.c: pread_records(), a batch of packed records read for the cache's hit table */
int records_add_functions(PyObject *module);

/* ---- JSON + names helpers shared by the writers --------------------------------------------- */

PyObject *make_name(const char *name, size_t len, int as_bytes);

#endif
