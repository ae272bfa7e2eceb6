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
 * read is the whole get of a small plain value without the lock, in pools whose
 * policy keeps no queues (a queue policy's hit moves shared lists: under the lock).
 * The entry's generation, read before and after the copy, tells a copy that a writer
 * overtook (every reuse of an entry or its pages changes its generation or state
 * first, under the lock), which is then tried again; the hit's counters tick
 * atomically (tick, also used by holders of the lock). Anything else it leaves to the
 * caller's locked path, as find_hit does.
 *
 * put (put.c, included below) is a whole small put: reserve, copy and sum, publish,
 * with a queue policy's part and, in its pools, the eviction that makes room (admit.c);
 * delete removes a key's entry in pools whose policy keeps no queues.
 *
 * Every word read from the segment is checked before it is used as an offset or an
 * index: an entry id against the entry table, a page against the data region, a key
 * length against the mapping's end. The caller holds the pool's lock around every call
 * but read and present.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "lockword.h"
#include "sumcopy.h" /* xxhash, copy_bytes, and sum_copy: the copy riding in the sum */

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
    F_CHECKSUM, F_PROBATION, F_QUEUE_PREV, F_QUEUE_NEXT, F_READS,
    F_LAST_PAGE, F_PRIORITY, F_OWNER_SLOT, F_OWNER_SERIAL, F_CREATED, F_CREATED_AT,
    F_LIVE_POS, F_NEXT_FREE, F_PARENT, F_FIRST_CHILD, F_NEXT_SIBLING, F_PREV_SIBLING, F_DEPTH,
    F_ENTRY_WORDS, /* the entry's words; header words follow */
    F_HITS, F_CLOCK, F_RETIRED, F_FLOCK_USERS, F_PROBATION_HEAD, F_PROBATION_TAIL,
    F_MAIN_HEAD, F_MAIN_TAIL, F_NUM_PROBATION,
    F_NUM_FREE_PAGES, F_FREE_PAGE_HEAD, F_NEXT_FRESH_PAGE, F_RESERVED_PAGES, F_USED_PAGES,
    F_FREE_ENTRY_HEAD, F_NEXT_FRESH_ENTRY, F_NUM_LIVE, F_PUTS, F_NEXT_EXPIRY_AT,
    F_REGRET_SECONDS, F_REGRET_SECONDS_SUM, F_REGRET_ACCESSES, F_REGRET_ACCESSES_SUM,
    F_REGRET_RING, F_REGRET_NEXT, F_REGRET_UNREQUESTED, F_EVICTIONS, F_DIRTY, F_LOCK_WORD,
    F_SKETCH_COUNTED, F_USED_SLOTS, F_DEFERRED_NEXT, F_DEFERRED_DONE, F_DEFERRED,
    F_GHOST_NEXT, F_GHOST_TAIL_PROBATION, F_GHOST_TAIL_MAIN, F_NUM_GHOSTS_PROBATION,
    F_NUM_GHOSTS_MAIN, F_PROBATION_TARGET, F_LAST_ADMITTED, F_NEXT_SWEEP_PUTS,
    NUM_FIELDS
};

/* A pool's queue policy, whose put put.c makes (kvcache.fastpath.QUEUE_POLICIES). */
enum { NO_QUEUES = 0, QUEUE_S3FIFO = 1, QUEUE_ARC = 2, QUEUE_PREFIX = 3 };

/* What a hit does to a queue policy's lists (kvcache.fastpath.HIT_KINDS). */
enum { HIT_TOUCH = 0, HIT_COUNTS_READS = 1, HIT_MOVES_TO_MAIN = 2 };
#define PROBATION 1 /* kvcache.queues: an entry's list */
#define MAIN 0

/* Reads without the lock (``read``) rely on stores becoming visible in program order:
 * the writers are Python's plain stores, ordered by nothing else. x86-64 (TSO) gives
 * that; elsewhere ``read`` answers None and every get takes the lock. */
#if defined(__x86_64__)
#define UNLOCKED_READS 1
#else
#define UNLOCKED_READS 0
#endif
#define UNLOCKED_ATTEMPTS 4 /* copies overtaken by a writer before the lock is taken */

