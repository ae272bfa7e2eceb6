/* A get's hit in C: hash the key, probe the index, confirm the stored key, check the
 * entry's state and expiry, and touch it as a hit, in one call.
 *
 * This is kvcache.engine.table.Table.lookup's common case and nothing else. A key
 * certainly absent (the probe met an empty slot, every word on its way in range)
 * returns -2 and the caller counts the miss (and asks the regret sample). Whatever
 * else is not a plain hit -- an expired entry, a hash collision, and any word of the
 * segment that is out of range -- returns -1, and the caller runs the pure-Python
 * lookup, which decides (and raises CorruptPoolError on damage). So the compiled path
 * never judges damage itself: it only refuses to go on, and both engines give the
 * same answer by construction.
 *
 * copy_value copies a small plain value out under the lock and, asked to verify,
 * sums the entry's bytes in the same pass; a sum that differs from the one its writer
 * published is the one judgement made here, answered as False for the caller to drop
 * the entry as damaged (as the Python path does).
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

#if defined(__x86_64__) || defined(__i386__)
/* xxhash inline, its long-input sums picking SSE2, AVX2 or AVX-512 at run time: a
 * verified 64 KiB get sums at twice the speed of the SSE2 build (measured) */
#include "xxh_x86dispatch.c"
#include "xxh_x86dispatch.h"
#else
#define XXH_INLINE_ALL /* NEON on aarch64, chosen when compiling */
#include "xxhash.h"
#endif

/* The segment's words are little-endian ("<i8"), read here as native words. */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvcache._lookup reads the segment's little-endian words natively"
#endif

#define NOT_HERE (-1) /* not a plain hit: let Python decide */
#define ABSENT (-2)   /* certainly not in the index: Python only counts the miss */
#define READY 2       /* kvcache.layout.READY */
#define CLOCK_LIMIT (INT64_C(1) << 62)
#define EXACT_DOUBLE (INT64_C(1) << 53) /* ints below convert to double exactly */

