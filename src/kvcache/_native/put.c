/* A small put in C: kvcache.engine.table.Table.reserve, the copy of the entry's bytes
 * (summed in the same pass) and Table.publish, in one call under the pool's lock; the
 * eviction of one victim (Evictor.evict_one) that makes room for a put, and the first
 * round of that room for a sampled policy ranked in C (Evictor.room_for_put's).
 *
 * Part of kvcache._lookup (lookup.c includes it: one translation unit, so xxhash's
 * dispatch is compiled in once). Where the pool's policy keeps no queues it serves
 * only puts that Python would serve without evicting, reserving memory or judging
 * damage: the pages and an entry slot are free now, the fresh pages it takes are
 * backed already, and every word it will follow or change is in range. It checks all
 * of that first (``plan_reserve``, ``publish_ok``), changing nothing, and answers None
 * where anything is off: Python's put then runs, and evicts, grows the pool or raises
 * CorruptPoolError as before. Otherwise (``apply_reserve``, ``apply_publish``) it writes
 * what Python writes, store for store in the same order (a differential test compares
 * the two engines' segments byte for byte). A larger put calls the two halves apart
 * (``reserve``, ``publish``), around a copy made without the lock. A queue policy's
 * part of a put, and its eviction, follow words that depend on each other: admit.c
 * checks them as it follows them, under an undo journal.
 *
 * Readers without the lock may look at the index and the entries meanwhile: the
 * words that publish an entry or retire one (its state, its generation, its index
 * slot) are release stores, so the entry's bytes and fields are written before it can
 * be found, as Python's stores are ordered on x86-64.
 */

#define FREE 0    /* kvcache.layout's entry states */
#define WRITING 1
#define NO_PAGE (-1)
#define REGRET_RECORDS 64      /* kvcache.regret.NUM_RECORDS */
#define REGRET_RECORD_WORDS 3  /* key hash | 1, evicted at (seconds), evicted at (clock) */
#define SECONDS_BOUNDS 24      /* 2**-4 .. 2**19 seconds, then +Inf */
#define ACCESS_BOUNDS 31       /* 1 .. 2**30 accesses, then +Inf */

static void store_release(char *base, int64_t word, int64_t value) {
    __atomic_store_n((int64_t *)(void *)(base + word * 8), value, __ATOMIC_RELEASE);
}

/* store_release, remembered in ``journal`` where there is one. */
static void put_release(Journal *journal, char *base, int64_t word, int64_t value) {
    if (journal_word(journal, base, word)) store_release(base, word, value);
}

/* store_double, remembered in ``journal`` where there is one. */
static void put_double(Journal *journal, char *base, int64_t word, double value) {
    int64_t bits;
    memcpy(&bits, &value, 8);
    put_word(journal, base, word, bits);
}

/* The segment ``mapping`` for one of the writes below: 1 with ``view`` held where the
 * buffer spans the geometry and the pool's policy keeps no queues (or ``queues_too``: a put
 * makes a queue policy's part, admit.c); 0, nothing held, where not (the caller answers
 * None); -1 with an exception set. */
static int write_view(const Finder *f, PyObject *mapping, Py_buffer *view, int queues_too) {
    if (PyObject_GetBuffer(mapping, view, PyBUF_WRITABLE) < 0) return -1;
    if ((queues_too || f->hit_kind == HIT_TOUCH) && view->len >= f->total_bytes) return 1;
    PyBuffer_Release(view);
    return 0;
}

/* What a put will do, worked out before anything is written. */
typedef struct {
    int64_t lo, hi, num_pages, old, eid, from_free, from_fresh, free_last, regret;
    int requested; /* the put's request made already (Table.room_for_put) */
} Plan;

/* RegretSample.request's record for a new key (its ring word), -1 where the key is not
 * sampled or not in the ring; 0 for words the request would add to out of range. */
static int regret_record(const Finder *f, const char *map, const Plan *p, int64_t *record) {
    const int64_t *w = f->field;
    *record = -1;
    if (p->hi & f->regret_mask) return 1;
    for (int64_t i = 0; i < REGRET_RECORDS; i++) {
        int64_t base = w[F_REGRET_RING] + i * REGRET_RECORD_WORDS;
        if (load(map, base) == (p->lo | 1)) {
            *record = base;
            break;
        }
    }
    if (*record < 0) return 1;
    int64_t clock = load(map, w[F_CLOCK]), evicted = load(map, *record + 2);
    int64_t sum = load(map, w[F_REGRET_ACCESSES_SUM]);
    if (clock < 0 || clock >= CLOCK_LIMIT || evicted < 0 || evicted >= CLOCK_LIMIT || sum < 0 ||
        sum >= CLOCK_LIMIT)
        return 0;
    for (int64_t i = 0; i <= SECONDS_BOUNDS; i++) {
        int64_t count = load(map, w[F_REGRET_SECONDS] + i);
        if (count < 0 || count >= CLOCK_LIMIT) return 0;
    }
    for (int64_t i = 0; i <= ACCESS_BOUNDS; i++) {
        int64_t count = load(map, w[F_REGRET_ACCESSES] + i);
        if (count < 0 || count >= CLOCK_LIMIT) return 0;
    }
    return 1;
}

/* Whether Python's HashIndex.remove of ``eid`` from home slot ``lo & mask`` finds it and
 * an empty slot after it, reading only ids in range (else it could raise or wander). */
static int removable(const Finder *f, const char *map, int64_t eid, int64_t lo) {
    const char *index = map + f->index_offset;
    int64_t mask = f->index_slots - 1, hole = lo & mask, probes = 0;
    for (; load(index, hole) != eid + 1; hole = (hole + 1) & mask)
        if (!load(index, hole) || ++probes >= f->index_slots) return 0;
    for (int64_t probe = (hole + 1) & mask; probe != hole; probe = (probe + 1) & mask) {
        int64_t value = load(index, probe);
        if (!value) return 1;
        if (value < 1 || value > f->max_entries) return 0;
    }
    return 0;
}

/* Whether Table.remove of entry ``old`` (not in a queue or tree) reads only words in
 * range: its index slot, its place in the live list, its page chain's ends and the page
 * counts it changes (the count of slots held, if it lies in its inline slot); and
 * whether it is READY, as an indexed entry is. */
