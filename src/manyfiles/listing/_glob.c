/*
 * The one glob rule set of manyfiles, in C: Python's fnmatch.fnmatchcase semantics.
 *
 * `*` any run of characters (also '/' and a leading '.'), `?` one character (also '\n'),
 * `[seq]` / `[!seq]` a character class with ranges, no backslash escapes, no POSIX
 * classes (`[[:digit:]]` is the class {'[', ':', 'd', 'i', 'g', 't'} followed by ']'),
 * `[^a]` is the class {'^', 'a'}, an unclosed '[' is a literal, case-sensitive.
 * The class parsing below is a transcription of fnmatch.translate (CPython 3.8+,
 * unchanged through 3.14): the same hyphen chunking and the same removal of empty ranges.
 *
 * Text is matched as Python sees it after os.fsdecode: bytes are decoded as UTF-8 and a
 * byte that is not part of a valid sequence becomes the lone surrogate U+DC80..U+DCFF
 * (surrogateescape).  So `?` is one character, not one byte, and a str pattern behaves
 * the same on str names and on raw bytes names.  (manyfiles._core.glob uses this only where the
 * filesystem encoding is UTF-8, which Python guarantees on Linux unless a non-UTF-8
 * locale is set explicitly; elsewhere it falls back to fnmatch.translate.)
 *
 * Matching is the classic iterative wildcard algorithm (every token but `*` consumes
 * exactly one character, so backtracking to the last `*` is enough): linear for the
 * usual patterns, O(len(name) * len(pattern)) at worst, no recursion.
 */
#include "_dents.h"

#include <stdlib.h>
#include <string.h>

#include "structmember.h"

enum { T_LIT, T_ANY, T_STAR, T_CLASS, T_NEVER };

typedef struct {
    uint8_t kind;
    uint8_t neg;
    uint32_t c;        /* T_LIT: the code point */
    uint32_t off, n;   /* T_CLASS: ranges[off .. off+n) */
} Tok;

struct GlobPattern {
    Tok *toks;
    size_t ntok;
    uint32_t (*ranges)[2];
    size_t nranges;
    int has_slash;
};

/* ---- compiling: fnmatch.translate, on code points -------------------------------------------- */

typedef struct {
    uint32_t *v;
    size_t n, cap;
} U32s;

static int u32_push(U32s *a, uint32_t x) {
    if (grow_array((void **)&a->v, &a->cap, a->n + 1, sizeof(*a->v)) < 0) return -1;
    a->v[a->n++] = x;
    return 0;
}

typedef struct {
    Tok *toks;
    size_t ntok, tcap;
    uint32_t (*ranges)[2];
    size_t nranges, rcap;
} Builder;

static int add_tok(Builder *b, Tok t) {
    if (t.kind == T_STAR && b->ntok && b->toks[b->ntok - 1].kind == T_STAR) return 0;  /* '**' == '*' */
    if (grow_array((void **)&b->toks, &b->tcap, b->ntok + 1, sizeof(*b->toks)) < 0) return -1;
    b->toks[b->ntok++] = t;
    return 0;
}

static int add_range(Builder *b, uint32_t lo, uint32_t hi) {
    if (grow_array((void **)&b->ranges, &b->rcap, b->nranges + 1, sizeof(*b->ranges)) < 0) return -1;
    b->ranges[b->nranges][0] = lo;
    b->ranges[b->nranges][1] = hi;
    b->nranges++;
    return 0;
}

/* The chunks of a class with hyphens (fnmatch.translate): each chunk is a run of code
 * points; the last of one chunk and the first of the next form a range. */
typedef struct {
    U32s *c;
    size_t n, cap;
} Chunks;

static int chunk_add(Chunks *ch, const uint32_t *src, size_t len) {
    if (grow_array((void **)&ch->c, &ch->cap, ch->n + 1, sizeof(*ch->c)) < 0) return -1;
    U32s *dst = &ch->c[ch->n++];
    memset(dst, 0, sizeof(*dst));
    for (size_t i = 0; i < len; i++)
        if (u32_push(dst, src[i]) < 0) return -1;
    return 0;
}

static void chunks_free(Chunks *ch) {
    for (size_t i = 0; i < ch->n; i++) free(ch->c[i].v);
    free(ch->c);
}