typedef struct {
    PyObject_HEAD
    int64_t entries_offset, max_entries, index_offset, index_slots, page_next_offset;
    int64_t data_offset, num_pages, page_size, total_bytes, half_life, hit_kind, max_reads;
    int64_t live_offset, regret_mask;
    int64_t inline_offset, inline_bytes; /* the inline slots; 0 and 0 where none */
    int64_t sketch_offset, sketch_bytes, sketch_period; /* request counts; 0, 0 where none */
    int64_t ghost_offset, queue_policy; /* the ghost ring (kvcache.queues) and its policy */
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

/* The words a queue policy's put changes, each with its value before, so that a put that
 * meets a word out of range half-way puts them all back and leaves the put to Python
 * (put.c's queue part: the lists, ghosts, tree and counts it changes depend on each
 * other, so they are checked as they are followed, not all before). */
#define JOURNAL_WORDS 1024
typedef struct {
    int64_t count;
    int full; /* a store found no room: the put is undone */
    char *at[JOURNAL_WORDS];
    int64_t was[JOURNAL_WORDS];
} Journal;

/* The word about to be stored, remembered in ``journal`` where there is one: 0 where the
 * journal is full (the store is then not made, and the put undone). */
static int journal_word(Journal *journal, char *base, int64_t word) {
    if (journal == NULL) return 1;
    if (journal->count == JOURNAL_WORDS) {
        journal->full = 1;
        return 0;
    }
    journal->at[journal->count] = base + word * 8;
    memcpy(&journal->was[journal->count++], base + word * 8, 8);
    return 1;
}

/* ``store``, remembered in ``journal`` where there is one. */
static void put_word(Journal *journal, char *base, int64_t word, int64_t value) {
    if (journal_word(journal, base, word)) store(base, word, value);
}

/* Every word ``journal`` remembers, put back as it was, newest first. */
static void undo(Journal *journal) {
    while (journal->count > 0) {
        journal->count--;
        memcpy(journal->at[journal->count], &journal->was[journal->count], 8);
    }
}

/* A word read before what it guards (the generation before the entry it numbers). */
static int64_t load_acquire(const char *base, int64_t word) {
    return __atomic_load_n((const int64_t *)(const void *)(base + word * 8), __ATOMIC_ACQUIRE);
}

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

static char *entry_at(const Finder *f, const char *map, int64_t eid) {
    return (char *)map + f->entries_offset + eid * f->field[F_ENTRY_WORDS] * 8;
}

/* The offset in the mapping of entry ``eid``'s inline slot. */
static int64_t slot_of(const Finder *f, int64_t eid) {
    return f->inline_offset + eid * f->inline_bytes;
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
        /* Where the entry's bytes lie if it is in its slot, known from its id alone: their
         * cache miss overlaps the record's rather than following it (a put into a pool of
         * a million slot entries took 9% less time; gets were unchanged). */
        if (f->inline_bytes) __builtin_prefetch(map + slot_of(f, value - 1));
        if (load(entry, w[F_HASH_LO]) == lo && load(entry, w[F_HASH_HI]) == hi) return value - 1;
        slot = (slot + 1) & mask;
    }
    return NOT_HERE; /* no empty slot: damaged, which Python reports */
}

/* Whether the entry at ``entry`` lies in its inline slot: it holds no page, in a pool with
 * slots (Table.extents). */
static int in_slot(const Finder *f, const char *entry) {
    return f->inline_bytes && load(entry, f->field[F_NUM_PAGES]) == 0;
}

/* Whether entry ``eid`` holds exactly ``key``: its key length, and the bytes where they
 * begin (its inline slot, or its first page, in range). */
static int holds_key(const Finder *f, const char *map, int64_t eid, const char *key,
                     int64_t key_len) {
    const char *entry = entry_at(f, map, eid);
    int64_t start = slot_of(f, eid);
    if (!in_slot(f, entry)) {
        int64_t first = load(entry, f->field[F_FIRST_PAGE]);
        if (first < 0 || first >= f->num_pages) return 0;
        start = f->data_offset + first * f->page_size;
    }
    if (load(entry, f->field[F_KEY_LEN]) != key_len) return 0;
    if (key_len > f->total_bytes - start) return 0;
    return memcmp(map + start, key, (size_t)key_len) == 0;
}

/* The logical clock's next tick (and a hit counted, with ``hit``), taken atomically:
 * readers without the lock tick it beside holders of the lock. -1 (nothing changed)
 * where the clock or the count is out of range: Python then ticks it, or reports the
 * damage. */