static int old_ok(const Finder *f, const char *map, int64_t old, int64_t lo) {
    const int64_t *w = f->field, n = f->max_entries;
    const char *entry = entry_at(f, map, old), *live = map + f->live_offset;
    int64_t pos = load(entry, w[F_LIVE_POS]), num_live = load(map, w[F_NUM_LIVE]);
    if (!(0 <= pos && pos < num_live && num_live <= n) || load(live, pos) != old ||
        load(entry, w[F_GENERATION]) == INT64_MAX) /* release's bump would overflow */
        return 0;
    int64_t last = num_live - 1;
    int64_t moved = load(live, last), first = load(entry, w[F_FIRST_PAGE]);
    int64_t end = load(entry, w[F_LAST_PAGE]), pages = load(entry, w[F_NUM_PAGES]);
    int64_t num_free = load(map, w[F_NUM_FREE_PAGES]), used = load(map, w[F_USED_PAGES]);
    int64_t slots = load(map, w[F_USED_SLOTS]);
    int pages_ok = in_slot(f, entry) ? slots > 0 && slots <= n :
        (first >= 0 && first < f->num_pages && end >= 0 && end < f->num_pages && pages > 0 &&
         pages <= f->num_pages && num_free >= 0 && num_free <= f->num_pages && used >= 0 &&
         used <= f->num_pages);
    return load(entry, w[F_STATE]) == READY && moved >= 0 && moved < n && pages_ok &&
           removable(f, map, old, lo);
}

/* Whether the chain of the planned pages, as PageAllocator.allocate will link it, holds
 * ``num_pages`` pages in the pool (PageAllocator.runs, which Python's put walks next, raises
 * otherwise: a damaged free list may loop back on the page whose link allocate ends), none
 * of them from ``low`` to ``high`` (pages another entry holds: see queued_in_put). */
static int chain_ok(const Finder *f, const char *map, const Plan *p, int64_t low, int64_t high) {
    const char *links = map + f->page_next_offset;
    int64_t start = load(map, f->field[F_NEXT_FRESH_PAGE]), end = start + p->from_fresh;
    int64_t page = p->from_free ? load(map, f->field[F_FREE_PAGE_HEAD]) : start;
    for (int64_t i = 0; i < p->num_pages; i++) {
        if (page < 0 || page >= f->num_pages || (page >= low && page <= high)) return 0;
        if (p->from_fresh && page == end - 1) page = NO_PAGE;
        else if (p->from_free && page == p->free_last) page = p->from_fresh ? start : NO_PAGE;
        else if (p->from_fresh && page >= start && page < end - 1) page += 1;
        else page = load(links, page);
    }
    return 1;
}

/* Whether Table.publish can be done here, for entry ``p->eid`` whose key's entry now is
 * ``p->old`` (-1: none): the old entry's words (old_ok), the live list's count, the clock
 * (which a tick below may not pass) and the count of puts in range, and the entry's
 * generation short of overflowing at its ``bumps`` more (1 here, 2 with a claim). */
static int publish_ok(const Finder *f, const char *map, const Plan *p, int bumps) {
    const int64_t *w = f->field, n = f->max_entries;
    if (p->old >= 0 && !old_ok(f, map, p->old, p->lo)) return 0;
    int64_t num_live = load(map, w[F_NUM_LIVE]), clock = load(map, w[F_CLOCK]);
    int64_t puts = load(map, w[F_PUTS]), removed = p->old >= 0;
    return num_live >= removed && num_live - removed < n && clock >= 0 &&
           clock < CLOCK_LIMIT - n && puts >= 0 && puts < CLOCK_LIMIT &&
           load(entry_at(f, map, p->eid), w[F_GENERATION]) <= INT64_MAX - bumps;
}

enum { LEAVE_TO_PYTHON = 0, PLANNED = 1, NO_ROOM = 2 };

/* Whether the key's probe meets no index slot naming the entry it will claim before it
 * reaches its old entry (or an empty slot). Table.publish looks the key up again after
 * reserve wrote its hash into that entry: a damaged slot naming it on the way would be
 * found first, and Python's put then fails on it (the entry is not live), as it must. */
static int claimed_off_the_probe(const Finder *f, const char *map, const Plan *p) {
    const char *index = map + f->index_offset;
    int64_t mask = f->index_slots - 1, slot = p->lo & mask;
    for (int64_t probes = 0; probes < f->index_slots; probes++, slot = (slot + 1) & mask) {
        int64_t value = load(index, slot);
        if (value == p->eid + 1) return 0;
        if (value == 0 || value == p->old + 1) return 1;
    }
    return 0;
}

/* make_room's test, nothing to evict (PageAllocator.num_available,
 * EntryTable.has_free_slot): 1 where ``num_pages`` pages and an entry slot are free, 0
 * where not, -1 where an allocator word is out of range. */
static int has_room(const Finder *f, const char *map, int64_t num_pages) {
    const int64_t *w = f->field, n = f->max_entries, pages = f->num_pages;
    int64_t num_free = load(map, w[F_NUM_FREE_PAGES]), fresh = load(map, w[F_NEXT_FRESH_PAGE]);
    int64_t used = load(map, w[F_USED_PAGES]), head = load(map, w[F_FREE_ENTRY_HEAD]);
    int64_t next_entry = load(map, w[F_NEXT_FRESH_ENTRY]), slots = load(map, w[F_USED_SLOTS]);
    if (num_free < 0 || num_free > pages || fresh < 0 || fresh > pages || used < 0 ||
        used > pages || head < 0 || head > n || next_entry < 0 || next_entry > n ||
        slots < 0 || slots > n)
        return -1;
    return num_free + pages - fresh >= num_pages && (head || next_entry < n);
}

/* Everything Python's reserve would check or could fail on, checked: PLANNED, with what
 * reserve will do set, and ``p->old`` the key's entry now (-1: none); NO_ROOM where all
 * is in range but pages or an entry slot must be freed first (Python's make_room);
 * LEAVE_TO_PYTHON where Python must do it (memory to reserve, any word out of range). */
