/* The sampled policies' ranking of eviction candidates in C: kvcache.policies.rank_victims
 * for a sample's best ``top``, for the policies whose score is a field as it is (lru: the
 * last access, fifo: the creation, priority, ttl: the expiry, size: the pages).
 *
 * Part of kvcache._lookup (lookup.c includes it). It orders as numpy does: a candidate's
 * key is minus its score as a double (the ints converted as numpy's astype converts
 * them), minus infinity once expired; candidates sort by key, then by last access, then
 * by their place in the sample (lexsort is stable), NaN keys last; where the top-th key
 * is NaN none is kept (numpy cuts at the top-th key and keeps the keys at most that: no
 * key is at most NaN). lfu (a decay through exp2, whose rounding is libm's) is left to
 * numpy. A candidate out of range answers None.
 */

enum { RANK_LRU = 1, RANK_FIFO = 2, RANK_PRIORITY = 3, RANK_TTL = 4, RANK_SIZE = 5 };

typedef struct {
    double key;
    int64_t last_access, place;
} Candidate;

/* Whether ``a`` goes before ``b``: key (NaN last), last access, place. */
static int before(const Candidate *a, const Candidate *b) {
    int a_nan = isnan(a->key), b_nan = isnan(b->key);
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && a->key != b->key) return a->key < b->key;
    if (a->last_access != b->last_access) return a->last_access < b->last_access;
    return a->place < b->place;
}

static double rank_key(const Finder *f, const char *entry, int64_t kind, double now) {
    const int64_t *w = f->field;
    double expires_at = load_double(entry, w[F_EXPIRES_AT]);
    if (expires_at <= now) return -INFINITY;
    switch (kind) {
    case RANK_LRU: return (double)load(entry, w[F_LAST_ACCESS]);
    case RANK_FIFO: return (double)load(entry, w[F_CREATED]);
    case RANK_PRIORITY: return (double)load(entry, w[F_PRIORITY]);
    case RANK_TTL: return expires_at;
    default: return -(double)load(entry, w[F_NUM_PAGES]);
    }
}

#define RANK_TOP_MAX 64
#define SAMPLE_AHEAD 16 /* candidates whose words are fetched ahead of their turn */

/* The best ``top`` (at most RANK_TOP_MAX) of the ``count`` candidates ``ids`` into
 * ``best``, best first, with numpy's cut; how many, or -1 for an id out of range. */
static int64_t rank_sample(const Finder *f, const char *map, int64_t kind, const void *ids,
                           int64_t count, int64_t top, double now, Candidate *best) {
    int64_t kept = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t eid = load(ids, i);
        if (eid < 0 || eid >= f->max_entries) return -1;
        if (i + SAMPLE_AHEAD < count) { /* a random record, each of whose two lines read */
            int64_t ahead = load(ids, i + SAMPLE_AHEAD);
            if (ahead >= 0 && ahead < f->max_entries) {
                const char *entry = entry_at(f, map, ahead);
                __builtin_prefetch(entry + f->field[F_LAST_ACCESS] * 8);
                __builtin_prefetch(entry + f->field[F_EXPIRES_AT] * 8);
            }
        }
        const char *entry = entry_at(f, map, eid);
        Candidate c = {rank_key(f, entry, kind, now), load(entry, f->field[F_LAST_ACCESS]), i};
        if (kept == top && !before(&c, &best[kept - 1])) continue;
        int64_t at = kept < top ? kept++ : kept - 1; /* insert in order, the worst falls off */
        while (at > 0 && before(&c, &best[at - 1])) {
            best[at] = best[at - 1];
            at--;
        }
        best[at] = c;
    }
    if (kept && isnan(best[kept - 1].key)) kept = 0; /* numpy's cut: no key <= NaN */
    return kept;
}

/* The ``count`` candidates ``best`` as a list: their places in the sample, or with ``ids``
 * (the sample) their entry ids; NULL with an exception set. */
static PyObject *ranked_list(const Candidate *best, int64_t count, const int64_t *ids) {
    PyObject *list = PyList_New((Py_ssize_t)count);
    for (int64_t i = 0; list != NULL && i < count; i++) {
        int64_t place = best[i].place;
        PyObject *item = PyLong_FromLongLong(ids == NULL ? place : ids[place]);
        if (item == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

PyDoc_STRVAR(rank_doc,
"rank(mapping, kind, ids, top, now) -> list[int] | None\n\n"
"The places in ``ids`` (an int64 buffer of entry ids: a sample) of the best ``top``\n"
"victims, best first, as kvcache.policies.rank_victims orders them for policy ``kind``\n"
"(kvcache.fastpath.RANK_KINDS); None for an id out of range.");

static PyObject *rank(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "rank takes mapping, kind, ids, top and now");
        return NULL;
    }
    int64_t kind = PyLong_AsLongLong(args[1]), top = PyLong_AsLongLong(args[3]);
    double now = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (top < 1 || top > RANK_TOP_MAX || kind < RANK_LRU || kind > RANK_SIZE) {
        PyErr_SetString(PyExc_ValueError, "rank: top must be 1 to 64 and kind a RANK_KIND");
        return NULL;
    }
    Py_buffer view, ids;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[2], &ids, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *result = NULL;
    Candidate best[RANK_TOP_MAX];
    int64_t kept = -1;
    if (view.len >= f->total_bytes && ids.len % 8 == 0)
        kept = rank_sample(f, view.buf, kind, ids.buf, ids.len / 8, top, now, best);
    if (kept >= 0) result = ranked_list(best, kept, NULL);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&view);
    if (result == NULL && !PyErr_Occurred()) result = Py_NewRef(Py_None);
    return result;
}

/* ``ids[i] = live[words[i] % count]`` for ``num`` words (``count`` > 0). */
static void draw_sample(const void *live, uint64_t count, const void *words, int64_t num,
                        void *ids) {
    for (int64_t i = 0; i < num; i++) { /* the places first, their words fetched meanwhile */
        int64_t place = (int64_t)((uint64_t)load(words, i) % count);
        __builtin_prefetch((const char *)live + place * 8);
        store(ids, i, place);
    }
    for (int64_t i = 0; i < num; i++) store(ids, i, load(live, load(ids, i)));
}

PyDoc_STRVAR(draw_doc,
"draw(live, words, ids) -> None\n\n"
"Fill ``ids`` (int64) with ``live[words[i] % len(live)]``: a sample of the live entries\n"
"drawn by random 64-bit ``words`` (uint64, as many as ``ids``), as numpy's\n"
"``live[words % len(live)]`` draws it.");

static PyObject *draw(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "draw takes live, words and ids");
        return NULL;
    }
    Py_buffer live, words, ids;
    if (PyObject_GetBuffer(args[0], &live, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &words, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&live);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &ids, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&words);
        PyBuffer_Release(&live);
        return NULL;
    }
    uint64_t count = (uint64_t)live.len / 8;
    int ok = live.len % 8 == 0 && count > 0 && words.len % 8 == 0 && ids.len == words.len;
    if (ok) {
        draw_sample(live.buf, count, words.buf, words.len / 8, ids.buf);
    } else {
        PyErr_SetString(PyExc_ValueError, "draw: live, words and ids must be 8-byte items, "
                                          "live not empty, ids as long as words");
    }
    PyBuffer_Release(&ids);
    PyBuffer_Release(&words);
    PyBuffer_Release(&live);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}