static int64_t tick(const Finder *f, char *map, int hit) {
    const int64_t *w = f->field;
    int64_t *clock = (int64_t *)(void *)(map + w[F_CLOCK] * 8);
    int64_t *hits = (int64_t *)(void *)(map + w[F_HITS] * 8);
    int64_t counted = __atomic_load_n(hits, __ATOMIC_RELAXED);
    if (hit && (counted < 0 || counted >= CLOCK_LIMIT)) return -1;
    int64_t seen = __atomic_load_n(clock, __ATOMIC_RELAXED);
    do {
        if (seen < 0 || seen >= CLOCK_LIMIT) return -1;
    } while (!__atomic_compare_exchange_n(clock, &seen, seen + 1, 0, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    if (hit) __atomic_fetch_add(hits, 1, __ATOMIC_RELAXED);
    return seen + 1;
}


/* Whether the queue policy's hit can be done here: every word it reads in range (an
 * entry's list, its links, main's head, the probation count; s3fifo's read count). */
static int queue_hit_ok(const Finder *f, const char *map, const char *entry) {
    const int64_t *w = f->field, n = f->max_entries;
    if (f->hit_kind == HIT_COUNTS_READS) {
        int64_t reads = load(entry, w[F_READS]);
        return reads >= 0 && reads <= f->max_reads;
    }
    if (f->hit_kind != HIT_MOVES_TO_MAIN) return 1;
    int64_t kind = load(entry, w[F_PROBATION]), prev = load(entry, w[F_QUEUE_PREV]);
    int64_t after = load(entry, w[F_QUEUE_NEXT]), head = load(map, w[F_MAIN_HEAD]);
    int64_t on_probation = load(map, w[F_NUM_PROBATION]);
    return (kind == MAIN || kind == PROBATION) && prev >= 0 && prev <= n && after >= 0 &&
           after <= n && head >= 0 && head <= n && on_probation > INT64_MIN + 1;
}

/* EntryQueues.unlink of ``eid`` from its list, if it is in one (its words checked by the
 * caller: its list, its links, the probation count); each store remembered in ``j`` where
 * there is one (a put's). */
static void unlink_entry(const Finder *f, char *map, int64_t eid, Journal *j) {
    const int64_t *w = f->field;
    char *entry = entry_at(f, map, eid);
    int64_t kind = load(entry, w[F_PROBATION]), prev = load(entry, w[F_QUEUE_PREV]);
    int64_t after = load(entry, w[F_QUEUE_NEXT]);
    int64_t head_word = kind == PROBATION ? w[F_PROBATION_HEAD] : w[F_MAIN_HEAD];
    int64_t tail_word = kind == PROBATION ? w[F_PROBATION_TAIL] : w[F_MAIN_TAIL];
    if (!prev && !after && load(map, head_word) != eid + 1) return; /* in no list */
    put_word(j, map, w[F_NUM_PROBATION], load(map, w[F_NUM_PROBATION]) - kind);
    if (prev) put_word(j, entry_at(f, map, prev - 1), w[F_QUEUE_NEXT], after);
    else put_word(j, map, head_word, after);
    if (after) put_word(j, entry_at(f, map, after - 1), w[F_QUEUE_PREV], prev);
    else put_word(j, map, tail_word, prev);
    put_word(j, entry, w[F_QUEUE_PREV], 0);
    put_word(j, entry, w[F_QUEUE_NEXT], 0);
}

/* QueuePolicy.hit, written as kvcache.queues writes it (checked by queue_hit_ok):
 * s3fifo counts a read (at most max_reads); arc and prefix move the entry to the head
 * of main (EntryQueues.unlink, then push), store for store in the same order; each
 * store remembered in ``j`` where there is one (a put's). */
static void queue_hit(const Finder *f, char *map, int64_t eid, Journal *j) {
    const int64_t *w = f->field;
    char *entry = entry_at(f, map, eid);
    if (f->hit_kind == HIT_COUNTS_READS) {
        int64_t reads = load(entry, w[F_READS]) + 1;
        put_word(j, entry, w[F_READS], reads < f->max_reads ? reads : f->max_reads);
        return;
    }
    if (f->hit_kind != HIT_MOVES_TO_MAIN) return;
    unlink_entry(f, map, eid, j);
    int64_t head = load(map, w[F_MAIN_HEAD]); /* push to main's head */
    put_word(j, entry, w[F_PROBATION], MAIN);
    put_word(j, entry, w[F_QUEUE_PREV], 0);
    put_word(j, entry, w[F_QUEUE_NEXT], head);
    if (head) put_word(j, entry_at(f, map, head - 1), w[F_QUEUE_PREV], eid + 1);
    else put_word(j, map, w[F_MAIN_TAIL], eid + 1);
    put_word(j, map, w[F_MAIN_HEAD], eid + 1);
}

#define SKETCH_LIMIT 15 /* kvcache.sketch.LIMIT: the largest count */
#define SKETCH_MAX_BYTES (INT64_C(1) << 28) /* kvcache.sketch.MAX_BYTES */

/* kvcache.sketch.RequestCounts.count, store for store: one request for the key of this
 * hash (the smallest of its four counters raised, up to SKETCH_LIMIT); every sketch_period
 * counts, all counters halve. The counted word is read as it is: any value outside
 * [0, period - 1) halves, as in Python, so a damaged one costs an early halving and nothing
 * else. With a ``journal`` (a put's), each counter's word is remembered, and a count that
 * would halve the counters is not made: 0, nothing changed (the put is left to Python). */
static int count_request(const Finder *f, char *map, int64_t hash_lo, int64_t hash_hi,
                         Journal *journal) {
    unsigned char *counts = (unsigned char *)map + f->sketch_offset;
    uint64_t mask = (uint64_t)f->sketch_bytes - 1, lo = (uint64_t)hash_lo, hi = (uint64_t)hash_hi;
    uint64_t spots[4] = {lo & mask, (lo >> 32) & mask, hi & mask, (hi >> 32) & mask};
    int64_t counted = load(map, f->field[F_SKETCH_COUNTED]);
    int halves = !(counted >= 0 && counted < f->sketch_period - 1);
    if (journal != NULL && halves) return 0;
    unsigned char least = counts[spots[0]];
    for (int i = 1; i < 4; i++)
        if (counts[spots[i]] < least) least = counts[spots[i]];
    if (least < SKETCH_LIMIT)
        for (int i = 0; i < 4; i++) {
            if (counts[spots[i]] != least) continue;
            if (journal != NULL) { /* the counter's word (the sketch is 8-byte aligned) */
                int64_t word = load((char *)counts, (int64_t)(spots[i] / 8));
                ((unsigned char *)&word)[spots[i] % 8] = (unsigned char)(least + 1);
                put_word(journal, (char *)counts, (int64_t)(spots[i] / 8), word);
            } else {
                counts[spots[i]] = (unsigned char)(least + 1);
            }
        }
    if (!halves) {
        put_word(journal, map, f->field[F_SKETCH_COUNTED], counted + 1);
        return 1;
    }
    for (int64_t i = 0; i < f->sketch_bytes; i++) counts[i] >>= 1;
    store(map, f->field[F_SKETCH_COUNTED], 0);
    return 1;
}

/* A queue policy's part of a hit: queue_hit, and a prefix pool's request count
 * (kvcache.sketch). */
static void queue_request(const Finder *f, char *map, int64_t eid) {
    queue_hit(f, map, eid, NULL);
    if (f->sketch_bytes) {
        const char *entry = entry_at(f, map, eid);
        count_request(f, map, load(entry, f->field[F_HASH_LO]), load(entry, f->field[F_HASH_HI]),
                      NULL);
    }
}

/* A hit's own words: count it, tick the logical clock, age and bump the frequency,
 * record the access. 0 (nothing written) where a word is outside what Python would
 * compute the same way: Python then does it, or reports the damage. The frequency and
 * access fields are plain stores: two readers touching one entry at once (without the
 * lock) may lose one bump, which only steers eviction. */
static int touch_entry(const Finder *f, char *map, int64_t eid, double now) {
    const int64_t *w = f->field;
    char *entry = entry_at(f, map, eid);
    int64_t last_access = load(entry, w[F_LAST_ACCESS]), clock = load(map, w[F_CLOCK]);
    if (f->half_life < 1 || f->half_life >= EXACT_DOUBLE) return 0; /* rounds in Python */
    if (last_access <= -CLOCK_LIMIT || last_access >= CLOCK_LIMIT) return 0;
    if (clock < 0 || clock >= CLOCK_LIMIT) return 0;
    clock += 1; /* as the tick below makes it, unless another reader ticks first */
    if (clock - last_access <= -EXACT_DOUBLE || clock - last_access >= EXACT_DOUBLE)
        return 0; /* Python rounds these once */
    /* As Python computes ``freq * 2.0 ** (-idle / half_life) + 1.0``: both ints convert
     * exactly, one rounded division, libm's pow, then a separate multiply and add
     * (the build turns off contraction into a fused multiply-add). */
    double decay = pow(2.0, (double)-(clock - last_access) / (double)f->half_life);
    if (isinf(decay)) return 0; /* Python raises OverflowError here */
    int64_t ticked = tick(f, map, 1);
    if (ticked < 0) return 0;
    if (ticked > clock) /* others ticked meanwhile: the entry aged a little more */
        decay = pow(2.0, (double)-(ticked - last_access) / (double)f->half_life);
    clock = ticked;
    store_double(entry, w[F_FREQ], load_double(entry, w[F_FREQ]) * decay + 1.0);
    store(entry, w[F_LAST_ACCESS], clock);
    store_double(entry, w[F_ACCESSED_AT], now);
    return 1;
}

/* Table.lookup's hit: its own words (touch_entry) and the queue policy's part
 * (queue_request), every word either reads checked before anything is written: 0,
 * nothing written, where one is out of range. */
static int touch(const Finder *f, char *map, int64_t eid, double now) {
    if (!queue_hit_ok(f, map, entry_at(f, map, eid)) || !touch_entry(f, map, eid, now)) return 0;
    queue_request(f, map, eid);
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
            char *entry = entry_at(f, map, eid);
            double expires_at = load_double(entry, w[F_EXPIRES_AT]);
            int expired = expires_at != INFINITY && expires_at <= now;
            if (load(entry, w[F_STATE]) == READY && !expired &&
                holds_key(f, map, eid, key, key_len) && (!count || touch(f, map, eid, now)))
                found = eid;
        }
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(found);
}

/* From this many bytes up a read that sums nothing copies round the cache
 * (copy_streaming): its target is larger than the caches keep, and streamed it is not
 * read from memory before it is written. An unverified 16 MiB get_into took 0.8-0.9x as
 * long streamed; a verified one streamed from the sum's stripe loop took 1.2-1.4x as
 * long as through the cache, so verified reads do not stream (docs/performance.md,
 * "Verified reads"). */
#define STREAMED_READ_BYTES (INT64_C(16) << 20)

/* Copy bytes [start, start + length) of the entry whose page chain begins at ``first``
 * into ``out``; with ``state``, sum bytes [0, start + length) into it in the same pass
 * (sum_copy). 0 unless the whole chain of ``num_pages`` pages lies in the pool (as
 * PageAllocator.runs demands) and holds those bytes. */
static int gather(const Finder *f, const char *map, int64_t first, int64_t num_pages,
                  int64_t start, int64_t length, char *out, XXH3_state_t *state) {
    const char *links = map + f->page_next_offset, *data = map + f->data_offset;
    int64_t page = first, at = 0, end = start + length;
    int streamed = state == NULL && length >= STREAMED_READ_BYTES;
    for (int64_t i = 0; i < num_pages; i++) {
        if (page < 0 || page >= f->num_pages) return 0;
        const char *bytes = data + page * f->page_size;
        int64_t page_end = at + f->page_size < end ? at + f->page_size : end;
        /* the key and codec header, summed but not copied, end on this page or later */
        int64_t skip = start > at ? (start < page_end ? start : page_end) - at : 0;
        if (state != NULL && skip > 0) XXH3_64bits_update(state, bytes, (size_t)skip);
        size_t n = (size_t)(page_end - at - skip);
        char *to = out + (at + skip - start);
        int64_t next = load(links, page);
        if (state != NULL) {
            int following = i + 1 < num_pages && next >= 0 && next < f->num_pages;
            sum_copy(state, bytes + skip, to, n, following ? data + next * f->page_size : NULL,
                     (size_t)(end - page_end));
        } else if (streamed) {
            copy_streaming(to, bytes + skip, n);
        } else {
            copy_bytes(to, bytes + skip, n);
        }
        at = page_end;
        page = next;
    }
    if (streamed) STREAMED_STORES_FENCE();
    return at == end;
}

/* Copy the payload (bytes [start, start + length) of the entry) into ``out``; with
 * ``verify``, sum the entry's bytes in the same pass as kvcache.transfer.checksum does
 * (the record fields flags, key_len, header_len, value_len as four little-endian words,
 * then key | value header | payload). 1: copied (and intact), 0: the sum differs from the
 * one its writer published (damaged), -1: the page chain is out of range. */
static int copy_entry(const Finder *f, const char *map, int64_t eid, int64_t start,
                      int64_t length, int64_t num_pages, char *out, int verify) {
    const char *entry = entry_at(f, map, eid);
    const int64_t *w = f->field, first = load(entry, w[F_FIRST_PAGE]);
    XXH3_state_t state, *summing = verify ? &state : NULL;
    if (verify) {
        int64_t fields[4] = {load(entry, w[F_FLAGS]), load(entry, w[F_KEY_LEN]),
                             load(entry, w[F_HEADER_LEN]), length};
        XXH3_INITSTATE(&state);
        XXH3_64bits_reset(&state);
        XXH3_64bits_update(&state, fields, sizeof fields);
    }
    if (num_pages == 0) { /* an inline slot, which readable found holds the bytes */
        const char *bytes = map + slot_of(f, eid);
        if (verify) {
            XXH3_64bits_update(&state, bytes, (size_t)start);
            sum_copy(&state, bytes + start, out, (size_t)length, NULL, 0);
        } else {
            memcpy(out, bytes + start, (size_t)length);
        }
    } else if (!gather(f, map, first, num_pages, start, length, out, summing)) {
        return -1;
    }
    return !verify || XXH3_64bits_digest(&state) == (uint64_t)load(entry, w[F_CHECKSUM]);
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
    if (load(entry, w[F_STATE]) != READY || header_len < 0 || (header_len && !headers) ||
        key_len <= 0 || key_len > pool_bytes || header_len > pool_bytes || *length < 0 ||
        *length > max_bytes || *length > pool_bytes || *num_pages < 0 ||
        *num_pages > f->num_pages)
        return NULL;
    *start = key_len + header_len; /* each checked first: no overflow */
    if (*num_pages == 0 && (!f->inline_bytes || *start + *length > f->inline_bytes))
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
        int intact = copy_entry(f, view.buf, eid, start, length, num_pages,
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
        int intact = copy_entry(f, view.buf, eid, start, length, num_pages, target.buf, verify);
        if (intact > 0) result = PyLong_FromLongLong(length);
        else if (!intact) result = Py_NewRef(Py_False);
    }
    if (result == NULL && !PyErr_Occurred()) result = Py_NewRef(Py_None);
    PyBuffer_Release(&target);
    PyBuffer_Release(&view);
    return result;
}

/* Without the lock: the entry that holds ``key`` now, READY and unexpired, with the
 * generation read before anything else of it; -1 where there is none to read this way
 * (the locked path decides). */
static int64_t unlocked_hit(const Finder *f, const char *map, const char *key,
                            int64_t key_len, int64_t lo, int64_t hi, double now,
                            int64_t *generation) {
    int64_t eid = probe(f, map, lo, hi);
    if (eid < 0) return -1; /* a miss: counted under the lock, with the regret sample */
    const char *entry = entry_at(f, map, eid);
    *generation = load_acquire(entry, f->field[F_GENERATION]);
    double expires_at = load_double(entry, f->field[F_EXPIRES_AT]);
    if ((expires_at != INFINITY && expires_at <= now) || load(entry, f->field[F_STATE]) != READY ||
        !holds_key(f, map, eid, key, key_len))
        return -1;
    return eid;
}

/* Whether ``eid`` is still what it was when ``generation`` was read: everything read of
 * it in between was read before (the fence), and a writer that reused the entry or its
 * pages meanwhile changed its generation or its state first. */
static int unchanged(const Finder *f, const char *map, int64_t eid, int64_t generation) {
    const char *entry = entry_at(f, map, eid);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return load(entry, f->field[F_GENERATION]) == generation &&
           load(entry, f->field[F_STATE]) == READY;
}

/* The pool's lock for one put or one read's queue hit, taken here as kvcache.lock's
 * ``__enter__`` takes it where nothing is in the way: the word was free, no flock-only
 * process is counted (it would need the flock too), the pool is not retired and no
 * holder died mid-way (``dirty``: repair). The GIL, held while the lock is, keeps this
 * process's other threads out as the lock's thread lock would. 1 taken; 0 not, and
 * nothing changed. */
static _Atomic uint64_t *lock_word_at(const Finder *f, char *map) {
    return (_Atomic uint64_t *)(void *)(map + f->field[F_LOCK_WORD] * 8);
}

static int take_lock_word(const Finder *f, char *map, uint64_t mine) {
    _Atomic uint64_t *word = lock_word_at(f, map);
    _Atomic uint64_t *users = (_Atomic uint64_t *)(void *)(map + f->field[F_FLOCK_USERS] * 8);
    uint64_t seen = 0;
    if (!atomic_compare_exchange_strong_explicit(word, &seen, mine, memory_order_seq_cst,
                                                 memory_order_relaxed))
        return 0;
    if (atomic_load_explicit(users, memory_order_seq_cst) == 0 &&
        load(map, f->field[F_RETIRED]) == 0 && load(map, f->field[F_DIRTY]) == 0)
        return 1;
    lock_word_free(word);
    return 0;
}

/* Queue hits deferred (kvcache.layout's ``deferred`` ring in the header): a reader that
 * finds the lock word held does its hit's own words without the lock, as a plain
 * policy's reader does, and leaves the queue policy's part (queue_request) in the ring
 * for the lock's next holder. A ring word is (the entry's generation's low 32 bits) << 32
 * | (its id + 1); 0 is empty. A reader claims a position (``deferred_next``) and fills
 * its word if it is empty, else drops the hit (a full ring: only the eviction order
 * suffers); the holder drains the positions since ``deferred_done``. */
#define DEFERRED_SLOTS 64 /* kvcache.layout.DEFERRED_SLOTS */

static _Atomic int64_t *deferred_at(const Finder *f, char *map, uint64_t position) {
    return (_Atomic int64_t *)(void *)(map + (f->field[F_DEFERRED] + position % DEFERRED_SLOTS) * 8);
}

/* Leave entry ``eid``'s queue hit (read at ``generation``) for the lock's holder. */
static void defer_hit(const Finder *f, char *map, int64_t eid, int64_t generation) {
    if (eid + 1 > UINT32_MAX) return;
    _Atomic int64_t *next = (_Atomic int64_t *)(void *)(map + f->field[F_DEFERRED_NEXT] * 8);
    uint64_t position = (uint64_t)atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
    int64_t empty = 0, word = (int64_t)(((uint64_t)generation << 32) | (uint64_t)(eid + 1));
    atomic_compare_exchange_strong_explicit(deferred_at(f, map, position), &empty, word,
                                            memory_order_release, memory_order_relaxed);
}

/* The queue hits readers deferred since the last drain, oldest first, each made where
 * its entry is still the READY one the reader read and its words are in range
 * (queue_hit_ok); how many. The caller holds the lock. */
static int64_t drain_deferred(const Finder *f, char *map) {
    const int64_t *w = f->field;
    int64_t next = atomic_load_explicit((_Atomic int64_t *)(void *)(map + w[F_DEFERRED_NEXT] * 8),
                                        memory_order_acquire);
    int64_t done = load(map, w[F_DEFERRED_DONE]), made = 0;
    if (next == done) return 0;
    uint64_t from = (uint64_t)done, to = (uint64_t)next; /* damaged words: at most a lap */
    if (to - from > DEFERRED_SLOTS) from = to - DEFERRED_SLOTS;
    for (uint64_t position = from; position != to; position++) {
        int64_t word = atomic_exchange_explicit(deferred_at(f, map, position), 0,
                                                memory_order_acquire);
        int64_t eid = (int64_t)(word & 0xFFFFFFFF) - 1;
        if (eid < 0 || eid >= f->max_entries) continue;
        const char *entry = entry_at(f, map, eid);
        if (load(entry, w[F_STATE]) != READY ||
            (uint32_t)load(entry, w[F_GENERATION]) != (uint32_t)((uint64_t)word >> 32) ||
            !queue_hit_ok(f, map, entry))
            continue;
        queue_request(f, map, eid);
        made++;
    }
    store(map, w[F_DEFERRED_DONE], next);
    return made;
}

/* The hit of a read copied without the lock: touched as it is where a hit moves no
 * queues. A queue policy's hit (queue_request) needs the pool's lock: taken here through
 * this process's owner word ``mine`` where it is free (the hits deferred before it
 * first), the entry checked unchanged under it and ``dirty`` set while the lists change
 * (a crash mid-way: repair); where another holds it, deferred (defer_hit). 1 touched; 0
 * not, nothing changed: the locked path decides (and copies again). */
static int touch_read(const Finder *f, char *map, int64_t eid, int64_t generation, double now,
                      uint64_t mine) {
    if (f->hit_kind == HIT_TOUCH) return touch(f, map, eid, now);
    if (take_lock_word(f, map, mine)) { /* read_unlocked has ``mine`` for a queue policy */
        int touched = 0;
        store(map, f->field[F_DIRTY], 1);
        drain_deferred(f, map);
        if (unchanged(f, map, eid, generation)) touched = touch(f, map, eid, now);
        store(map, f->field[F_DIRTY], 0);
        lock_word_free(lock_word_at(f, map));
        return touched;
    }
    /* refused with the word free (a flock user counted, repair due): the lock's path */
    if (atomic_load_explicit(lock_word_at(f, map), memory_order_relaxed) == 0) return 0;
    if (!touch_entry(f, map, eid, now)) return 0;
    defer_hit(f, map, eid, generation);
    return 1;
}

PyDoc_STRVAR(drain_doc,
"drain(mapping) -> int\n\n"
"Make the queue hits that readers without the lock deferred while another held it\n"
"(oldest first, each whose entry is still the one read); how many. The caller holds\n"
"the pool's lock; a pool whose policy keeps no queues defers none.");

static PyObject *drain(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "drain takes the mapping");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    int64_t made = 0;
    if (f->hit_kind != HIT_TOUCH && view.len >= f->total_bytes) made = drain_deferred(f, view.buf);
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(made);
}

