/* A queue policy's part of a put in C (s3fifo, arc, prefix): what Table.reserve and
 * Table.publish do to the policy's lists, ghosts, chunk tree and request counts for a put
 * that needs no eviction, written as kvcache.queues, kvcache.tree and the policies write it
 * (the differential tests compare the segments both engines leave, word for word).
 *
 * Part of kvcache._lookup (put.c includes it). These steps depend on each other (a push
 * reads the head a take_place may have changed; a credit walk follows parents a link
 * wrote), so each word is checked as it is followed, and every store goes through the
 * put's Journal: where a word is out of range half-way (0), the caller puts every
 * remembered word back and leaves the put to Python, which decides. Each walk is bounded
 * as Python bounds it (by the table, the ring or the live entries). */

#define SMALL_SHARE 0.1   /* kvcache.policies.s3fifo.SMALL_SHARE */
#define STEP_ENTRIES 200  /* kvcache.policies.prefix.STEP_ENTRIES */
#define MIN_SHARE 0.01    /* kvcache.policies.prefix.MIN_SHARE */
#define SHARED_CHILDREN 3 /* kvcache.policies.prefix.SHARED_CHILDREN */
#define MAX_CREDITS 3     /* kvcache.policies.prefix.MAX_CREDITS */
#define CREDIT_MASK 3     /* kvcache.policies.prefix.CREDIT_MASK */
#define CHILD_SHIFT 2     /* kvcache.policies.prefix.CHILD_SHIFT */
#define EXACT_COUNT (INT64_C(1) << 53) /* counts below divide as Python divides them */

/* The entry a nonzero link names (id + 1), or -1 where it names no entry slot. */
static int64_t linked(const Finder *f, int64_t link) {
    return link > 0 && link <= f->max_entries ? link - 1 : -1;
}

/* A word of the header or an entry within [low, CLOCK_LIMIT): the ranges every count and
 * link here keeps, so that Python's arithmetic on it is C's. */
static int in_range(int64_t value, int64_t low) { return value >= low && value < CLOCK_LIMIT; }

/* --------------------------------------------------------------- the entry lists */

static int64_t head_word(const Finder *f, int64_t kind) {
    return kind == PROBATION ? f->field[F_PROBATION_HEAD] : f->field[F_MAIN_HEAD];
}

static int64_t tail_word(const Finder *f, int64_t kind) {
    return kind == PROBATION ? f->field[F_PROBATION_TAIL] : f->field[F_MAIN_TAIL];
}

/* EntryQueues.push of ``eid`` at the head of list ``kind``. */
static int push(const Finder *f, char *map, Journal *j, int64_t eid, int64_t kind) {
    const int64_t *w = f->field;
    char *entry = entry_at(f, map, eid);
    int64_t head = load(map, head_word(f, kind)), count = load(map, w[F_NUM_PROBATION]);
    if ((head && linked(f, head) < 0) || head < 0 || !in_range(count, 0)) return 0;
    put_word(j, entry, w[F_PROBATION], kind);
    put_word(j, map, w[F_NUM_PROBATION], count + kind);
    put_word(j, entry, w[F_QUEUE_PREV], 0);
    put_word(j, entry, w[F_QUEUE_NEXT], head);
    if (head) put_word(j, entry_at(f, map, head - 1), w[F_QUEUE_PREV], eid + 1);
    else put_word(j, map, tail_word(f, kind), eid + 1);
    put_word(j, map, head_word(f, kind), eid + 1);
    return 1;
}

/* EntryQueues.take_place: ``eid`` where ``old`` is in its list (pushed where ``old`` is in
 * none). */
static int take_place(const Finder *f, char *map, Journal *j, int64_t eid, int64_t old) {
    const int64_t *w = f->field;
    char *entry = entry_at(f, map, eid), *was = entry_at(f, map, old);
    int64_t kind = load(was, w[F_PROBATION]);
    int64_t prev = load(was, w[F_QUEUE_PREV]), after = load(was, w[F_QUEUE_NEXT]);
    if ((kind != MAIN && kind != PROBATION) || (prev && linked(f, prev) < 0) ||
        (after && linked(f, after) < 0) || prev < 0 || after < 0)
        return 0;
    if (!prev && !after && load(map, head_word(f, kind)) != old + 1)
        return push(f, map, j, eid, kind);
    put_word(j, entry, w[F_PROBATION], kind);
    put_word(j, entry, w[F_QUEUE_PREV], prev);
    put_word(j, entry, w[F_QUEUE_NEXT], after);
    if (prev) put_word(j, entry_at(f, map, prev - 1), w[F_QUEUE_NEXT], eid + 1);
    else put_word(j, map, head_word(f, kind), eid + 1);
    if (after) put_word(j, entry_at(f, map, after - 1), w[F_QUEUE_PREV], eid + 1);
    else put_word(j, map, tail_word(f, kind), eid + 1);
    put_word(j, was, w[F_QUEUE_PREV], 0);
    put_word(j, was, w[F_QUEUE_NEXT], 0);
    return 1;
}