static int plan_reserve(const Finder *f, const char *map, int64_t key_len, int64_t total,
                        Plan *p) {
    const int64_t *w = f->field, pages = f->num_pages;
    p->num_pages = total <= f->inline_bytes ? 0 : (total + f->page_size - 1) / f->page_size;
    p->old = probe(f, map, p->lo, p->hi);
    p->regret = -1;
    if (p->old == NOT_HERE || key_len <= 0 || p->num_pages > pages) return 0;
    if (p->old == ABSENT) { /* a new key: a request for it (the regret sample), unless made */
        p->old = -1;
        if (!p->requested && !regret_record(f, map, p, &p->regret)) return 0;
    }
    int room = has_room(f, map, p->num_pages);
    if (room <= 0) return room < 0 ? LEAVE_TO_PYTHON : NO_ROOM;
    int64_t num_free = load(map, w[F_NUM_FREE_PAGES]), fresh = load(map, w[F_NEXT_FRESH_PAGE]);
    int64_t reserved = load(map, w[F_RESERVED_PAGES]), head = load(map, w[F_FREE_ENTRY_HEAD]);
    p->eid = head ? head - 1 : load(map, w[F_NEXT_FRESH_ENTRY]); /* EntryTable.claim */
    /* A FREE slot (Python checks that only on the free chain): a READY one, or the old
     * entry itself, would be overwritten. */
    const char *claimed = entry_at(f, map, p->eid);
    if (load(claimed, w[F_STATE]) != FREE || load(claimed, w[F_GENERATION]) == INT64_MAX ||
        !claimed_off_the_probe(f, map, p))
        return 0;
    /* PageAllocator.allocate, without reserving memory (_reserve_fresh) */
    p->from_free = p->num_pages < num_free ? p->num_pages : num_free;
    p->from_fresh = p->num_pages - p->from_free;
    if (fresh > pages - p->from_fresh || reserved < 0 || reserved > pages ||
        (p->from_fresh && fresh + p->from_fresh > reserved))
        return 0;
    p->free_last = NO_PAGE;
    if (p->from_free) {
        const char *links = map + f->page_next_offset;
        int64_t page = load(map, w[F_FREE_PAGE_HEAD]);
        for (int64_t i = 0; i < p->from_free; i++) {
            if (page < 0 || page >= pages) return 0;
            p->free_last = page;
            if (i + 1 < p->from_free) page = load(links, page);
        }
    }
    return chain_ok(f, map, p, 1, 0) ? PLANNED : LEAVE_TO_PYTHON;
}

/* RegretSample.request for the record found by regret_record. */
static void regret_request(const Finder *f, char *map, int64_t record, double now,
                           Journal *j) {
    const int64_t *w = f->field;
    double seconds = now - load_double(map, record + 1);
    seconds = seconds > 0.0 ? seconds : 0.0; /* Python's max(0.0, x), NaN included */
    int64_t accesses = load(map, w[F_CLOCK]) - load(map, record + 2);
    accesses = accesses > 0 ? accesses : 0;
    int seconds_bucket = 0, access_bucket = 0; /* the first bound >= the value */
    while (seconds_bucket < SECONDS_BOUNDS && ldexp(1.0, seconds_bucket - 4) < seconds)
        seconds_bucket++;
    while (access_bucket < ACCESS_BOUNDS && (INT64_C(1) << access_bucket) < accesses)
        access_bucket++;
    put_word(j, map, record, 0);
    int64_t word = w[F_REGRET_SECONDS] + seconds_bucket;
    put_word(j, map, word, load(map, word) + 1);
    put_double(j, map, w[F_REGRET_SECONDS_SUM], load_double(map, w[F_REGRET_SECONDS_SUM]) + seconds);
    word = w[F_REGRET_ACCESSES] + access_bucket;
    put_word(j, map, word, load(map, word) + 1);
    put_word(j, map, w[F_REGRET_ACCESSES_SUM], load(map, w[F_REGRET_ACCESSES_SUM]) + accesses);
}

/* PageAllocator.allocate of the planned pages; the chain's first page (and its last):
 * NO_PAGE for an entry in its inline slot, which takes none. */
static int64_t allocate(const Finder *f, char *map, const Plan *p, int64_t *last_page) {
    const int64_t *w = f->field;
    char *links = map + f->page_next_offset;
    int64_t first = NO_PAGE, last = NO_PAGE;
    *last_page = NO_PAGE;
    if (!p->num_pages) { /* the entry's inline slot */
        store(map, w[F_USED_SLOTS], load(map, w[F_USED_SLOTS]) + 1);
        return NO_PAGE;
    }
    if (p->from_free) {
        first = load(map, w[F_FREE_PAGE_HEAD]);
        last = p->free_last;
        store(map, w[F_FREE_PAGE_HEAD], load(links, last));
        store(map, w[F_NUM_FREE_PAGES], load(map, w[F_NUM_FREE_PAGES]) - p->from_free);
    }
    if (p->from_fresh) {
        int64_t start = load(map, w[F_NEXT_FRESH_PAGE]), end = start + p->from_fresh;
        for (int64_t page = start; page < end - 1; page++) store(links, page, page + 1);
        if (first == NO_PAGE) first = start;
        else store(links, last, start);
        last = end - 1;
        store(map, w[F_NEXT_FRESH_PAGE], end);
    }
    store(links, last, NO_PAGE);
    store(map, w[F_USED_PAGES], load(map, w[F_USED_PAGES]) + p->num_pages);
    *last_page = last;
    return first;
}

/* Copy ``pieces`` back to back into the chain of pages from ``first`` (allocated just
 * now: every link in range), summing them in ``state`` in the same pass (sum_copy). */
static void scatter(const Finder *f, char *map, int64_t first, const Py_buffer *pieces,
                    int count, XXH3_state_t *state) {
    const char *links = map + f->page_next_offset;
    char *data = map + f->data_offset;
    int64_t page = first, filled = 0;
    for (int i = 0; i < count; i++) {
        const char *from = pieces[i].buf;
        int64_t left = pieces[i].len;
        while (left > 0) {
            if (filled == f->page_size) {
                page = load(links, page);
                filled = 0;
            }
            int64_t step = f->page_size - filled < left ? f->page_size - filled : left;
            sum_copy(state, from, data + page * f->page_size + filled, (size_t)step, from + step,
                     (size_t)(left - step));
            from += step;
            filled += step;
            left -= step;
        }
    }
}

