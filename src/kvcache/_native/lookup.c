/* A get's hit in C: hash the key, probe the index, confirm the stored key, check the
 * entry's state and expiry, and touch it as a hit, in one call.
 *
 * This is kvcache.engine.table.Table.lookup's common case and nothing else. Whatever
 * is not a plain hit -- a miss (its count and the regret sample), an expired entry,
 * a hash collision, and any word of the segment that is out of range -- returns -1,
 * and the caller runs the pure-Python lookup, which decides (and raises
 * CorruptPoolError on damage). So the compiled path never judges damage itself: it
 * only refuses to go on, and both engines give the same answer by construction.
 *
 * Every word read from the segment is checked before it is used as an offset or an
 * index: an entry id against the entry table, a page against the data region, a key
 * length against the mapping's end. The caller holds the pool's lock (the kernel's
 * flock) around the call, as around the Python lookup.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

/* The segment's words are little-endian ("<i8"), read here as native words. */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvcache._lookup reads the segment's little-endian words natively"
#endif

#define NOT_HERE (-1) /* not a plain hit: let Python decide */
#define READY 2       /* kvcache.layout.READY */
#define CLOCK_LIMIT (INT64_C(1) << 62)
#define EXACT_DOUBLE (INT64_C(1) << 53) /* ints below convert to double exactly */

/* Word indices of the entry fields and header words used (from kvcache.layout). */
enum {
    F_GENERATION, F_STATE, F_HASH_LO, F_HASH_HI, F_KEY_LEN, F_FIRST_PAGE, F_LAST_ACCESS,
    F_ACCESSED_AT, F_FREQ, F_EXPIRES_AT, F_HEADER_LEN, F_VALUE_LEN, F_NUM_PAGES,
    F_ENTRY_WORDS, F_HITS, F_CLOCK, NUM_FIELDS
};

typedef struct {
    PyObject_HEAD
    int64_t entries_offset, max_entries, index_offset, index_slots, page_next_offset;
    int64_t data_offset, num_pages, page_size, total_bytes, half_life;
    int64_t field[NUM_FIELDS];
} Finder;

static int64_t load(const char *base, int64_t word) {
    int64_t value;
    memcpy(&value, base + word * 8, 8);
    return value;
}

static double load_double(const char *base, int64_t word) {
    double value;
    memcpy(&value, base + word * 8, 8);
    return value;
}

static void store(char *base, int64_t word, int64_t value) { memcpy(base + word * 8, &value, 8); }

static void store_double(char *base, int64_t word, double value) {
    memcpy(base + word * 8, &value, 8);
}

/* kvcache.keys.key_hash: the xxh3-128 digest's bytes (big-endian) read as two
 * little-endian signed words. */
static void key_hash(const void *key, size_t length, int64_t *lo, int64_t *hi) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits(key, length));
    memcpy(lo, canonical.digest, 8);
    memcpy(hi, canonical.digest + 8, 8);
}

/* The entry id filed under (lo, hi), or NOT_HERE (absent, or a word out of range). */
static int64_t probe(const Finder *f, const char *map, int64_t lo, int64_t hi) {
    const char *index = map + f->index_offset, *entries = map + f->entries_offset;
    const int64_t *w = f->field, mask = f->index_slots - 1, words = w[F_ENTRY_WORDS];
    int64_t slot = lo & mask;
    for (int64_t probes = 0; probes < f->index_slots; probes++) {
        int64_t value = load(index, slot);
        if (value < 1 || value > f->max_entries) return NOT_HERE; /* empty, or damaged */
        const char *entry = entries + (value - 1) * words * 8;
        if (load(entry, w[F_HASH_LO]) == lo && load(entry, w[F_HASH_HI]) == hi) return value - 1;
        slot = (slot + 1) & mask;
    }
    return NOT_HERE; /* no empty slot: damaged, which Python reports */
}

/* Whether the entry holds exactly ``key`` (its first page and length in range). */
static int holds_key(const Finder *f, const char *map, const char *entry, const char *key,
                     int64_t key_len) {
    const int64_t *w = f->field;
    int64_t first = load(entry, w[F_FIRST_PAGE]);
    if (load(entry, w[F_KEY_LEN]) != key_len || first < 0 || first >= f->num_pages) return 0;
    int64_t start = f->data_offset + first * f->page_size;
    if (key_len > f->total_bytes - start) return 0;
    return memcmp(map + start, key, (size_t)key_len) == 0;
}

/* Table.lookup's hit: count it, tick the logical clock, age and bump the frequency,
 * record the access. 0 (nothing written) where a word is outside what Python would
 * compute the same way: Python then does it, or reports the damage. */