/* EntryQueues.unlink of ``eid``, its words checked here (queue_hit_ok's checks). */
static int unlink_checked(const Finder *f, char *map, Journal *j, int64_t eid) {
    const int64_t *w = f->field;
    const char *entry = entry_at(f, map, eid);
    int64_t kind = load(entry, w[F_PROBATION]), prev = load(entry, w[F_QUEUE_PREV]);
    int64_t after = load(entry, w[F_QUEUE_NEXT]);
    if ((kind != MAIN && kind != PROBATION) || prev < 0 || prev > f->max_entries || after < 0 ||
        after > f->max_entries || !in_range(load(map, w[F_NUM_PROBATION]), kind))
        return 0;
    unlink_entry(f, map, eid, j);
    return 1;
}

/* ---------------------------------------------------------------------- ghosts */

/* The ghost region's three arrays of index_slots words (kvcache.queues.GhostQueue). */
static char *ghost_ring(const Finder *f, char *map) { return map + f->ghost_offset; }

static int64_t ghost_count_word(const Finder *f, int64_t kind) {
    return kind == PROBATION ? f->field[F_NUM_GHOSTS_PROBATION] : f->field[F_NUM_GHOSTS_MAIN];
}

/* GhostQueue._forget of the ghost at ``slot`` (of ``kind``). */
static int forget(const Finder *f, char *map, Journal *j, int64_t slot, int64_t kind) {
    int64_t count = load(map, ghost_count_word(f, kind));
    if (!in_range(count, 1)) return 0;
    put_word(j, ghost_ring(f, map), slot, 0);
    put_word(j, map, ghost_count_word(f, kind), count - 1);
    return 1;
}

/* GhostQueue.remove of the key hashed ``lo``: its ghost's kind in ``kind`` (-1: none). */
static int ghost_remove(const Finder *f, char *map, Journal *j, int64_t lo, int64_t *kind) {
    const int64_t length = f->index_slots, next = load(map, f->field[F_GHOST_NEXT]);
    char *ring = ghost_ring(f, map);
    *kind = -1;
    if (!in_range(next, 0)) return 0;
    int64_t oldest = next - length > 0 ? next - length : 0;
    int64_t found = load(ring, 2 * length + ((lo >> 2) & (length - 1)));
    for (int64_t steps = 0; found > oldest; steps++) {
        if (steps >= length) return 0; /* a chain longer than the ring: a loop */
        int64_t slot = (found - 1) % length, word = load(ring, slot);
        if (word && !((word ^ lo) & ~INT64_C(3))) {
            *kind = word & 1;
            return forget(f, map, j, slot, *kind);
        }
        int64_t older = load(ring, length + slot);
        if (older >= found) return 0; /* Python: damage */
        found = older;
    }
    return 1;
}

/* GhostQueue.drop_oldest of ``kind``. */
static int ghost_drop_oldest(const Finder *f, char *map, Journal *j, int64_t kind) {
    const int64_t length = f->index_slots;
    int64_t count = load(map, ghost_count_word(f, kind)), end = load(map, f->field[F_GHOST_NEXT]);
    int64_t at = kind == PROBATION ? f->field[F_GHOST_TAIL_PROBATION] : f->field[F_GHOST_TAIL_MAIN];
    int64_t tail = load(map, at);
    if (count == 0) return 1;
    if (!in_range(count, 1) || !in_range(end, 0) || !in_range(tail, 0)) return 0;
    char *ring = ghost_ring(f, map);
    for (int64_t position = tail > end - length ? tail : end - length; position < end; position++) {
        int64_t slot = position % length, word = load(ring, slot);
        if (word && (word & 1) == kind) {
            put_word(j, map, at, position + 1);
            return forget(f, map, j, slot, kind);
        }
    }
    return 0; /* a count the ring does not hold: Python reports it */
}

/* ------------------------------------------------------------------ the policies */

/* The header's counts a policy's arithmetic reads, checked to divide as Python divides. */
typedef struct {
    int64_t live, probation, b1, b2;
} Counts;

static int counts_of(const Finder *f, const char *map, Counts *c) {
    const int64_t *w = f->field;
    c->live = load(map, w[F_NUM_LIVE]);
    c->probation = load(map, w[F_NUM_PROBATION]);
    c->b1 = load(map, w[F_NUM_GHOSTS_PROBATION]);
    c->b2 = load(map, w[F_NUM_GHOSTS_MAIN]);
    return c->live >= 0 && c->live < EXACT_COUNT && c->probation >= 0 &&
           c->probation < EXACT_COUNT && c->b1 >= 0 && c->b1 < EXACT_COUNT && c->b2 >= 0 &&
           c->b2 < EXACT_COUNT;
}

/* Python's max(a, b) and min(a, b) of floats: the first unless the second is larger
 * (smaller), so a NaN second loses as in Python. */