/* Table.remove of ``old`` (Table._unindex): HashIndex.remove, EntryTable.remove_live,
 * PageAllocator.free, EntryTable.release. */
static void remove_old(const Finder *f, char *map, int64_t old, int64_t lo, Journal *j) {
    const int64_t *w = f->field, mask = f->index_slots - 1;
    char *index = map + f->index_offset, *live = map + f->live_offset;
    char *entry = entry_at(f, map, old);
    int64_t hole = lo & mask;
    while (load(index, hole) != old + 1) hole = (hole + 1) & mask;
    for (int64_t probe = (hole + 1) & mask;; probe = (probe + 1) & mask) {
        int64_t value = load(index, probe);
        if (!value) break;
        int64_t home = load(entry_at(f, map, value - 1), w[F_HASH_LO]) & mask;
        /* the member at probe may move to hole unless its home lies in (hole, probe] */
        if (((probe - home) & mask) >= ((probe - hole) & mask)) {
            put_release(j, index, hole, value);
            hole = probe;
        }
    }
    put_release(j, index, hole, 0);
    int64_t pos = load(entry, w[F_LIVE_POS]), last = load(map, w[F_NUM_LIVE]) - 1;
    int64_t moved = load(live, last);
    put_word(j, live, pos, moved);
    put_word(j, entry_at(f, map, moved), w[F_LIVE_POS], pos);
    put_word(j, map, w[F_NUM_LIVE], last);
    int64_t pages = load(entry, w[F_NUM_PAGES]);
    if (!in_slot(f, entry)) { /* PageAllocator.free: an inline slot holds no page */
        put_word(j, map + f->page_next_offset, load(entry, w[F_LAST_PAGE]),
              load(map, w[F_FREE_PAGE_HEAD]));
        put_word(j, map, w[F_FREE_PAGE_HEAD], load(entry, w[F_FIRST_PAGE]));
        put_word(j, map, w[F_NUM_FREE_PAGES], load(map, w[F_NUM_FREE_PAGES]) + pages);
        put_word(j, map, w[F_USED_PAGES], load(map, w[F_USED_PAGES]) - pages);
    } else {
        put_word(j, map, w[F_USED_SLOTS], load(map, w[F_USED_SLOTS]) - 1);
    }
    put_release(j, entry, w[F_STATE], FREE);
    put_release(j, entry, w[F_GENERATION], load(entry, w[F_GENERATION]) + 1);
    put_word(j, entry, w[F_NEXT_FREE], load(map, w[F_FREE_ENTRY_HEAD]));
    put_word(j, map, w[F_FREE_ENTRY_HEAD], old + 1);
}

/* Table.reserve as planned: the regret sample's request, the pages, the entry slot, its
 * record in state WRITING (its queue words clear, ``reads`` in its reads word, unless
 * QUEUED_ALREADY); the chain's first page. */
#define QUEUED_ALREADY INT64_MIN /* apply_reserve's ``reads``: queue_publish wrote the words */

static int64_t apply_reserve(const Finder *f, char *map, const Plan *p, const int64_t fields[4],
                             int64_t priority, double expires_at, double now,
                             int64_t owner_slot, int64_t owner_serial, int64_t reads) {
    const int64_t *w = f->field, eid = p->eid;
    char *entry = entry_at(f, map, eid);
    if (p->regret >= 0) regret_request(f, map, p->regret, now, NULL);
    int64_t last;
    int64_t first = allocate(f, map, p, &last);
    if (load(map, w[F_FREE_ENTRY_HEAD])) /* EntryTable.claim */
        store(map, w[F_FREE_ENTRY_HEAD], load(entry, w[F_NEXT_FREE]));
    else
        store(map, w[F_NEXT_FRESH_ENTRY], eid + 1);
    store_release(entry, w[F_GENERATION], load(entry, w[F_GENERATION]) + 1);
    store(entry, w[F_FLAGS], fields[0]);
    store(entry, w[F_HASH_LO], p->lo);
    store(entry, w[F_HASH_HI], p->hi);
    store(entry, w[F_KEY_LEN], fields[1]);
    store(entry, w[F_HEADER_LEN], fields[2]);
    store(entry, w[F_VALUE_LEN], fields[3]);
    store(entry, w[F_FIRST_PAGE], first);
    store(entry, w[F_LAST_PAGE], last);
    store(entry, w[F_NUM_PAGES], p->num_pages);
    store(entry, w[F_PRIORITY], priority);
    if (reads != QUEUED_ALREADY) {
        store(entry, w[F_PROBATION], 0);
        store(entry, w[F_QUEUE_PREV], 0);
        store(entry, w[F_QUEUE_NEXT], 0);
        store(entry, w[F_READS], reads);
    }
    store_double(entry, w[F_FREQ], 1.0);
    store_double(entry, w[F_EXPIRES_AT], expires_at);
    store(entry, w[F_OWNER_SLOT], owner_slot);
    store(entry, w[F_OWNER_SERIAL], owner_serial);
    store_release(entry, w[F_STATE], WRITING);
    return first;
}

/* Store._finish and Table.publish of the WRITING entry ``p->eid``, checked by publish_ok:
 * its checksum, the old entry's removal, the tick, READY, the index and the live list. */
static void apply_publish(const Finder *f, char *map, const Plan *p, uint64_t checksum,
                          double now) {
    const int64_t *w = f->field, eid = p->eid;
    char *entry = entry_at(f, map, eid);
    store(entry, w[F_CHECKSUM], (int64_t)checksum);
    if (p->old >= 0) remove_old(f, map, p->old, p->lo, NULL);
    int64_t clock = tick(f, map, 0);
    if (clock < 0) { /* Table.tick's Python fallback: publish_ok kept the clock in range */
        clock = load(map, w[F_CLOCK]) + 1;
        store(map, w[F_CLOCK], clock);
    }
    store(entry, w[F_CREATED], clock);
    store(entry, w[F_LAST_ACCESS], clock);
    store_double(entry, w[F_CREATED_AT], now);
    store_double(entry, w[F_ACCESSED_AT], now);
    store_release(entry, w[F_STATE], READY);
    store_release(entry, w[F_GENERATION], load(entry, w[F_GENERATION]) + 1);
    const int64_t mask = f->index_slots - 1; /* HashIndex.insert: probe saw an empty slot */
    char *index = map + f->index_offset;
    int64_t slot = p->lo & mask;
    while (load(index, slot)) slot = (slot + 1) & mask;
    store_release(index, slot, eid + 1);
    int64_t pos = load(map, w[F_NUM_LIVE]); /* EntryTable.add_live */
    store(map + f->live_offset, pos, eid);
    store(entry, w[F_LIVE_POS], pos);
    store(map, w[F_NUM_LIVE], pos + 1);
    store(map, w[F_PUTS], load(map, w[F_PUTS]) + 1);
    double expires_at = load_double(entry, w[F_EXPIRES_AT]);
    if (expires_at < load_double(map, w[F_NEXT_EXPIRY_AT]))
        store_double(map, w[F_NEXT_EXPIRY_AT], expires_at);
}