PyDoc_STRVAR(read_doc,
"read(mapping, key_bytes, now, target, verify, lock_word=0) -> bytes | int | None\n\n"
"A get's hit without the pool's lock: find ``key_bytes`` as ``find_hit`` does, copy its\n"
"plain value into a new ``bytes`` (``target`` None) or its payload to the start of the\n"
"writable buffer ``target`` (answering its length), summed against its checksum with\n"
"``verify``, and touch it as a hit. The copy is kept only if the entry's generation and\n"
"state did not change meanwhile (a seqlock; copies overtaken are tried again, a few\n"
"times). A queue policy's hit changes its lists: it is made under the pool's lock,\n"
"taken here with ``lock_word`` (as ``put`` takes it) once the value is copied, or,\n"
"where another holds it, left to that holder (``drain``). None for anything else: a\n"
"miss, an expired entry, a value too large for ``target``, a failed sum, a pool\n"
"retired or with flock-only users attached, a queue hit without ``lock_word`` or with\n"
"a repair due, or a platform without the store order this relies on: the caller then\n"
"takes the lock and reads as before, which decides.");

static PyObject *read_unlocked(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 5 || nargs > 6 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "read takes mapping, key_bytes, now, target, verify and lock_word");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[2]);
    uint64_t mine = nargs == 6 ? PyLong_AsUnsignedLongLongMask(args[5]) : 0;
    if (PyErr_Occurred()) return NULL;
    int verify = PyObject_IsTrue(args[4]);
    if (verify < 0) return NULL;
    if (!UNLOCKED_READS) Py_RETURN_NONE;
    int into = args[3] != Py_None;
    Py_buffer view, target = {0};
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    if (into && PyObject_GetBuffer(args[3], &target, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *result = NULL;
    char *map = view.buf;
    const int64_t *w = f->field;
    /* flock-only users (pure-Python processes, observers) tick the clock with plain
     * stores under the lock, which an unlocked tick beside them could undo */
    if ((f->hit_kind != HIT_TOUCH && !mine) || view.len < f->total_bytes ||
        load_acquire(map, w[F_RETIRED]) != 0 ||
        load_acquire(map, w[F_FLOCK_USERS]) != 0)
        goto done;
    const char *key = PyBytes_AS_STRING(args[1]);
    int64_t key_len = PyBytes_GET_SIZE(args[1]), lo, hi;
    key_hash(key, (size_t)key_len, &lo, &hi);
    for (int attempt = 0; attempt < UNLOCKED_ATTEMPTS; attempt++) {
        int64_t generation, start, length, num_pages;
        int64_t eid = unlocked_hit(f, map, key, key_len, lo, hi, now, &generation);
        if (eid < 0 || readable(f, map, eid, INT64_MAX, into, &start, &length, &num_pages) == NULL ||
            (into && length > target.len))
            break;
        PyObject *value = NULL;
        char *out = target.buf;
        if (!into) {
            value = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
            if (value == NULL) goto done;
            out = PyBytes_AS_STRING(value);
        }
        /* other threads run while a large value copies: the mapping stays exported */
        PyThreadState *saved = length >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
        int intact = copy_entry(f, map, eid, start, length, num_pages, out, verify);
        int same = unchanged(f, map, eid, generation);
        if (saved != NULL) PyEval_RestoreThread(saved);
        if (!same) {
            Py_XDECREF(value);
            continue; /* overtaken: copy it again */
        }
        /* a failed sum, or a hit not made here: the locked path decides */
        if (intact <= 0 || !touch_read(f, map, eid, generation, now, mine)) {
            Py_XDECREF(value);
            break;
        }
        result = into ? PyLong_FromLongLong(length) : value;
        break;
    }
done:
    if (into) PyBuffer_Release(&target);
    PyBuffer_Release(&view);
    if (result == NULL && !PyErr_Occurred()) result = Py_NewRef(Py_None);
    return result;
}

PyDoc_STRVAR(present_doc,
"present(mapping, key_bytes, now) -> True | None\n\n"
"``key in pool`` without the pool's lock: True where ``key_bytes`` has a READY,\n"
"unexpired entry whose generation and state held while it was checked (a seqlock;\n"
"nothing is touched, so any policy's pool may ask); None for anything else, on a\n"
"retired pool, or a platform without the store order this relies on: the caller\n"
"then asks under the lock.");

static PyObject *present(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "present takes mapping, key_bytes and now");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[2]);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (!UNLOCKED_READS) Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const char *map = view.buf, *key = PyBytes_AS_STRING(args[1]);
    int64_t key_len = PyBytes_GET_SIZE(args[1]), lo, hi, generation, found = 0;
    if (view.len >= f->total_bytes && load_acquire(map, f->field[F_RETIRED]) == 0) {
        key_hash(key, (size_t)key_len, &lo, &hi);
        for (int attempt = 0; attempt < UNLOCKED_ATTEMPTS && !found; attempt++) {
            int64_t eid = unlocked_hit(f, map, key, key_len, lo, hi, now, &generation);
            /* Store.contains's own test of the expiry: an unreadable one (NaN) is not live */
            if (eid < 0 || !(load_double(entry_at(f, map, eid), f->field[F_EXPIRES_AT]) > now))
                break;
            found = unchanged(f, map, eid, generation);
        }
    }
    PyBuffer_Release(&view);
    if (found) Py_RETURN_TRUE;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(tick_doc,
"tick(mapping, hit) -> int\n\n"
"Advance the logical clock by one, atomically (and count a hit with ``hit``); its new\n"
"value, or -1 where the clock or the count is out of range (the caller then ticks it\n"
"the Python way). Holders of the lock tick this way while readers without it run.");