static double py_max(double a, double b) { return b > a ? b : a; }
static double py_min(double a, double b) { return b < a ? b : a; }

/* ARC.miss: p moved by the ghost the key came back from, else the ghosts trimmed. */
static int arc_miss(const Finder *f, char *map, Journal *j, int64_t recalled) {
    Counts c;
    if (!counts_of(f, map, &c)) return 0;
    double target = load_double(map, f->field[F_PROBATION_TARGET]), moved;
    if (recalled == PROBATION) {
        moved = py_min((double)c.live, target + py_max((double)c.b2 / (double)(c.b1 + 1), 1.0));
    } else if (recalled == MAIN) {
        moved = py_max(0.0, target - py_max((double)c.b1 / (double)(c.b2 + 1), 1.0));
    } else if (c.probation + c.b1 >= c.live) {
        return c.probation < c.live ? ghost_drop_oldest(f, map, j, PROBATION) : 1;
    } else if (c.probation + c.b1 + (c.live - c.probation) + c.b2 >= 2 * c.live) {
        return ghost_drop_oldest(f, map, j, MAIN);
    } else {
        return 1;
    }
    int64_t bits;
    memcpy(&bits, &moved, 8);
    put_word(j, map, f->field[F_PROBATION_TARGET], bits);
    return 1;
}

/* prefix's target(): probation's target, S3-FIFO's share until a ghost first moved it. */
static double prefix_target(double target, int64_t live) {
    return target != 0.0 ? target : SMALL_SHARE * (double)live;
}

/* Prefix.miss: probation's target moved by the ghost the key came back from, once per
 * returning prompt (``parent``: the chunk it is put under, -1 for a root). */
static int prefix_miss(const Finder *f, char *map, Journal *j, int64_t recalled, int64_t parent) {
    int64_t admitted = load(map, f->field[F_LAST_ADMITTED]);
    if (recalled < 0) return 1;
    if (!in_range(admitted, 0)) return 0;
    if (admitted / 4 - 1 == parent && admitted % 4 - 1 == recalled) return 1;
    Counts c;
    if (!counts_of(f, map, &c)) return 0;
    double target = prefix_target(load_double(map, f->field[F_PROBATION_TARGET]), c.live);
    double step = py_max(1.0, (double)c.live / STEP_ENTRIES), moved;
    if (recalled == PROBATION)
        moved = py_min((double)c.live,
                       target + step * py_max((double)c.b2 / (double)(c.b1 + 1), 1.0));
    else
        moved = py_max(MIN_SHARE * (double)c.live,
                       target - step * py_max((double)c.b1 / (double)(c.b2 + 1), 1.0));
    int64_t bits;
    memcpy(&bits, &moved, 8);
    put_word(j, map, f->field[F_PROBATION_TARGET], bits);
    return 1;
}

/* Table._recall of a new key, hashed ``lo``, put under ``parent``: its ghost forgotten and
 * the policy told (S3-FIFO has nothing to adapt); its kind in ``recalled``. */
static int recall(const Finder *f, char *map, Journal *j, int64_t lo, int64_t parent,
                  int64_t *recalled) {
    if (!ghost_remove(f, map, j, lo, recalled)) return 0;
    if (f->queue_policy == QUEUE_ARC) return arc_miss(f, map, j, *recalled);
    if (f->queue_policy == QUEUE_PREFIX) return prefix_miss(f, map, j, *recalled, parent);
    return 1;
}

/* ---------------------------------------------------------------- the chunk tree */

/* ChunkTree.link of fresh ``eid`` as the first child of ``parent`` (-1: a root). */
static int tree_link(const Finder *f, char *map, Journal *j, int64_t eid, int64_t parent) {
    const int64_t *w = f->field;
    char *entry = entry_at(f, map, eid);
    put_word(j, entry, w[F_FIRST_CHILD], 0);
    put_word(j, entry, w[F_PREV_SIBLING], 0);
    put_word(j, entry, w[F_PARENT], parent + 1);
    if (parent < 0) {
        put_word(j, entry, w[F_NEXT_SIBLING], 0);
        put_word(j, entry, w[F_DEPTH], 0);
        return 1;
    }
    char *above = entry_at(f, map, parent);
    int64_t depth = load(above, w[F_DEPTH]), head = load(above, w[F_FIRST_CHILD]);
    if (!in_range(depth, 0) || (head && linked(f, head) < 0)) return 0;
    put_word(j, entry, w[F_DEPTH], depth + 1);
    put_word(j, entry, w[F_NEXT_SIBLING], head);
    if (head) put_word(j, entry_at(f, map, head - 1), w[F_PREV_SIBLING], eid + 1);
    put_word(j, above, w[F_FIRST_CHILD], eid + 1);
    return 1;
}