/* Emits the token for the class pc[i..j) (between '[' and ']').  Returns -1 on ENOMEM. */
static int compile_class(Builder *b, const uint32_t *pc, size_t i, size_t j) {
    /* `stuff` as fnmatch.translate builds it, flattened into one sequence of code points
     * where a position flagged in `is_range_dash` is a range-forming hyphen. */
    U32s stuff = {0}, dash = {0};
    int rc = -1;
    int has_dash = 0;
    for (size_t k = i; k < j; k++) has_dash |= pc[k] == '-';
    if (!has_dash) {
        for (size_t k = i; k < j; k++)
            if (u32_push(&stuff, pc[k]) < 0 || u32_push(&dash, 0) < 0) goto done;
    } else {
        Chunks ch = {0};
        size_t start = i;
        size_t k = (pc[i] == '!') ? i + 2 : i + 1;
        for (;;) {
            size_t f = k;
            while (f < j && pc[f] != '-') f++;
            if (f >= j) break;
            if (chunk_add(&ch, pc + start, f - start) < 0) { chunks_free(&ch); goto done; }
            start = f + 1;
            k = f + 3;
        }
        if (start < j) {
            if (chunk_add(&ch, pc + start, j - start) < 0) { chunks_free(&ch); goto done; }
        } else if (u32_push(&ch.c[ch.n - 1], '-') < 0) {
            chunks_free(&ch);
            goto done;
        }
        /* Remove empty ranges (a > b), from the end, exactly as translate does. */
        for (size_t m = ch.n - 1; m >= 1; m--) {
            U32s *prev = &ch.c[m - 1], *cur = &ch.c[m];
            if (prev->v[prev->n - 1] > cur->v[0]) {
                prev->n--;
                for (size_t q = 1; q < cur->n; q++)
                    if (u32_push(prev, cur->v[q]) < 0) { chunks_free(&ch); goto done; }
                free(cur->v);
                memmove(&ch.c[m], &ch.c[m + 1], (ch.n - m - 1) * sizeof(U32s));
                ch.n--;
            }
        }
        for (size_t m = 0; m < ch.n; m++) {
            if (m > 0 && (u32_push(&stuff, '-') < 0 || u32_push(&dash, 1) < 0)) { chunks_free(&ch); goto done; }
            for (size_t q = 0; q < ch.c[m].n; q++)
                if (u32_push(&stuff, ch.c[m].v[q]) < 0 || u32_push(&dash, 0) < 0) { chunks_free(&ch); goto done; }
        }
        chunks_free(&ch);
    }
    if (stuff.n == 0) {  /* empty range: never matches */
        rc = add_tok(b, (Tok){.kind = T_NEVER});
        goto done;
    }
    if (stuff.n == 1 && stuff.v[0] == '!') {  /* negated empty range: any character */
        rc = add_tok(b, (Tok){.kind = T_ANY});
        goto done;
    }
    Tok t = {.kind = T_CLASS, .off = (uint32_t)b->nranges};
    size_t q = 0;
    if (stuff.v[0] == '!') {
        t.neg = 1;
        q = 1;
    }
    for (; q < stuff.n; q++) {
        if (q + 2 < stuff.n && dash.v[q + 1]) {  /* lo '-' hi */
            if (add_range(b, stuff.v[q], stuff.v[q + 2]) < 0) goto done;
            q += 2;
        } else if (add_range(b, stuff.v[q], stuff.v[q]) < 0) {
            goto done;
        }
    }
    t.n = (uint32_t)(b->nranges - t.off);
    rc = add_tok(b, t);
done:
    free(stuff.v);
    free(dash.v);
    return rc;
}

static void pattern_free(GlobPattern *p) {
    if (!p) return;
    free(p->toks);
    free(p->ranges);
    free(p);
}