/* The planned put, written as Python writes it: reserve, fill (summed), publish. */
static uint64_t apply(const Finder *f, char *map, const Plan *p, const Py_buffer *pieces,
                      int64_t flags, int64_t priority, double expires_at, double now,
                      int64_t owner_slot, int64_t owner_serial) {
    int64_t fields[4] = {flags, pieces[0].len, pieces[1].len, pieces[2].len};
    int64_t first = apply_reserve(f, map, p, fields, priority, expires_at, now, owner_slot,
                                  owner_serial, f->queue_policy ? QUEUED_ALREADY : 0);
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    XXH3_64bits_update(&state, fields, sizeof fields);
    if (p->num_pages) {
        scatter(f, map, first, pieces, 3, &state);
    } else { /* the entry's inline slot, which holds all of it (plan_reserve) */
        char *slot = map + slot_of(f, p->eid);
        for (int i = 0; i < 3; i++) {
            sum_copy(&state, pieces[i].buf, slot, (size_t)pieces[i].len, NULL, 0);
            slot += pieces[i].len;
        }
    }
    uint64_t checksum = XXH3_64bits_digest(&state);
    apply_publish(f, map, p, checksum, now);
    return checksum;
}

/* Whether RegretSample._remember's words are in range (its ring position, the count of
 * records pushed out) and Evictor's count of evictions. */
static int evict_counts_ok(const Finder *f, const char *map) {
    const int64_t *w = f->field;
    int64_t next = load(map, w[F_REGRET_NEXT]), unrequested = load(map, w[F_REGRET_UNREQUESTED]);
    int64_t evictions = load(map, w[F_EVICTIONS]);
    return next >= 0 && next < CLOCK_LIMIT && unrequested >= 0 && unrequested < CLOCK_LIMIT &&
           evictions >= 0 && evictions < CLOCK_LIMIT;
}

/* RegretSample._remember of the key hashed ``lo``, evicted at ``now``. */
static void regret_remember(const Finder *f, char *map, int64_t lo, double now, Journal *j) {
    const int64_t *w = f->field, position = load(map, w[F_REGRET_NEXT]);
    int64_t base = w[F_REGRET_RING] + (position % REGRET_RECORDS) * REGRET_RECORD_WORDS;
    if (load(map, base)) /* pushed out before its key came back */
        put_word(j, map, w[F_REGRET_UNREQUESTED], load(map, w[F_REGRET_UNREQUESTED]) + 1);
    put_word(j, map, base, lo | 1);
    put_double(j, map, base + 1, now);
    put_word(j, map, base + 2, load(map, w[F_CLOCK]));
    put_word(j, map, w[F_REGRET_NEXT], position + 1);
}

#include "admit.c"

PyDoc_STRVAR(put_doc,
"put(mapping, key_bytes, flags, header, payload, priority, expires_at, now, owner_slot,\n"
"    owner_serial, lock_word=0, requested=False, parent=None) -> int | None\n\n"
"Store a new entry of ``key_bytes`` (codec ``header`` and ``payload``, buffers) in one\n"
"go, replacing the key's entry if there is one, and answer its checksum (summed while\n"
"its bytes were copied); -2, having changed nothing, where pages or an entry slot\n"
"must be freed first (the caller makes room and calls again); None, having changed\n"
"nothing, where the put needs anything else (memory to reserve) or meets a word out\n"
"of range: the caller then puts the Python way, which decides. In a pool whose policy\n"
"keeps queues it makes the policy's part too (the new key's recall, its place in the\n"
"lists, and in a ``prefix`` pool under the chunk keyed ``parent`` in the tree), first\n"
"making the hits readers deferred, and makes the room a put needs as the policy chooses\n"
"(-2 where it does not: the whole put is then Python's, whose eviction asks the new\n"
"key's ghost first). The caller holds the pool's lock, or passes\n"
"its ``lock_word`` (the\n"
"owner word of a process that locks by the word alone) for the put to take it here if\n"
"it is free, no flock user is counted and no repair is due; else the put answers -1,\n"
"having changed nothing, and the caller takes the lock and calls again. ``requested``:\n"
"the regret sample's request for a new key was made already (by the room made for it).");

/* A queue policy's part of a put (admit.c), in a journal that is undone, leaving nothing,
 * where a word is out of range: 1 made (or no queues to make it in), 0 not. */
typedef struct {
    Journal journal;
    int64_t above, reads;
} QueuePart;

/* Whether the put's copy leaves the key of chunk ``above`` (-1: none) as it is: Python
 * finds the parent again after the copy, which the C put does before it, so the planned
 * pages must not be the ones that hold that key (they are not, unless damage gave a live
 * entry's page to the free list). */
static int key_spared(const Finder *f, const char *map, const Plan *p, int64_t above) {
    if (above < 0 || !p->num_pages) return 1;
    const char *entry = entry_at(f, map, above);
    if (in_slot(f, entry)) return 1;
    int64_t first = load(entry, f->field[F_FIRST_PAGE]), key_len = load(entry, f->field[F_KEY_LEN]);
    return chain_ok(f, map, p, first, first + (key_len - 1) / f->page_size); /* found: in range */
}

/* The whole put's part (``put``): Table.reserve's, then the hits readers deferred (as
 * Table.publish makes them first), then Table.publish's. */