/* ChunkTree.unlink of ``eid`` from its parent's children. */
static int tree_unlink(const Finder *f, char *map, Journal *j, int64_t eid) {
    const int64_t *w = f->field;
    char *entry = entry_at(f, map, eid);
    int64_t prev = load(entry, w[F_PREV_SIBLING]), after = load(entry, w[F_NEXT_SIBLING]);
    int64_t parent = load(entry, w[F_PARENT]);
    if ((prev && linked(f, prev) < 0) || (after && linked(f, after) < 0) ||
        (!prev && parent && linked(f, parent) < 0))
        return 0;
    if (prev) put_word(j, entry_at(f, map, prev - 1), w[F_NEXT_SIBLING], after);
    else if (parent) put_word(j, entry_at(f, map, parent - 1), w[F_FIRST_CHILD], after);
    if (after) put_word(j, entry_at(f, map, after - 1), w[F_PREV_SIBLING], prev);
    put_word(j, entry, w[F_PARENT], 0);
    put_word(j, entry, w[F_PREV_SIBLING], 0);
    put_word(j, entry, w[F_NEXT_SIBLING], 0);
    return 1;
}

/* ChunkTree.adopt: ``old``'s children become ``eid``'s. */
static int tree_adopt(const Finder *f, char *map, Journal *j, int64_t eid, int64_t old) {
    const int64_t *w = f->field;
    int64_t child = load(entry_at(f, map, old), w[F_FIRST_CHILD]);
    put_word(j, entry_at(f, map, eid), w[F_FIRST_CHILD], child);
    put_word(j, entry_at(f, map, old), w[F_FIRST_CHILD], 0);
    for (int64_t steps = 0; steps <= f->max_entries; steps++) {
        if (!child) return 1;
        if (linked(f, child) < 0) return 0;
        put_word(j, entry_at(f, map, child - 1), w[F_PARENT], eid + 1);
        child = load(entry_at(f, map, child - 1), w[F_NEXT_SIBLING]);
    }
    return 0; /* a list of children that loops */
}

/* ChunkTree.is_below: 1 where ``eid`` is ``ancestor`` or below it, 0 where not, -1 where a
 * link is out of range or the walk does not end. */
static int tree_is_below(const Finder *f, const char *map, int64_t eid, int64_t ancestor) {
    for (int64_t steps = 0; steps <= f->max_entries; steps++) {
        if (eid == ancestor) return 1;
        int64_t parent = load(entry_at(f, map, eid), f->field[F_PARENT]);
        if (!parent) return 0;
        if ((eid = linked(f, parent)) < 0) return -1;
    }
    return -1;
}

/* prefix's share(parent): a chunk was put under ``parent``; counted, and from its third
 * child on, while it holds another, a credit for it and each chunk above it up to the first
 * holding MAX_CREDITS. */
static int share(const Finder *f, char *map, Journal *j, int64_t parent) {
    const int64_t *w = f->field;
    char *entry = entry_at(f, map, parent);
    int64_t word = load(entry, w[F_READS]);
    if (!in_range(word, 0)) return 0;
    int64_t children = (word >> CHILD_SHIFT) + 1;
    children = children < SHARED_CHILDREN ? children : SHARED_CHILDREN;
    put_word(j, entry, w[F_READS], (children << CHILD_SHIFT) | (word & CREDIT_MASK));
    if (children < SHARED_CHILDREN) return 1;
    int64_t first = load(entry, w[F_FIRST_CHILD]);
    if (!first) return 1; /* has_two_children: none */
    if (linked(f, first) < 0) return 0;
    if (!load(entry_at(f, map, first - 1), w[F_NEXT_SIBLING])) return 1;
    int64_t steps = load(map, w[F_NUM_LIVE]) + 1;
    if (!in_range(steps, 1)) return 0;
    while (parent >= 0) {
        entry = entry_at(f, map, parent);
        word = load(entry, w[F_READS]);
        if (!in_range(word, 0)) return 0;
        if ((word & CREDIT_MASK) >= MAX_CREDITS) return 1;
        if (--steps < 0) return 0; /* Python: a walk to the root that does not end */
        put_word(j, entry, w[F_READS], word + 1);
        int64_t link = load(entry, w[F_PARENT]);
        if (link && linked(f, link) < 0) return 0;
        parent = link - 1;
    }
    return 1;
}

/* The entry holding exactly ``key`` (Table.find); -1 where it is certainly not here; -2 for
 * anything else (a collision, a word out of range): Python decides. */
static int64_t find_key(const Finder *f, const char *map, const char *key, int64_t key_len) {
    int64_t lo, hi;
    key_hash(key, (size_t)key_len, &lo, &hi);
    int64_t eid = probe(f, map, lo, hi);
    if (eid == ABSENT) return -1;
    if (eid < 0 || !holds_key(f, map, eid, key, key_len)) return -2;
    return eid;
}

/* ------------------------------------------------------------------------ the put */

#define RECALL_AT_ADMIT (-2) /* kvcache.engine.table.RECALL_AT_ADMIT */

/* The chunk keyed ``parent`` (NULL: none, -1 here) for a put into a prefix pool: 0 where
 * it is not here (Python declines the put), a word is out of range, or the pool keeps no
 * tree (Python looks the parent up all the same: ``Pool.put`` passes none there). */