static GlobPattern *pattern_compile(const char *src, size_t len) {
    U32s pc = {0};
    Builder b = {0};
    GlobPattern *p = NULL;
    for (size_t i = 0; i < len;)
        if (u32_push(&pc, fs_next_char((const unsigned char *)src, len, &i)) < 0) goto fail;
    size_t n = pc.n;
    for (size_t i = 0; i < n;) {
        uint32_t c = pc.v[i++];
        int rc;
        if (c == '*') {
            rc = add_tok(&b, (Tok){.kind = T_STAR});
        } else if (c == '?') {
            rc = add_tok(&b, (Tok){.kind = T_ANY});
        } else if (c == '[') {
            size_t j = i;
            if (j < n && pc.v[j] == '!') j++;
            if (j < n && pc.v[j] == ']') j++;
            while (j < n && pc.v[j] != ']') j++;
            if (j >= n) {
                rc = add_tok(&b, (Tok){.kind = T_LIT, .c = '['});
            } else {
                rc = compile_class(&b, pc.v, i, j);
                i = j + 1;
            }
        } else {
            rc = add_tok(&b, (Tok){.kind = T_LIT, .c = c});
        }
        if (rc < 0) goto fail;
    }
    p = calloc(1, sizeof(*p));
    if (!p) goto fail;
    p->toks = b.toks;
    p->ntok = b.ntok;
    p->ranges = b.ranges;
    p->nranges = b.nranges;
    p->has_slash = memchr(src, '/', len) != NULL;
    free(pc.v);
    return p;
fail:
    free(pc.v);
    free(b.toks);
    free(b.ranges);
    return NULL;
}

/* ---- matching ------------------------------------------------------------------------------ */

static inline int tok_matches(const GlobPattern *p, const Tok *t, uint32_t c) {
    switch (t->kind) {
    case T_LIT: return c == t->c;
    case T_ANY: return 1;
    case T_CLASS: {
        int in = 0;
        for (uint32_t k = 0; k < t->n && !in; k++) {
            const uint32_t *r = p->ranges[t->off + k];
            in = r[0] <= c && c <= r[1];
        }
        return in != t->neg;
    }
    default: return 0;  /* T_NEVER */
    }
}

static int pattern_match(const GlobPattern *p, const unsigned char *s, size_t len) {
    size_t ti = 0, si = 0;
    size_t star_t = (size_t)-1, star_s = 0;
    const Tok *toks = p->toks;
    while (si < len) {
        if (ti < p->ntok && toks[ti].kind == T_STAR) {
            star_t = ++ti;
            star_s = si;
            continue;
        }
        if (ti < p->ntok) {
            size_t next = si;
            uint32_t c = fs_next_char(s, len, &next);
            if (tok_matches(p, &toks[ti], c)) {
                si = next;
                ti++;
                continue;
            }
        }
        if (star_t == (size_t)-1) return 0;
        fs_next_char(s, len, &star_s);  /* let the last '*' eat one more character */
        si = star_s;
        ti = star_t;
    }
    while (ti < p->ntok && toks[ti].kind == T_STAR) ti++;
    return ti == p->ntok;
}

int globset_match(const GlobSet *g, const char *name, size_t name_len, const char *rel, size_t rel_len) {
    for (Py_ssize_t i = 0; i < g->n; i++) {
        const GlobPattern *p = g->pats[i];
        int hit = (p->has_slash && rel) ? pattern_match(p, (const unsigned char *)rel, rel_len)
                                         : pattern_match(p, (const unsigned char *)name, name_len);
        if (hit) return 1;
    }
    return 0;
}

static void globset_clear(GlobSet *g) {
    for (Py_ssize_t i = 0; i < g->n; i++) pattern_free(g->pats[i]);
    free(g->pats);
    g->pats = NULL;
    g->n = 0;
}

/* ---- the Python type: manyfiles._dents.Glob ---------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    GlobSet set;
    PyObject *patterns;  /* tuple of bytes, as given */
} GlobObject;

static PyObject *glob_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"patterns", NULL};
    PyObject *seq;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:Glob", kwlist, &seq)) return NULL;
    PyObject *tup = PySequence_Tuple(seq);
    if (!tup) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(tup);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(tup, i))) {
            Py_DECREF(tup);
            PyErr_SetString(PyExc_TypeError, "Glob patterns must be bytes (os.fsencode them)");
            return NULL;
        }
    }
    GlobObject *self = (GlobObject *)type->tp_alloc(type, 0);
    if (!self) {
        Py_DECREF(tup);
        return NULL;
    }
    self->patterns = tup;
    self->set.pats = calloc(n ? (size_t)n : 1, sizeof(GlobPattern *));
    if (!self->set.pats) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->set.all_slash = n > 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyTuple_GET_ITEM(tup, i);
        GlobPattern *p = pattern_compile(PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
        if (!p) {
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
        self->set.pats[self->set.n++] = p;
        self->set.any_slash |= p->has_slash;
        self->set.all_slash &= p->has_slash;
    }
    return (PyObject *)self;
}