static int queued_in_put(const Finder *f, char *map, const Plan *p, PyObject *parent) {
    if (f->queue_policy == NO_QUEUES) return parent == NULL;
    QueuePart q; /* 16 KiB of stack, left unwritten until used */
    q.journal.count = q.journal.full = 0;
    int made = parent_of(f, map, parent, &q.above) && key_spared(f, map, p, q.above) &&
               queue_reserve(f, map, &q.journal, p, q.above, &q.reads);
    if (made) {
        drain_deferred(f, map);
        made = queue_publish(f, map, &q.journal, p, q.above, q.reads);
    }
    if (!made || q.journal.full) undo(&q.journal);
    return made && !q.journal.full;
}

/* The whole put's part where it needs eviction (``put`` with no room): what Table.reserve
 * does, in its order (the new key's request to the regret sample, its parent found, its
 * ghost recalled, room made: Evictor.make_room's victims, each evicted with its chain),
 * then the put planned again in ``p`` and Table.publish's part, all in one journal: 1
 * made; 0 undone, where anything is out of range or the room changed what the put
 * found (its old entry or its parent evicted: Python's put takes those turns). */
static int room_for_queued_put(const Finder *f, char *map, Plan *p, int64_t key_len,
                               int64_t total, PyObject *parent, double now) {
    QueuePart q; /* 16 KiB of stack, left unwritten until used */
    q.journal.count = q.journal.full = 0;
    Plan again = {.requested = 1, .lo = p->lo, .hi = p->hi};
    if (p->regret >= 0) regret_request(f, map, p->regret, now, &q.journal);
    int made = parent_of(f, map, parent, &q.above) &&
               queue_reserve(f, map, &q.journal, p, q.above, &q.reads);
    if (made) {
        drain_deferred(f, map);
        made = make_queue_room(f, map, &q.journal, p->num_pages,
                               f->queue_policy == QUEUE_S3FIFO ? RECALL_AT_ADMIT : q.reads, now) &&
               plan_reserve(f, map, key_len, total, &again) == PLANNED && again.old == p->old &&
               publish_ok(f, map, &again, 2) &&
               (q.above < 0 || find_key(f, map, PyBytes_AS_STRING(parent),
                                        PyBytes_GET_SIZE(parent)) == q.above) &&
               key_spared(f, map, &again, q.above) &&
               queue_publish(f, map, &q.journal, &again, q.above, q.reads);
    }
    if (!made || q.journal.full) {
        undo(&q.journal);
        return 0;
    }
    *p = again;
    return 1;
}

/* Table.reserve's part (``reserve``); in ``reads``, what the new entry's reads word keeps
 * for publish. */
static int queued_in_reserve(const Finder *f, char *map, const Plan *p, PyObject *parent,
                             int64_t *reads) {
    *reads = 0;
    if (f->queue_policy == NO_QUEUES) return parent == NULL;
    QueuePart q;
    q.journal.count = q.journal.full = 0;
    int made = parent_of(f, map, parent, &q.above) &&
               queue_reserve(f, map, &q.journal, p, q.above, reads) && !q.journal.full;
    if (!made) undo(&q.journal);
    return made;
}

/* Table.publish's part (``publish``), after the hits readers deferred. */
static int queued_in_publish(const Finder *f, char *map, const Plan *p, PyObject *parent) {
    if (f->queue_policy == NO_QUEUES) return parent == NULL;
    QueuePart q;
    q.journal.count = q.journal.full = 0;
    if (!parent_of(f, map, parent, &q.above)) return 0;
    drain_deferred(f, map);
    q.reads = load(entry_at(f, map, p->eid), f->field[F_READS]);
    int made = queue_publish(f, map, &q.journal, p, q.above, q.reads) && !q.journal.full;
    if (!made) undo(&q.journal);
    return made;
}

static PyObject *put(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 10 || nargs > 13 || !PyBytes_Check(args[1]) ||
        (nargs == 13 && args[12] != Py_None && !PyBytes_Check(args[12]))) {
        PyErr_SetString(PyExc_TypeError, "put takes mapping, key_bytes, flags, header, payload, "
                                         "priority, expires_at, now, owner_slot, owner_serial, "
                                         "lock_word, requested and parent");
        return NULL;
    }
    int64_t flags = PyLong_AsLongLong(args[2]), priority = PyLong_AsLongLong(args[5]);
    int64_t owner_slot = PyLong_AsLongLong(args[8]), owner_serial = PyLong_AsLongLong(args[9]);
    double expires_at = PyFloat_AsDouble(args[6]), now = PyFloat_AsDouble(args[7]);
    uint64_t mine = nargs >= 11 ? PyLong_AsUnsignedLongLongMask(args[10]) : 0;
    int requested = nargs >= 12 ? PyObject_IsTrue(args[11]) : 0;
    PyObject *parent = nargs == 13 && args[12] != Py_None ? args[12] : NULL;
    if (PyErr_Occurred() || requested < 0) return NULL;
    Py_buffer view, pieces[3] = {{0}};
    int usable = write_view(f, args[0], &view, 1);
    if (usable <= 0) return usable < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = NULL;
    int held = 0;
    if (PyObject_GetBuffer(args[1], &pieces[0], PyBUF_SIMPLE) < 0) goto done;
    held = 1;
    if (PyObject_GetBuffer(args[3], &pieces[1], PyBUF_SIMPLE) < 0) goto done;
    held = 2;
    if (PyObject_GetBuffer(args[4], &pieces[2], PyBUF_SIMPLE) < 0) goto done;
    held = 3;
    int64_t total = pieces[0].len + pieces[1].len + pieces[2].len;
    char *map = view.buf;
    if (total > f->total_bytes) goto done;
    if (mine && !take_lock_word(f, map, mine)) {
        result = PyLong_FromLong(-1);
        goto done;
    }
    Plan p = {.requested = requested};
    key_hash(pieces[0].buf, (size_t)pieces[0].len, &p.lo, &p.hi);
    /* the index is not changed by reserve: the key's old entry stays what it is */
    int plan = plan_reserve(f, map, pieces[0].len, total, &p);
    if (plan == NO_ROOM) result = PyLong_FromLong(-2);
    int queued_room = plan == NO_ROOM && f->queue_policy != NO_QUEUES;
    if ((plan == PLANNED && publish_ok(f, map, &p, 2)) || queued_room) {
        if (mine) store(map, f->field[F_DIRTY], 1); /* a crash from here on: repair */
        if (queued_room ? room_for_queued_put(f, map, &p, pieces[0].len, total, parent, now)
                        : queued_in_put(f, map, &p, parent)) {
            Py_XDECREF(result);
            uint64_t checksum = apply(f, map, &p, pieces, flags, priority, expires_at, now,
                                      owner_slot, owner_serial);
            result = PyLong_FromUnsignedLongLong(checksum);
        }
        if (mine) store(map, f->field[F_DIRTY], 0);
    }
    if (mine) lock_word_free(lock_word_at(f, map));