static int parent_of(const Finder *f, const char *map, PyObject *parent, int64_t *above) {
    *above = -1;
    if (parent == NULL) return 1;
    if (f->queue_policy != QUEUE_PREFIX) return 0;
    *above = find_key(f, map, PyBytes_AS_STRING(parent), PyBytes_GET_SIZE(parent));
    return *above >= 0;
}

/* Table.reserve's part for the queues, for the put of ``p`` (the key's entry now
 * ``p->old``) under chunk ``above``: a new key's ghost recalled, where the policy asks it
 * before evicting (ARC, prefix); in ``reads``, what reserve leaves in the new entry's
 * ``reads`` word for publish: the ghost's kind, -1 (none, or the key is held), or
 * RECALL_AT_ADMIT (S3-FIFO asks at admission). */
static int queue_reserve(const Finder *f, char *map, Journal *j, const Plan *p, int64_t above,
                         int64_t *reads) {
    *reads = -1;
    if (p->old >= 0) return 1;
    if (f->queue_policy == QUEUE_S3FIFO) {
        *reads = RECALL_AT_ADMIT;
        return 1;
    }
    return recall(f, map, j, p->lo, above, reads);
}

/* Table.publish's part for the queues, for entry ``p->eid`` (its ``reads`` word what
 * queue_reserve left, ``recalled``) whose key's entry now is ``p->old``, under chunk
 * ``above``: in a prefix pool its place in the tree (an old entry's children adopted),
 * then its admission (a key stored again takes its old entry's place in its list and
 * counts as a hit of it, as Table._admit does). 0 where a word is out of range, or the
 * parent lies below the old entry (Python declines that put). */
static int queue_publish(const Finder *f, char *map, Journal *j, const Plan *p, int64_t above,
                         int64_t recalled) {
    int64_t eid = p->eid, old = p->old;
    if (f->queue_policy == QUEUE_PREFIX) { /* Table._place */
        if (old >= 0 && above >= 0 && tree_is_below(f, map, above, old) != 0) return 0;
        if (!tree_link(f, map, j, eid, above)) return 0;
        if (old >= 0 && !(tree_adopt(f, map, j, eid, old) && tree_unlink(f, map, j, old)))
            return 0;
    }
    char *entry = entry_at(f, map, eid);
    const int64_t reads_word = f->field[F_READS];
    if (old >= 0) { /* Table._admit of a key stored again */
        int64_t reads = load(entry_at(f, map, old), reads_word);
        if (!in_range(reads, 0)) return 0;
        put_word(j, entry, reads_word, reads);
        if (!take_place(f, map, j, eid, old) || !queue_hit_ok(f, map, entry)) return 0;
        queue_hit(f, map, eid, j);
        if (f->queue_policy == QUEUE_PREFIX && !count_request(f, map, p->lo, p->hi, j)) return 0;
        /* Table.remove's unlink of the old entry: out of its list already, unless damaged
         * links put it back in one */
        return unlink_checked(f, map, j, old);
    }
    if (recalled == RECALL_AT_ADMIT && !recall(f, map, j, p->lo, -1, &recalled)) return 0;
    if (recalled < -1 || recalled > 1) return 0; /* a damaged reads word: Python's */
    put_word(j, entry, reads_word, 0); /* the policy's admit */
    if (!push(f, map, j, eid, recalled >= 0 ? MAIN : PROBATION)) return 0;
    if (f->queue_policy != QUEUE_PREFIX) return 1;
    put_word(j, map, f->field[F_LAST_ADMITTED], (eid + 1) * 4 + recalled + 1);
    if (!count_request(f, map, p->lo, p->hi, j)) return 0;
    return above < 0 || share(f, map, j, above);
}

/* ------------------------------------------------------------------ the eviction */

/* EntryQueues.tail of list ``kind``: its entry, -1 where the list is empty, -2 where the
 * tail is not a READY entry of that list (Python: damage). */
static int64_t tail_of(const Finder *f, const char *map, int64_t kind) {
    int64_t link = load(map, tail_word(f, kind));
    if (!link) return -1;
    int64_t eid = linked(f, link);
    if (eid < 0) return -2;
    const char *entry = entry_at(f, map, eid);
    return load(entry, f->field[F_STATE]) == READY && load(entry, f->field[F_PROBATION]) == kind
               ? eid
               : -2;
}

/* EntryQueues.move of ``eid`` to the head of list ``kind``. */
static int move_to(const Finder *f, char *map, Journal *j, int64_t eid, int64_t kind) {
    return unlink_checked(f, map, j, eid) && push(f, map, j, eid, kind);
}

/* GhostQueue.add of the key hashed ``lo`` as the newest ghost of ``kind``; 0 where the ring
 * came round to a ghost still there (its compaction is numpy's: Python's put). */