/* Word indices of the entry fields and header words used (from kvcache.layout). */
enum {
    F_GENERATION, F_STATE, F_HASH_LO, F_HASH_HI, F_KEY_LEN, F_FIRST_PAGE, F_LAST_ACCESS,
    F_ACCESSED_AT, F_FREQ, F_EXPIRES_AT, F_HEADER_LEN, F_VALUE_LEN, F_NUM_PAGES, F_FLAGS,
    F_CHECKSUM, F_ENTRY_WORDS, F_HITS, F_CLOCK, NUM_FIELDS
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

/* The entry id filed under (lo, hi); ABSENT where the probe reached an empty slot having
 * read only entry ids in range (Python's probe reads the same words and finds nothing);
 * NOT_HERE for a word out of range or an index without an empty slot. */
static int64_t probe(const Finder *f, const char *map, int64_t lo, int64_t hi) {
    const char *index = map + f->index_offset, *entries = map + f->entries_offset;
    const int64_t *w = f->field, mask = f->index_slots - 1, words = w[F_ENTRY_WORDS];
    int64_t slot = lo & mask;
    for (int64_t probes = 0; probes < f->index_slots; probes++) {
        int64_t value = load(index, slot);
        if (value == 0) return ABSENT;
        if (value < 0 || value > f->max_entries) return NOT_HERE; /* damaged */
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
"-2 where the key is certainly absent (the probe reached an empty slot, every word on\n"
"the way in range): the caller only counts the miss; -1 for anything else (an expired\n"
"entry, a hash collision, a damaged word): the caller then runs the pure-Python\n"
"lookup. The caller holds the pool's lock.");

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
        if (eid == ABSENT) found = ABSENT;
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

/* Bytes summed and then copied per step: the sum leaves them in L1 for the copy. */
#define STRETCH INT64_C(16384)

/* Copy bytes [start, start + length) of the entry whose page chain begins at ``first``
 * into ``out``; with ``state``, sum bytes [0, start + length) into it in the same pass
 * (each stretch summed, then copied from the cache). 0 unless the whole chain of
 * ``num_pages`` pages lies in the pool (as PageAllocator.runs demands) and holds those
 * bytes. */
static int gather(const Finder *f, const char *map, int64_t first, int64_t num_pages,
                  int64_t start, int64_t length, char *out, XXH3_state_t *state) {
    const char *links = map + f->page_next_offset, *data = map + f->data_offset;
    int64_t page = first, at = 0, end = start + length;
    for (int64_t i = 0; i < num_pages; i++) {
        if (page < 0 || page >= f->num_pages) return 0;
        const char *bytes = data + page * f->page_size;
        int64_t page_end = at + f->page_size < end ? at + f->page_size : end;
        while (at < page_end) {
            int64_t step = page_end - at < STRETCH ? page_end - at : STRETCH;
            const char *from = bytes + (at - i * f->page_size);
            if (state != NULL) XXH3_64bits_update(state, from, (size_t)step);
            if (at + step > start) {
                int64_t skip = start > at ? start - at : 0;
                memcpy(out + (at + skip - start), from + skip, (size_t)(step - skip));
            }
            at += step;
        }
        page = load(links, page);
    }
    return at == end;
}

/* Copy the payload (bytes [start, start + length) of the entry) into ``out``; with
 * ``verify``, sum the entry's bytes in the same pass as kvcache.transfer.checksum does
 * (the record fields flags, key_len, header_len, value_len as four little-endian words,
 * then key | value header | payload). 1: copied (and intact), 0: the sum differs from the
 * one its writer published (damaged), -1: the page chain is out of range. */
static int copy_entry(const Finder *f, const char *map, const char *entry, int64_t start,
                      int64_t length, int64_t num_pages, char *out, int verify) {
    const int64_t *w = f->field, first = load(entry, w[F_FIRST_PAGE]);
    if (!verify) return gather(f, map, first, num_pages, start, length, out, NULL) ? 1 : -1;
    int64_t fields[4] = {load(entry, w[F_FLAGS]), load(entry, w[F_KEY_LEN]),
                         load(entry, w[F_HEADER_LEN]), length};
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    XXH3_64bits_update(&state, fields, sizeof fields);
    if (!gather(f, map, first, num_pages, start, length, out, &state)) return -1;
    return XXH3_64bits_digest(&state) == (uint64_t)load(entry, w[F_CHECKSUM]);
}

/* Entry ``eid`` of the mapping, if READY with every length in range and a value of at
 * most ``max_bytes`` (and no codec header unless ``headers``); NULL otherwise. Sets the
 * payload's start in the entry's bytes, its length and the chain's number of pages. */
static const char *readable(const Finder *f, const char *map, int64_t eid, int64_t max_bytes,
                            int headers, int64_t *start, int64_t *length, int64_t *num_pages) {
    const int64_t *w = f->field, pool_bytes = f->num_pages * f->page_size;
    if (eid < 0 || eid >= f->max_entries) return NULL;
    const char *entry = map + f->entries_offset + eid * w[F_ENTRY_WORDS] * 8;
    int64_t key_len = load(entry, w[F_KEY_LEN]), header_len = load(entry, w[F_HEADER_LEN]);
    *length = load(entry, w[F_VALUE_LEN]);
    *num_pages = load(entry, w[F_NUM_PAGES]);
    *start = key_len + header_len;
    if (load(entry, w[F_STATE]) != READY || header_len < 0 || (header_len && !headers) ||
        key_len <= 0 || key_len > pool_bytes || header_len > pool_bytes || *length < 0 ||
        *length > max_bytes || *length > pool_bytes || *num_pages <= 0 ||
        *num_pages > f->num_pages)
        return NULL;
    return entry;
}

PyDoc_STRVAR(copy_value_doc,
"copy_value(mapping, eid, max_bytes, verify) -> bytes | None | False\n\n"
"A copy of READY entry ``eid``'s value, if it is plain bytes (no codec header) of at\n"
"most ``max_bytes``; None otherwise, or if a word is out of range: the caller then\n"
"copies it the Python way (which reports damage). With ``verify`` the entry's bytes\n"
"are summed in the same pass and False means they fail their checksum (damaged).\n"
"The caller holds the pool's lock.");

static PyObject *copy_value(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "copy_value takes mapping, eid, max_bytes and verify");
        return NULL;
    }
    int64_t eid = PyLong_AsLongLong(args[1]), max_bytes = PyLong_AsLongLong(args[2]);
    if ((eid == -1 || max_bytes == -1) && PyErr_Occurred()) return NULL;
    int verify = PyObject_IsTrue(args[3]);
    if (verify < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *value = NULL;
    int64_t start, length, num_pages;
    const char *entry = view.len >= f->total_bytes
        ? readable(f, view.buf, eid, max_bytes, 0, &start, &length, &num_pages) : NULL;
    if (entry != NULL) {
        value = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
        if (value == NULL) goto done;
        int intact = copy_entry(f, view.buf, entry, start, length, num_pages,
                                PyBytes_AS_STRING(value), verify);
        if (intact < 0) Py_CLEAR(value);
        else if (!intact) Py_SETREF(value, Py_NewRef(Py_False));
    }
    if (value == NULL) value = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    return value;
}

PyDoc_STRVAR(copy_into_doc,
"copy_into(mapping, eid, target, max_bytes, verify) -> int | None | False\n\n"
"Copy READY entry ``eid``'s payload (an array's bytes without their codec header) of at\n"
"most ``max_bytes`` to the start of the writable buffer ``target``; its length. None if\n"
"it does not fit ``target``, or a word is out of range: the caller then copies it the\n"
"Python way (which raises or reports damage). With ``verify`` the entry's bytes are\n"
"summed in the same pass and False means they fail their checksum (damaged). The\n"
"caller holds the pool's lock.");

static PyObject *copy_into(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "copy_into takes mapping, eid, target, max_bytes and verify");
        return NULL;
    }
    int64_t eid = PyLong_AsLongLong(args[1]), max_bytes = PyLong_AsLongLong(args[3]);
    if ((eid == -1 || max_bytes == -1) && PyErr_Occurred()) return NULL;
    int verify = PyObject_IsTrue(args[4]);
    if (verify < 0) return NULL;
    Py_buffer view, target;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[2], &target, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *result = NULL;
    int64_t start, length, num_pages;
    const char *entry = view.len >= f->total_bytes
        ? readable(f, view.buf, eid, max_bytes, 1, &start, &length, &num_pages) : NULL;
    if (entry != NULL && length <= target.len) {
        int intact = copy_entry(f, view.buf, entry, start, length, num_pages, target.buf, verify);
        if (intact > 0) result = PyLong_FromLongLong(length);
        else if (!intact) result = Py_NewRef(Py_False);
    }
    if (result == NULL && !PyErr_Occurred()) result = Py_NewRef(Py_None);
    PyBuffer_Release(&target);
    PyBuffer_Release(&view);
    return result;
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
    {"copy_into", (PyCFunction)(void (*)(void))copy_into, METH_FASTCALL, copy_into_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FinderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvcache._lookup.Finder",
    .tp_basicsize = sizeof(Finder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("Finder(entries_offset, max_entries, index_offset, index_slots, "
                        "page_next_offset, data_offset, num_pages, page_size, total_bytes, "
                        "lfu_half_life, fields): one segment's geometry, for find_hit, "
                        "copy_value and copy_into."),
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