done:
    for (int i = 0; i < held; i++) PyBuffer_Release(&pieces[i]);
    PyBuffer_Release(&view);
    if (result == NULL && !PyErr_Occurred()) result = Py_NewRef(Py_None);
    return result;
}

PyDoc_STRVAR(reserve_doc,
"reserve(mapping, key_bytes, flags, header_len, value_len, priority, expires_at, now,\n"
"        owner_slot, owner_serial, parent=None) -> int | None\n\n"
"Table.reserve of a fresh put, for a value copied without the lock: the new entry's id,\n"
"in state WRITING; None, having changed nothing, where it needs eviction, memory to\n"
"reserve or meets a word out of range (the caller then reserves the Python way). In a\n"
"pool whose policy keeps queues, a new key's ghost is recalled as reserve recalls it (in\n"
"a ``prefix`` pool, under the chunk keyed ``parent``); the caller holds the pool's lock.");

static PyObject *reserve(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 10 || nargs > 11 || !PyBytes_Check(args[1]) ||
        (nargs == 11 && args[10] != Py_None && !PyBytes_Check(args[10]))) {
        PyErr_SetString(PyExc_TypeError, "reserve takes mapping, key_bytes, flags, header_len, "
                                         "value_len, priority, expires_at, now, owner_slot, "
                                         "owner_serial and parent");
        return NULL;
    }
    int64_t fields[4] = {PyLong_AsLongLong(args[2]), PyBytes_GET_SIZE(args[1]),
                         PyLong_AsLongLong(args[3]), PyLong_AsLongLong(args[4])};
    int64_t priority = PyLong_AsLongLong(args[5]);
    int64_t owner_slot = PyLong_AsLongLong(args[8]), owner_serial = PyLong_AsLongLong(args[9]);
    double expires_at = PyFloat_AsDouble(args[6]), now = PyFloat_AsDouble(args[7]);
    PyObject *parent = nargs == 11 && args[10] != Py_None ? args[10] : NULL;
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    int usable = write_view(f, args[0], &view, 1);
    if (usable <= 0) return usable < 0 ? NULL : Py_NewRef(Py_None);
    int64_t eid = -1, reads = 0;
    char *map = view.buf;
    if (fields[2] >= 0 && fields[3] >= 0 && fields[2] <= f->total_bytes &&
        fields[3] <= f->total_bytes) {
        Plan p = {.requested = 0};
        int64_t total = fields[1] + fields[2] + fields[3];
        key_hash(PyBytes_AS_STRING(args[1]), (size_t)fields[1], &p.lo, &p.hi);
        if (total <= f->total_bytes && plan_reserve(f, map, fields[1], total, &p) == PLANNED &&
            queued_in_reserve(f, map, &p, parent, &reads)) {
            apply_reserve(f, map, &p, fields, priority, expires_at, now, owner_slot,
                          owner_serial, reads);
            eid = p.eid;
        }
    }
    PyBuffer_Release(&view);
    if (eid < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(eid);
}

PyDoc_STRVAR(publish_doc,
"publish(mapping, eid, checksum, now, parent=None) -> True | None\n\n"
"Store._finish and Table.publish of WRITING entry ``eid`` of a fresh put, with its\n"
"``checksum``: replace the key's entry, make it READY and index it; in a pool whose\n"
"policy keeps queues, queue it as publish does (in a ``prefix`` pool, under the chunk\n"
"keyed ``parent``). None, having changed nothing, where a word it follows is out of\n"
"range or the parent is not here (the caller then publishes the Python way, which\n"
"decides). The caller holds the lock.");

static PyObject *publish(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 4 || nargs > 5 || (nargs == 5 && args[4] != Py_None && !PyBytes_Check(args[4]))) {
        PyErr_SetString(PyExc_TypeError, "publish takes mapping, eid, checksum, now and parent");
        return NULL;
    }
    int64_t eid = PyLong_AsLongLong(args[1]);
    uint64_t checksum = PyLong_AsUnsignedLongLong(args[2]);
    double now = PyFloat_AsDouble(args[3]);
    PyObject *parent = nargs == 5 && args[4] != Py_None ? args[4] : NULL;
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    int usable = write_view(f, args[0], &view, 1);
    if (usable <= 0) return usable < 0 ? NULL : Py_NewRef(Py_None);
    int done = 0;
    char *map = view.buf;
    if (eid >= 0 && eid < f->max_entries &&
        load(entry_at(f, map, eid), f->field[F_STATE]) == WRITING) {
        Plan p = {.eid = eid, .regret = -1};
        const char *entry = entry_at(f, map, eid);
        p.lo = load(entry, f->field[F_HASH_LO]);
        p.hi = load(entry, f->field[F_HASH_HI]);
        int64_t old = probe(f, map, p.lo, p.hi); /* NOT_HERE: a word out of range */
        p.old = old == ABSENT ? -1 : old;
        if (old != NOT_HERE && old != eid && publish_ok(f, map, &p, 1) &&
            queued_in_publish(f, map, &p, parent)) {
            apply_publish(f, map, &p, checksum, now);
            done = 1;
        }
    }
    PyBuffer_Release(&view);
    if (done) Py_RETURN_TRUE;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(evict_doc,
"evict(mapping, eid, now) -> True | None\n\n"
"Evict READY entry ``eid`` as Evictor.evict_one does in a pool whose policy keeps no\n"
"queues: remember its key in the regret sample, unindex it, free its pages and slot,\n"
"count the eviction. None, having changed nothing, where any word it follows is out of\n"
"range: the caller then evicts the Python way, which decides. The caller holds the\n"
"pool's lock.");

/* Evictor.evict_one of READY entry ``eid``: 1 evicted; 0, nothing changed, where a word
 * it follows is out of range. */