static int touch(const Finder *f, char *map, char *entry, double now) {
    const int64_t *w = f->field;
    int64_t hits = load(map, w[F_HITS]), clock = load(map, w[F_CLOCK]);
    int64_t last_access = load(entry, w[F_LAST_ACCESS]);
    if (hits < 0 || hits >= CLOCK_LIMIT || clock < 0 || clock >= CLOCK_LIMIT) return 0;
    if (f->half_life < 1 || f->half_life >= EXACT_DOUBLE) return 0; /* rounds in Python */
    if (last_access <= -CLOCK_LIMIT || last_access >= CLOCK_LIMIT) return 0;
    clock += 1;
    int64_t idle = clock - last_access;
    if (idle <= -EXACT_DOUBLE || idle >= EXACT_DOUBLE) return 0; /* Python rounds these once */
    /* As Python computes ``freq * 2.0 ** (-idle / half_life) + 1.0``: both ints convert
     * exactly, one rounded division, libm's pow, then a separate multiply and add
     * (the build turns off contraction into a fused multiply-add). */
    double decay = pow(2.0, (double)-idle / (double)f->half_life);
    if (isinf(decay)) return 0; /* Python raises OverflowError here */
    double freq = load_double(entry, w[F_FREQ]) * decay + 1.0;
    store(map, w[F_HITS], hits + 1);
    store(map, w[F_CLOCK], clock);
    store_double(entry, w[F_FREQ], freq);
    store(entry, w[F_LAST_ACCESS], clock);
    store_double(entry, w[F_ACCESSED_AT], now);
    return 1;
}

PyDoc_STRVAR(find_hit_doc,
"find_hit(mapping, key_bytes, now, count) -> int\n\n"
"The id of the READY, unexpired entry holding exactly ``key_bytes`` in the segment\n"
"``mapping`` (a writable buffer of the whole segment), touched as a hit if ``count``;\n"
"-1 for anything else (a miss, an expired entry, a damaged word): the caller then\n"
"runs the pure-Python lookup. The caller holds the pool's lock.");

static PyObject *find_hit(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "find_hit takes mapping, key_bytes, now and count");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[2]);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    int count = PyObject_IsTrue(args[3]);
    if (count < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    int64_t found = NOT_HERE;
    if (view.len >= f->total_bytes) {
        char *map = view.buf;
        const char *key = PyBytes_AS_STRING(args[1]);
        int64_t key_len = PyBytes_GET_SIZE(args[1]), lo, hi;
        key_hash(key, (size_t)key_len, &lo, &hi);
        int64_t eid = probe(f, map, lo, hi);
        if (eid >= 0) {
            const int64_t *w = f->field;
            char *entry = map + f->entries_offset + eid * w[F_ENTRY_WORDS] * 8;
            double expires_at = load_double(entry, w[F_EXPIRES_AT]);
            int expired = expires_at != INFINITY && expires_at <= now;
            if (load(entry, w[F_STATE]) == READY && !expired &&
                holds_key(f, map, entry, key, key_len) && (!count || touch(f, map, entry, now)))
                found = eid;
        }
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(found);
}

/* Copy bytes [start, start + length) of the entry whose page chain begins at ``first``
 * into ``out``. 0 unless the whole chain of ``num_pages`` pages lies in the pool (as
 * PageAllocator.runs demands) and holds those bytes. */
static int gather(const Finder *f, const char *map, int64_t first, int64_t num_pages,
                  int64_t start, int64_t length, char *out) {
    const char *links = map + f->page_next_offset, *data = map + f->data_offset;
    int64_t page = first, skip = start, left = length;
    for (int64_t i = 0; i < num_pages; i++) {
        if (page < 0 || page >= f->num_pages) return 0;
        int64_t take = f->page_size - skip;
        if (take > 0 && left > 0) {
            if (take > left) take = left;
            memcpy(out, data + page * f->page_size + skip, (size_t)take);
            out += take;
            left -= take;
        }
        skip = skip > f->page_size ? skip - f->page_size : 0;
        page = load(links, page);
    }
    return left == 0;
}

PyDoc_STRVAR(copy_value_doc,
"copy_value(mapping, eid, max_bytes) -> bytes | None\n\n"
"A copy of READY entry ``eid``'s value, if it is plain bytes (no codec header) of at\n"
"most ``max_bytes``; None otherwise, or if a word is out of range: the caller then\n"
"copies it the Python way (which reports damage). The caller holds the pool's lock.");

static PyObject *copy_value(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "copy_value takes mapping, eid and max_bytes");
        return NULL;
    }
    int64_t eid = PyLong_AsLongLong(args[1]), max_bytes = PyLong_AsLongLong(args[2]);
    if ((eid == -1 || max_bytes == -1) && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *value = NULL;
    const int64_t *w = f->field;
    if (view.len >= f->total_bytes && eid >= 0 && eid < f->max_entries) {
        const char *map = view.buf;
        const char *entry = map + f->entries_offset + eid * w[F_ENTRY_WORDS] * 8;
        int64_t key_len = load(entry, w[F_KEY_LEN]), value_len = load(entry, w[F_VALUE_LEN]);
        int64_t num_pages = load(entry, w[F_NUM_PAGES]);
        if (load(entry, w[F_STATE]) == READY && load(entry, w[F_HEADER_LEN]) == 0 &&
            key_len > 0 && value_len >= 0 && value_len <= max_bytes &&
            key_len <= f->num_pages * f->page_size && value_len <= f->num_pages * f->page_size &&
            num_pages > 0 && num_pages <= f->num_pages) {
            value = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)value_len);
            if (value == NULL) goto done;
            if (!gather(f, map, load(entry, w[F_FIRST_PAGE]), num_pages, key_len, value_len,
                        PyBytes_AS_STRING(value)))
                Py_CLEAR(value);
        }
    }
    if (value == NULL) value = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    return value;
}