static PyObject *py_tick(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "tick takes mapping and hit");
        return NULL;
    }
    int hit = PyObject_IsTrue(args[1]);
    if (hit < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    int64_t clock = view.len >= f->total_bytes ? tick(f, view.buf, hit) : -1;
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(clock);
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

#include "rank.c"
#include "put.c"

static int finder_init(Finder *f, PyObject *args, PyObject *kwargs) {
    PyObject *fields;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Finder takes positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "LLLLLLLLLLLLLLLLLLLLLO!", &f->entries_offset, &f->max_entries,
                          &f->index_offset, &f->index_slots, &f->page_next_offset,
                          &f->data_offset, &f->num_pages, &f->page_size, &f->total_bytes,
                          &f->half_life, &f->hit_kind, &f->max_reads, &f->live_offset,
                          &f->regret_mask, &f->inline_offset, &f->inline_bytes,
                          &f->sketch_offset, &f->sketch_bytes, &f->sketch_period,
                          &f->ghost_offset, &f->queue_policy, &PyTuple_Type, &fields))
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
             f->page_size < limit && w[F_ENTRY_WORDS] > 0 && w[F_ENTRY_WORDS] < 4096 &&
             f->hit_kind >= HIT_TOUCH && f->hit_kind <= HIT_MOVES_TO_MAIN &&
             f->max_reads >= 0 && f->max_reads < limit;
    for (int i = 0; ok && i < F_ENTRY_WORDS; i++) ok = w[i] >= 0 && w[i] < w[F_ENTRY_WORDS];
    for (int i = F_HITS; ok && i < NUM_FIELDS; i++) ok = w[i] >= 0 && w[i] < 512; /* header */
    ok = ok && w[F_REGRET_RING] + REGRET_RECORDS * REGRET_RECORD_WORDS <= 512 &&
         w[F_REGRET_SECONDS] + SECONDS_BOUNDS < 512 && w[F_REGRET_ACCESSES] + ACCESS_BOUNDS < 512 &&
         w[F_DEFERRED] + DEFERRED_SLOTS <= 512 &&
         f->regret_mask >= 0 && f->regret_mask < limit;
    ok = ok && (f->entries_offset | f->index_offset | f->page_next_offset | f->data_offset) % 8 == 0;
    int64_t data_bytes = 0, entry_bytes = 0;
    ok = ok && !__builtin_mul_overflow(f->num_pages, f->page_size, &data_bytes) &&
         !__builtin_mul_overflow(f->max_entries, w[F_ENTRY_WORDS] * 8, &entry_bytes);
    ok = ok && f->entries_offset >= 4096 && f->index_offset >= 0 && f->data_offset >= 0 &&
         f->entries_offset < limit && f->index_offset < limit && f->data_offset < limit &&
         entry_bytes <= f->total_bytes - f->entries_offset &&
         f->index_offset + f->index_slots * 8 <= f->total_bytes &&
         f->page_next_offset >= 0 && f->page_next_offset < limit &&
         f->page_next_offset + f->num_pages * 8 <= f->total_bytes &&
         f->live_offset >= 0 && f->live_offset < limit && f->live_offset % 8 == 0 &&
         f->live_offset + f->max_entries * 8 <= f->total_bytes &&
         data_bytes <= f->total_bytes - f->data_offset;
    int64_t slot_bytes = 0; /* the inline slots: none, or all of them in the mapping */
    ok = ok && f->inline_bytes >= 0 && f->inline_bytes <= 4096 && f->inline_offset >= 0 &&
         f->inline_offset < limit && (f->inline_bytes == 0) == (f->inline_offset == 0) &&
         !__builtin_mul_overflow(f->max_entries, f->inline_bytes, &slot_bytes) &&
         slot_bytes <= f->total_bytes - f->inline_offset;
    ok = ok && f->sketch_bytes >= 0 && f->sketch_bytes <= SKETCH_MAX_BYTES &&
         (f->sketch_bytes & (f->sketch_bytes - 1)) == 0 &&
         (f->sketch_bytes == 0) == (f->sketch_offset == 0) && f->sketch_offset >= 0 &&
         f->sketch_offset <= f->total_bytes - f->sketch_bytes && f->sketch_period >= 1;
    /* a queue policy's put makes its hit (s3fifo counts a read, the others move the entry)
     * and, in a prefix pool, counts requests */
    int64_t queue_hit_kind = f->queue_policy == QUEUE_S3FIFO ? HIT_COUNTS_READS : HIT_MOVES_TO_MAIN;
    ok = ok && f->queue_policy >= NO_QUEUES && f->queue_policy <= QUEUE_PREFIX &&
         (f->queue_policy == NO_QUEUES || f->hit_kind == queue_hit_kind) &&
         (f->queue_policy != QUEUE_PREFIX || f->sketch_bytes > 0) && f->ghost_offset >= 0 &&
         f->ghost_offset % 8 == 0 && f->ghost_offset < limit &&
         f->ghost_offset + 3 * f->index_slots * 8 <= f->total_bytes;
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
    {"read", (PyCFunction)(void (*)(void))read_unlocked, METH_FASTCALL, read_doc},
    {"tick", (PyCFunction)(void (*)(void))py_tick, METH_FASTCALL, tick_doc},
    {"present", (PyCFunction)(void (*)(void))present, METH_FASTCALL, present_doc},
    {"put", (PyCFunction)(void (*)(void))put, METH_FASTCALL, put_doc},
    {"evict", (PyCFunction)(void (*)(void))evict, METH_FASTCALL, evict_doc},
    {"delete", (PyCFunction)(void (*)(void))delete_entry, METH_FASTCALL, delete_doc},
    {"reserve", (PyCFunction)(void (*)(void))reserve, METH_FASTCALL, reserve_doc},
    {"publish", (PyCFunction)(void (*)(void))publish, METH_FASTCALL, publish_doc},
    {"rank", (PyCFunction)(void (*)(void))rank, METH_FASTCALL, rank_doc},
    {"make_room", (PyCFunction)(void (*)(void))make_room, METH_FASTCALL, make_room_doc},
    {"drain", (PyCFunction)(void (*)(void))drain, METH_FASTCALL, drain_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FinderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvcache._lookup.Finder",
    .tp_basicsize = sizeof(Finder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("Finder(entries_offset, max_entries, index_offset, index_slots, "
                        "page_next_offset, data_offset, num_pages, page_size, total_bytes, "
                        "lfu_half_life, hit_kind, max_reads, live_offset, regret_mask, "
                        "inline_offset, inline_bytes, sketch_offset, sketch_bytes, "
                        "sketch_period, ghost_offset, queue_policy, fields): one segment's "
                        "geometry and "
                        "its policy's hit, for the "
                        "gets' calls and put."),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)finder_init,
    .tp_methods = finder_methods,
};

static PyMethodDef methods[] = {
    {"key_hash", py_key_hash, METH_O, key_hash_doc},
    {"draw", (PyCFunction)(void (*)(void))draw, METH_FASTCALL, draw_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvcache._lookup",
    "A get's hit in C (see kvcache.native and kvcache.engine.table).", -1, methods,
};

PyMODINIT_FUNC PyInit__lookup(void) {
    choose_copy();
    choose_sum_copy();
    if (PyType_Ready(&FinderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&FinderType);
    if (PyModule_AddObject(m, "Finder", (PyObject *)&FinderType) < 0) {
        Py_DECREF(&FinderType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "UNLOCKED_READS", UNLOCKED_READS) < 0 ||
        PyModule_AddIntConstant(m, "DEFERRED_SLOTS", DEFERRED_SLOTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