static void glob_dealloc(GlobObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    globset_clear(&self->set);
    Py_XDECREF(self->patterns);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* Borrows the UTF-8/fsencoded bytes of a str or bytes argument into *out (kept alive by *keep). */
static int text_arg(PyObject *obj, const char **s, Py_ssize_t *len, PyObject **keep) {
    *keep = NULL;
    if (PyBytes_Check(obj)) {
        *s = PyBytes_AS_STRING(obj);
        *len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        if (PyUnicode_IS_ASCII(obj)) {
            *s = (const char *)PyUnicode_DATA(obj);
            *len = PyUnicode_GET_LENGTH(obj);
            return 0;
        }
        *keep = PyUnicode_EncodeFSDefault(obj);
        if (!*keep) return -1;
        *s = PyBytes_AS_STRING(*keep);
        *len = PyBytes_GET_SIZE(*keep);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "expected str or bytes, not %.100s", Py_TYPE(obj)->tp_name);
    return -1;
}

static PyObject *glob_match(GlobObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"name", "rel", NULL};
    PyObject *name, *rel = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:match", kwlist, &name, &rel)) return NULL;
    const char *ns, *rs = NULL;
    Py_ssize_t nl, rl = 0;
    PyObject *keep_n, *keep_r = NULL;
    if (text_arg(name, &ns, &nl, &keep_n) < 0) return NULL;
    if (rel != Py_None && text_arg(rel, &rs, &rl, &keep_r) < 0) {
        Py_XDECREF(keep_n);
        return NULL;
    }
    int hit = globset_match(&self->set, ns, (size_t)nl, rs, (size_t)rl);
    Py_XDECREF(keep_n);
    Py_XDECREF(keep_r);
    return PyBool_FromLong(hit);
}

static PyObject *glob_repr(GlobObject *self) {
    return PyUnicode_FromFormat("Glob(%R)", self->patterns);
}

static PyMethodDef glob_methods[] = {
    {"match", (PyCFunction)(void (*)(void))glob_match, METH_VARARGS | METH_KEYWORDS,
     "match(name, rel=None) -> bool: does any pattern match?  Patterns containing '/' are "
     "matched against `rel` (the path relative to a walk's root) when it is given."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef glob_members[] = {
    {"patterns", T_OBJECT_EX, offsetof(GlobObject, patterns), READONLY, "the patterns (bytes)"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *glob_any_slash(GlobObject *self, void *closure) {
    return PyBool_FromLong(self->set.any_slash);
}

static PyGetSetDef glob_getset[] = {
    {"any_slash", (getter)glob_any_slash, NULL, "some pattern contains '/' (matched on the relative path)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot glob_slots[] = {
    {Py_tp_new, glob_new},
    {Py_tp_dealloc, glob_dealloc},
    {Py_tp_methods, glob_methods},
    {Py_tp_members, glob_members},
    {Py_tp_getset, glob_getset},
    {Py_tp_repr, glob_repr},
    {Py_tp_doc, "Glob(patterns: tuple[bytes]): compiled fnmatch patterns (any of them matches)."},
    {0, NULL},
};

static PyType_Spec glob_spec = {
    "manyfiles._dents.Glob", sizeof(GlobObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, glob_slots,
};

const GlobSet *globset_from_object(PyObject *obj, ModState *st) {
    if (!PyObject_TypeCheck(obj, st->glob_type)) {
        PyErr_Format(PyExc_TypeError, "expected a manyfiles._dents.Glob, not %.100s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return &((GlobObject *)obj)->set;
}

int glob_add_type(PyObject *module, ModState *st) {
    st->glob_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &glob_spec, NULL);
    if (!st->glob_type) return -1;
    return PyModule_AddType(module, st->glob_type);
}