static int ghost_add(const Finder *f, char *map, Journal *j, int64_t lo, int64_t kind) {
    const int64_t length = f->index_slots, position = load(map, f->field[F_GHOST_NEXT]);
    int64_t count = load(map, ghost_count_word(f, kind));
    if (!in_range(position, 0) || position >= CLOCK_LIMIT - 1 || !in_range(count, 0)) return 0;
    char *ring = ghost_ring(f, map);
    int64_t slot = position % length, bucket = 2 * length + ((lo >> 2) & (length - 1));
    if (load(ring, slot)) return 0;
    put_word(j, ring, slot, (lo & ~INT64_C(3)) | 2 | kind);
    put_word(j, ring, length + slot, load(ring, bucket));
    put_word(j, ring, bucket, position + 1);
    put_word(j, map, f->field[F_GHOST_NEXT], position + 1);
    put_word(j, map, ghost_count_word(f, kind), count + 1);
    return 1;
}

/* An entry's reads word, -1 where out of range. */
static int64_t reads_of(const Finder *f, const char *map, int64_t eid) {
    int64_t reads = load(entry_at(f, map, eid), f->field[F_READS]);
    return in_range(reads, 0) ? reads : -1;
}

/* S3FIFO.victim: -1 where a word is out of range or the moves run out (Python: damage). */
static int64_t s3fifo_victim(const Finder *f, char *map, Journal *j) {
    Counts c;
    if (!counts_of(f, map, &c)) return -1;
    int64_t small = (int64_t)((double)c.live * SMALL_SHARE), main_count = c.live - c.probation;
    small = small > 1 ? small : 1;
    int64_t moves = (f->max_reads + 1) * (c.live + 1), oldest;
    if (c.probation >= small || !main_count) {
        while ((oldest = tail_of(f, map, PROBATION)) >= 0 && --moves > 0) {
            int64_t reads = reads_of(f, map, oldest);
            if (reads < 0) return -1;
            if (!reads) {
                int64_t lo = load(entry_at(f, map, oldest), f->field[F_HASH_LO]);
                if (!ghost_add(f, map, j, lo, PROBATION)) return -1;
                for (int64_t steps = 0;; steps++) {
                    int64_t count = load(map, f->field[F_NUM_GHOSTS_PROBATION]);
                    if (count <= c.live - small) return oldest;
                    if (steps > c.live || !ghost_drop_oldest(f, map, j, PROBATION)) return -1;
                }
            }
            put_word(j, entry_at(f, map, oldest), f->field[F_READS], 0);
            if (!move_to(f, map, j, oldest, MAIN)) return -1;
        }
        if (oldest == -2) return -1;
    }
    while ((oldest = tail_of(f, map, MAIN)) >= 0 && --moves > 0) {
        int64_t reads = reads_of(f, map, oldest);
        if (reads < 0) return -1;
        if (!reads) return oldest;
        put_word(j, entry_at(f, map, oldest), f->field[F_READS], reads - 1);
        if (!move_to(f, map, j, oldest, MAIN)) return -1;
    }
    return -1;
}

/* ARC.victim (REPLACE, or case IV's T1 eviction), with the new key's ghost ``recalled``. */
static int64_t arc_victim(const Finder *f, char *map, Journal *j, int64_t recalled) {
    Counts c;
    if (!counts_of(f, map, &c)) return -1;
    if (recalled < 0 && c.probation >= c.live) return tail_of(f, map, PROBATION);
    double p = load_double(map, f->field[F_PROBATION_TARGET]), t1 = (double)c.probation;
    int64_t kind = MAIN;
    if (c.probation && (t1 > p || (recalled == MAIN && t1 == p) || c.live == c.probation))
        kind = PROBATION;
    int64_t victim = tail_of(f, map, kind);
    if (victim < 0) return -1;
    int64_t lo = load(entry_at(f, map, victim), f->field[F_HASH_LO]);
    return ghost_add(f, map, j, lo, kind) ? victim : -1;
}

/* RequestCounts.asked of entry ``eid``'s key: the smallest of its four counters. */
static int64_t asked(const Finder *f, const char *map, int64_t eid) {
    const unsigned char *counts = (const unsigned char *)map + f->sketch_offset;
    const char *entry = entry_at(f, map, eid);
    uint64_t mask = (uint64_t)f->sketch_bytes - 1;
    uint64_t lo = (uint64_t)load(entry, f->field[F_HASH_LO]);
    uint64_t hi = (uint64_t)load(entry, f->field[F_HASH_HI]);
    uint64_t spots[4] = {lo & mask, (lo >> 32) & mask, hi & mask, (hi >> 32) & mask};
    unsigned char least = counts[spots[0]];
    for (int i = 1; i < 4; i++)
        if (counts[spots[i]] < least) least = counts[spots[i]];
    return least;
}

/* prefix's admit_asked: while probation holds ``holds`` entries, its oldest goes to main
 * where it was asked for more than main's least recently used. */