static int evict_one(const Finder *f, char *map, int64_t eid, double now) {
    const int64_t *w = f->field;
    if (eid < 0 || eid >= f->max_entries || !evict_counts_ok(f, map)) return 0;
    char *entry = entry_at(f, map, eid);
    int64_t lo = load(entry, w[F_HASH_LO]);
    if (!old_ok(f, map, eid, lo)) return 0;
    if (!(load(entry, w[F_HASH_HI]) & f->regret_mask)) regret_remember(f, map, lo, now, NULL);
    remove_old(f, map, eid, lo, NULL);
    store(map, w[F_EVICTIONS], load(map, w[F_EVICTIONS]) + 1);
    return 1;
}

static PyObject *evict(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "evict takes mapping, eid and now");
        return NULL;
    }
    int64_t eid = PyLong_AsLongLong(args[1]);
    double now = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    int usable = write_view(f, args[0], &view, 0);
    if (usable <= 0) return usable < 0 ? NULL : Py_NewRef(Py_None);
    int done = evict_one(f, view.buf, eid, now);
    PyBuffer_Release(&view);
    if (done) Py_RETURN_TRUE;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(make_room_doc,
"make_room(mapping, kind, key_bytes, num_pages, words, top, now) -> list[int] | None\n\n"
"Evictor.room_for_put's first round in a pool whose sampled policy ``kind`` ranks in C\n"
"(kvcache.fastpath.RANK_KINDS): the regret sample's request for ``key_bytes`` if new\n"
"(None: made already); then, unless ``num_pages`` pages and an entry slot are free\n"
"already, one round of Evictor.make_room: the sample ``live[words[i] % num_live]``\n"
"(``words``: uint64, as many per victim wanted as the pool samples) ranked as ``rank``\n"
"ranks it, and its best ``top`` evicted as ``evict`` evicts each, skipping one evicted\n"
"already. The victims it left to the caller, in order (from the first whose words are\n"
"out of range; [] for none); None, having changed nothing, where a word it reads before\n"
"it writes is out of range. The caller holds the pool's lock and asks after it whether\n"
"there is room.");

static PyObject *make_room(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || (args[2] != Py_None && !PyBytes_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "make_room takes mapping, kind, key_bytes, num_pages, "
                                         "words, top and now");
        return NULL;
    }
    int64_t kind = PyLong_AsLongLong(args[1]), num_pages = PyLong_AsLongLong(args[3]);
    int64_t top = PyLong_AsLongLong(args[5]);
    double now = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (top < 1 || top > RANK_TOP_MAX || kind < RANK_LRU || kind > RANK_SIZE) {
        PyErr_SetString(PyExc_ValueError, "make_room: top must be 1 to 64 and kind a RANK_KIND");
        return NULL;
    }
    Py_buffer view, words;
    int usable = write_view(f, args[0], &view, 0);
    if (usable <= 0) return usable < 0 ? NULL : Py_NewRef(Py_None);
    if (PyObject_GetBuffer(args[4], &words, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *result = NULL;
    char *map = view.buf;
    int64_t count = words.len / 8, *ids = NULL, kept = -1;
    int64_t num_live = load(map, f->field[F_NUM_LIVE]);
    Candidate best[RANK_TOP_MAX];
    Plan p = {.regret = -1};
    if (args[2] != Py_None) { /* Table.request */
        key_hash(PyBytes_AS_STRING(args[2]), (size_t)PyBytes_GET_SIZE(args[2]), &p.lo, &p.hi);
        int64_t old = probe(f, map, p.lo, p.hi);
        if (old == NOT_HERE || (old == ABSENT && !regret_record(f, map, &p, &p.regret)))
            goto done;
    }
    int room = has_room(f, map, num_pages);
    if (room < 0 || words.len % 8 || count < top || num_live <= 0 || num_live > f->max_entries)
        goto done;
    if (!room) {
        ids = PyMem_Malloc((size_t)count * 8);
        if (ids == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        draw_sample(map + f->live_offset, (uint64_t)num_live, words.buf, count, ids);
        kept = rank_sample(f, map, kind, ids, count, top, now, best);
        if (kept < 0) goto done;
    }
    if (p.regret >= 0) regret_request(f, map, p.regret, now, NULL);
    int64_t at = 0;
    for (; at < kept; at++) {
        int64_t eid = ids[best[at].place];
        if (load(entry_at(f, map, eid), f->field[F_STATE]) != READY) continue; /* drawn twice */
        if (!evict_one(f, map, eid, now)) break;
    }
    result = ranked_list(best + at, kept > at ? kept - at : 0, ids);
done:
    PyMem_Free(ids);
    PyBuffer_Release(&words);
    PyBuffer_Release(&view);
    if (result == NULL && !PyErr_Occurred()) result = Py_NewRef(Py_None);
    return result;
}

PyDoc_STRVAR(delete_doc,
"delete(mapping, key_bytes) -> bool | None\n\n"
"Store.delete in a pool whose policy keeps no queues: find the entry that holds exactly\n"
"``key_bytes`` and remove it (unindex it, free its pages or slot and its entry slot), as\n"
"Table.remove does; True if it was there, False if the key is certainly absent. None,\n"
"having changed nothing, for anything else (a hash collision, a word out of range): the\n"
"caller then deletes the Python way, which decides. The caller holds the pool's lock.");

static PyObject *delete_entry(Finder *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "delete takes mapping and key_bytes");
        return NULL;
    }
    Py_buffer view;
    int usable = write_view(f, args[0], &view, 0);
    if (usable <= 0) return usable < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = Py_None;
    char *map = view.buf;
    const char *key = PyBytes_AS_STRING(args[1]);
    int64_t key_len = PyBytes_GET_SIZE(args[1]), lo, hi;
    key_hash(key, (size_t)key_len, &lo, &hi);
    int64_t eid = probe(f, map, lo, hi);
    if (eid == ABSENT) {
        result = Py_False;
    } else if (eid >= 0 && holds_key(f, map, eid, key, key_len) &&
               old_ok(f, map, eid, lo)) {
        remove_old(f, map, eid, lo, NULL);
        result = Py_True;
    }
    PyBuffer_Release(&view);
    return Py_NewRef(result);
}