PyDoc_STRVAR(key_hash_doc,
"key_hash(key_bytes) -> (lo, hi)\n\n"
"kvcache.keys.key_hash computed here (for tests: both must agree).");

static PyObject *py_key_hash(PyObject *module, PyObject *key) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(key, &view, PyBUF_SIMPLE) < 0) return NULL;
    int64_t lo, hi;
    key_hash(view.buf, (size_t)view.len, &lo, &hi);
    PyBuffer_Release(&view);
    return Py_BuildValue("(LL)", (long long)lo, (long long)hi);
}

static int finder_init(Finder *f, PyObject *args, PyObject *kwargs) {
    PyObject *fields;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Finder takes positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "LLLLLLLLLLO!", &f->entries_offset, &f->max_entries,
                          &f->index_offset, &f->index_slots, &f->page_next_offset,
                          &f->data_offset, &f->num_pages,
                          &f->page_size, &f->total_bytes, &f->half_life, &PyTuple_Type, &fields))
        return -1;
    if (PyTuple_GET_SIZE(fields) != NUM_FIELDS) {
        PyErr_Format(PyExc_ValueError, "Finder needs %d field word indices", NUM_FIELDS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < NUM_FIELDS; i++) {
        f->field[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(fields, i));
        if (f->field[i] == -1 && PyErr_Occurred()) return -1;
    }
    /* The geometry comes from this process's validated header, yet a wrong one must not
     * let a probe reach past the mapping: check that every region fits. */
    const int64_t *w = f->field, limit = INT64_C(1) << 48;
    int ok = f->index_slots > 0 && (f->index_slots & (f->index_slots - 1)) == 0 &&
             f->max_entries > 0 && f->num_pages > 0 && f->page_size > 0 &&
             f->total_bytes > 0 && f->total_bytes < limit &&
             f->max_entries < limit && f->index_slots < limit && f->num_pages < limit &&
             f->page_size < limit && w[F_ENTRY_WORDS] > 0 && w[F_ENTRY_WORDS] < 4096;
    for (int i = 0; ok && i < F_ENTRY_WORDS; i++) ok = w[i] >= 0 && w[i] < w[F_ENTRY_WORDS];
    ok = ok && w[F_HITS] >= 0 && w[F_CLOCK] >= 0 && w[F_HITS] < 512 && w[F_CLOCK] < 512;
    int64_t data_bytes = 0, entry_bytes = 0;
    ok = ok && !__builtin_mul_overflow(f->num_pages, f->page_size, &data_bytes) &&
         !__builtin_mul_overflow(f->max_entries, w[F_ENTRY_WORDS] * 8, &entry_bytes);
    ok = ok && f->entries_offset >= 4096 && f->index_offset >= 0 && f->data_offset >= 0 &&
         f->entries_offset < limit && f->index_offset < limit && f->data_offset < limit &&
         entry_bytes <= f->total_bytes - f->entries_offset &&
         f->index_offset + f->index_slots * 8 <= f->total_bytes &&
         f->page_next_offset >= 0 && f->page_next_offset < limit &&
         f->page_next_offset + f->num_pages * 8 <= f->total_bytes &&
         data_bytes <= f->total_bytes - f->data_offset;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "Finder: inconsistent geometry");
        return -1;
    }
    return 0;
}

static PyMethodDef finder_methods[] = {
    {"find_hit", (PyCFunction)(void (*)(void))find_hit, METH_FASTCALL, find_hit_doc},
    {"copy_value", (PyCFunction)(void (*)(void))copy_value, METH_FASTCALL, copy_value_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FinderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvcache._lookup.Finder",
    .tp_basicsize = sizeof(Finder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("Finder(entries_offset, max_entries, index_offset, index_slots, "
                        "page_next_offset, data_offset, num_pages, page_size, total_bytes, "
                        "lfu_half_life, fields): one segment's geometry, for find_hit and "
                        "copy_value."),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)finder_init,
    .tp_methods = finder_methods,
};

static PyMethodDef methods[] = {
    {"key_hash", py_key_hash, METH_O, key_hash_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvcache._lookup",
    "A get's hit in C (see kvcache.native and kvcache.engine.table).", -1, methods,
};

PyMODINIT_FUNC PyInit__lookup(void) {
    if (PyType_Ready(&FinderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&FinderType);
    if (PyModule_AddObject(m, "Finder", (PyObject *)&FinderType) < 0) {
        Py_DECREF(&FinderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