static int admit_asked(const Finder *f, char *map, Journal *j, double holds) {
    Counts c;
    if (!counts_of(f, map, &c)) return 0;
    int64_t least = c.live - c.probation ? tail_of(f, map, MAIN) : -1;
    if (least == -2) return 0;
    if (least < 0) return 1;
    int64_t others = asked(f, map, least), depth = load(entry_at(f, map, least), f->field[F_DEPTH]);
    for (int64_t steps = 0; steps <= f->max_entries; steps++) {
        if (!((double)load(map, f->field[F_NUM_PROBATION]) >= holds)) return 1;
        int64_t oldest = tail_of(f, map, PROBATION);
        if (oldest == -2) return 0;
        if (oldest < 0) return 1;
        int64_t count = asked(f, map, oldest);
        int64_t deeper = load(entry_at(f, map, oldest), f->field[F_DEPTH]);
        if (!(count > others || (count == others && others >= 2 && deeper < depth))) return 1;
        if (!move_to(f, map, j, oldest, MAIN)) return 0;
    }
    return 0;
}

/* prefix's least_recent: main's least recently used without credits (those with credits in
 * the way go back to main's head, one credit less); -1 for an empty main, -2 for damage. */
static int64_t least_recent(const Finder *f, char *map, Journal *j) {
    int64_t live = load(map, f->field[F_NUM_LIVE]), least;
    if (!in_range(live, 0)) return -2;
    int64_t moves = (MAX_CREDITS + 1) * (live + 1);
    while ((least = tail_of(f, map, MAIN)) >= 0 && --moves > 0) {
        int64_t word = reads_of(f, map, least);
        if (word < 0) return -2;
        if (!(word & CREDIT_MASK)) return least;
        put_word(j, entry_at(f, map, least), f->field[F_READS], word - 1);
        if (!move_to(f, map, j, least, MAIN)) return -2;
    }
    return least == -1 ? -1 : -2;
}

/* ChunkTree.descendants of ``eid`` into ``below`` (leaves first, as Python orders them),
 * with ``stack`` as room: how many, -1 where a link is out of range or there are more than
 * the table holds. Both arrays hold max_entries + 1 ids. */
static int64_t descendants(const Finder *f, const char *map, int64_t eid, int64_t *below,
                           int64_t *stack) {
    int64_t found = 0, depth = 0;
    stack[depth++] = eid;
    while (depth) {
        int64_t child = load(entry_at(f, map, stack[--depth]), f->field[F_FIRST_CHILD]);
        while (child) {
            int64_t id = linked(f, child);
            if (id < 0 || found >= f->max_entries) return -1;
            below[found++] = id;
            stack[depth++] = id;
            child = load(entry_at(f, map, id), f->field[F_NEXT_SIBLING]);
        }
    }
    for (int64_t i = 0; i < found / 2; i++) { /* Python returns them reversed */
        int64_t t = below[i];
        below[i] = below[found - 1 - i];
        below[found - 1 - i] = t;
    }
    return found;
}

/* prefix's trim: the ghosts at most the live entries, probation's first while they exceed
 * what the target leaves them. */
static int trim(const Finder *f, char *map, Journal *j) {
    for (int64_t steps = 0;; steps++) {
        Counts c;
        if (!counts_of(f, map, &c)) return 0;
        if (c.b1 + c.b2 <= c.live) return 1;
        if (steps > c.b1 + c.b2) return 0;
        double target = prefix_target(load_double(map, f->field[F_PROBATION_TARGET]), c.live);
        int probation_first = (double)c.b1 > (double)c.live - target || !c.b2;
        if (!ghost_drop_oldest(f, map, j, c.b1 && probation_first ? PROBATION : MAIN)) return 0;
    }
}

/* Scratch for a victim's chain (descendants, then the victim): max_entries + 1 ids each. */
typedef struct {
    int64_t *chain, *stack, length;
} Chain;

/* Prefix.victim: the entry to evict and, in ``chain``, the chunks below it then itself, each
 * made a ghost of its list (then trimmed); -1 where a word is out of range (damage). */
static int64_t prefix_victim(const Finder *f, char *map, Journal *j, Chain *chain) {
    Counts c;
    if (!counts_of(f, map, &c)) return -1;
    double target = prefix_target(load_double(map, f->field[F_PROBATION_TARGET]), c.live);
    double holds = py_max(1.0, target);
    if (!admit_asked(f, map, j, holds) || !counts_of(f, map, &c)) return -1;
    int64_t kind = MAIN, victim;
    if ((c.probation && (double)c.probation >= holds) || c.live == c.probation) kind = PROBATION;
    victim = kind == PROBATION ? tail_of(f, map, PROBATION) : least_recent(f, map, j);
    if (victim >= 0 && kind == MAIN && c.probation) {
        int64_t oldest = tail_of(f, map, PROBATION);
        if (oldest == -2) return -1;
        if (oldest >= 0 && load(entry_at(f, map, oldest), f->field[F_LAST_ACCESS]) <=
                               load(entry_at(f, map, victim), f->field[F_LAST_ACCESS])) {
            kind = PROBATION;
            victim = oldest;
        }
    }
    if (victim < 0) return -1;
    int64_t below = descendants(f, map, victim, chain->chain, chain->stack);
    if (below < 0) return -1;
    chain->chain[below] = victim;
    chain->length = below + 1;
    for (int64_t i = 0; i < chain->length; i++) {
        int64_t lo = load(entry_at(f, map, chain->chain[i]), f->field[F_HASH_LO]);
        if (!ghost_add(f, map, j, lo, kind)) return -1;
    }
    return trim(f, map, j) ? victim : -1;
}

/* Evictor.evict_one of ``chain`` (a victim last, the chunks below it first): each key
 * remembered in the regret sample, then each entry taken out of the tree and its list and
 * removed (Table.remove), and the evictions counted. */
static int evict_chain(const Finder *f, char *map, Journal *j, const Chain *chain, double now) {
    const int64_t *w = f->field;
    if (!evict_counts_ok(f, map)) return 0;
    for (int64_t i = 0; i < chain->length; i++) {
        const char *entry = entry_at(f, map, chain->chain[i]);
        if (!(load(entry, w[F_HASH_HI]) & f->regret_mask))
            regret_remember(f, map, load(entry, w[F_HASH_LO]), now, j);
    }
    for (int64_t i = 0; i < chain->length; i++) {
        int64_t eid = chain->chain[i], lo = load(entry_at(f, map, eid), w[F_HASH_LO]);
        if (f->queue_policy == QUEUE_PREFIX && !tree_unlink(f, map, j, eid)) return 0;
        if (!unlink_checked(f, map, j, eid) || !old_ok(f, map, eid, lo)) return 0;
        remove_old(f, map, eid, lo, j);
    }
    int64_t evictions = load(map, w[F_EVICTIONS]);
    put_word(j, map, w[F_EVICTIONS], evictions + chain->length);
    return evictions + chain->length < CLOCK_LIMIT;
}

#define SWEEP_SPACING 64 /* kvcache.engine.eviction.SWEEP_SPACING */

/* Evictor.tidy(force=False) where it has nothing to reclaim: where due, its next time set;
 * 0 where it would do more (an entry may have expired, or one is WRITING, whose writer
 * may have died: the process table is Python's) or a word is out of range. */
static int tidy(const Finder *f, char *map, Journal *j, double now) {
    const int64_t *w = f->field;
    int64_t puts = load(map, w[F_PUTS]), live = load(map, w[F_NUM_LIVE]);
    int64_t fresh = load(map, w[F_NEXT_FRESH_ENTRY]);
    if (puts < load(map, w[F_NEXT_SWEEP_PUTS])) return 1;
    if (!in_range(puts, 0) || !in_range(live, 0) || fresh < 0 || fresh > f->max_entries ||
        !(load_double(map, w[F_NEXT_EXPIRY_AT]) > now))
        return 0;
    for (int64_t eid = 0; eid < fresh; eid++)
        if (load(entry_at(f, map, eid), w[F_STATE]) == WRITING) return 0;
    put_word(j, map, w[F_NEXT_SWEEP_PUTS], puts + live / SWEEP_SPACING);
    return 1;
}

/* Evictor.make_room for a queue policy (the new key's ghost ``recalled``): a due tidy
 * (where it has nothing to do), then victims, each evicted with its chain, until
 * ``num_pages`` pages and an entry slot are free. 0 where nothing is live, the tidy
 * would reclaim something, or a word is out of range. */
static int make_queue_room(const Finder *f, char *map, Journal *j, int64_t num_pages,
                           int64_t recalled, double now) {
    if (!tidy(f, map, j, now)) return 0;
    const int64_t *w = f->field;
    Chain chain = {PyMem_Malloc((size_t)(f->max_entries + 1) * 8),
                   PyMem_Malloc((size_t)(f->max_entries + 1) * 8), 0};
    int made = chain.chain != NULL && chain.stack != NULL;
    for (int64_t rounds = 0; made; rounds++) {
        int room = has_room(f, map, num_pages);
        if (room) {
            made = room > 0;
            break;
        }
        int64_t live = load(map, w[F_NUM_LIVE]), victim = -1;
        if (live <= 0 || rounds > f->max_entries || j->full) {
            made = 0;
            break;
        }
        chain.length = 1;
        if (f->queue_policy == QUEUE_S3FIFO) victim = s3fifo_victim(f, map, j);
        else if (f->queue_policy == QUEUE_ARC) victim = arc_victim(f, map, j, recalled);
        else victim = prefix_victim(f, map, j, &chain);
        if (f->queue_policy != QUEUE_PREFIX) chain.chain[0] = victim;
        made = victim >= 0 && evict_chain(f, map, j, &chain, now);
    }
    PyMem_Free(chain.chain);
    PyMem_Free(chain.stack);
    return made && !j->full;
}
