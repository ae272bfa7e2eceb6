/* The pool lock's word in C: a futex over a header word whose owner is a process slot.
 *
 * The word (header word ``lock_word``, 64 bits, little-endian)::
 *
 *     63              32 31 30        21 20             0
 *     +-----------------+--+------------+----------------+
 *     | owner's serial  |W |     0      |   slot + 1     |   0 = free
 *     +-----------------+--+------------+----------------+
 *      (low 32 bits)      W: a waiter sleeps on the word (the futex is the low half)
 *
 * The owner is named by its process slot and that slot's serial (kvcache.procs), not
 * by a pid or a tid: those are per PID namespace, and a word of ours (rather than a
 * pthread mutex) means nothing depends on one libc's layout. Whether an owner still
 * runs is the kernel's lease on its slot, which the Python side checks
 * (kvcache.lock) when a wait here times out; it then takes a dead owner's word over
 * with ``take_over``, a compare-and-swap, so that one waiter only wins.
 *
 * After taking the word, ``lock`` reads the header word ``flock_users`` (processes
 * that lock with flock only: the pure-Python engine, observers): non-zero tells the
 * caller to take the flock as well. The compare-and-swap and that read are seq_cst,
 * and a flock-only process raises the count before a membarrier (its side of the
 * fence): either it sees this word held, and waits for it to change, or this read
 * sees its count (kvcache.lock explains the whole protocol).
 *
 * The caller holds the process's thread lock around every call, and passes the
 * header's buffer each time (so no view of the mapping outlives the call). A word
 * index outside the buffer is a ValueError; any value of the word is handled.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <time.h>

#include "lockword.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvcache._poollock waits on the low half of a little-endian word"
#endif

#define SPINS 200            /* loads before sleeping: a holder's section is ~1-5 us */
#define WAIT_NS 5000000L     /* 5 ms asleep, then the caller checks the owner's lease */
#define MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED 4

enum { ACQUIRED = 0, ACQUIRED_WITH_FLOCK = 1, TIMED_OUT = -1 };

typedef struct {
    Py_buffer view;
    _Atomic uint64_t *word, *users;
} Header;

/* The header's lock word and count, after checking both lie in it (8-byte aligned). */
static int open_header(PyObject *header, PyObject *lock_index, PyObject *users_index,
                       Header *h) {
    long long lock_at = PyLong_AsLongLong(lock_index), users_at = PyLong_AsLongLong(users_index);
    if ((lock_at == -1 || users_at == -1) && PyErr_Occurred()) return -1;
    if (PyObject_GetBuffer(header, &h->view, PyBUF_WRITABLE) < 0) return -1;
    Py_ssize_t words = h->view.len / 8;
    if (lock_at < 0 || lock_at >= words || users_at < 0 || users_at >= words ||
        ((uintptr_t)h->view.buf & 7) != 0) {
        PyBuffer_Release(&h->view);
        PyErr_SetString(PyExc_ValueError, "lock word index outside the header");
        return -1;
    }
    h->word = (_Atomic uint64_t *)h->view.buf + lock_at;
    h->users = (_Atomic uint64_t *)h->view.buf + users_at;
    return 0;
}

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Taken: the count decides whether the flock is needed too (seq_cst after the CAS). */
static int taken(const Header *h) {
    return atomic_load_explicit(h->users, memory_order_seq_cst) != 0 ? ACQUIRED_WITH_FLOCK
                                                                      : ACQUIRED;
}

/* Sleep while the futex half still reads ``low``; the GIL is released meanwhile. */
static int sleep_on(const Header *h, uint32_t low) {
    struct timespec timeout = {0, WAIT_NS};
    long rc;
    Py_BEGIN_ALLOW_THREADS
    rc = syscall(SYS_futex, (uint32_t *)h->word, FUTEX_WAIT, low, &timeout, NULL, 0);
    Py_END_ALLOW_THREADS
    return rc == -1 && errno == ETIMEDOUT;
}

PyDoc_STRVAR(lock_doc,
"lock(header, lock_index, users_index, mine) -> int\n\n"
"Take the word at ``lock_index`` of ``header`` for owner word ``mine``: 0 taken,\n"
"1 taken and ``flock_users`` is non-zero (take the flock too), -1 still held after a\n"
"wait (check the owner's lease, then call again or ``take_over``).");

static PyObject *lock(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "lock takes header, lock_index, users_index, mine");
        return NULL;
    }
    uint64_t mine = PyLong_AsUnsignedLongLongMask(args[3]);
    if (mine == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    Header h;
    if (open_header(args[0], args[1], args[2], &h) < 0) return NULL;
    int result = TIMED_OUT;
    uint64_t want = mine, seen = 0;
    for (int spins = 0;; spins++) {
        seen = 0;
        if (atomic_compare_exchange_strong_explicit(h.word, &seen, want, memory_order_seq_cst,
                                                    memory_order_relaxed)) {
            result = taken(&h);
            break;
        }
        if (spins < SPINS) {
            relax();
            continue;
        }
        /* Mark the word as waited on, then sleep on its low half. Once this thread has
         * slept it takes the word with the mark set, so its unlock wakes the others. */
        if (!(seen & WAITERS) &&
            !atomic_compare_exchange_strong_explicit(h.word, &seen, seen | WAITERS,
                                                     memory_order_relaxed, memory_order_relaxed))
            continue;
        want = mine | WAITERS;
        if (sleep_on(&h, (uint32_t)(seen | WAITERS))) break; /* timed out: is it alive? */
        if (PyErr_CheckSignals() < 0) {
            PyBuffer_Release(&h.view);
            return NULL;
        }
    }
    PyBuffer_Release(&h.view);
    return PyLong_FromLong(result);
}

PyDoc_STRVAR(take_over_doc,
"take_over(header, lock_index, users_index, seen, mine) -> int\n\n"
"Replace a dead owner's word ``seen`` by ``mine`` (keeping the waiters' mark), as\n"
"``lock`` answers; -1 if the word is no longer ``seen`` (someone else moved first).");

static PyObject *take_over(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "take_over takes header, lock_index, users_index, seen, mine");
        return NULL;
    }
    uint64_t seen = PyLong_AsUnsignedLongLongMask(args[3]);
    if (seen == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    uint64_t mine = PyLong_AsUnsignedLongLongMask(args[4]);
    if (mine == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    Header h;
    if (open_header(args[0], args[1], args[2], &h) < 0) return NULL;
    int result = TIMED_OUT;
    if (seen != 0 &&
        atomic_compare_exchange_strong_explicit(h.word, &seen, mine | (seen & WAITERS),
                                                memory_order_seq_cst, memory_order_relaxed))
        result = taken(&h);
    PyBuffer_Release(&h.view);
    return PyLong_FromLong(result);
}

PyDoc_STRVAR(unlock_doc,
"unlock(header, lock_index, users_index) -> None\n\n"
"Free the word (a release store) and wake one sleeper if any is marked.");

static PyObject *unlock(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "unlock takes header, lock_index, users_index");
        return NULL;
    }
    Header h;
    if (open_header(args[0], args[1], args[2], &h) < 0) return NULL;
    lock_word_free(h.word);
    PyBuffer_Release(&h.view);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(register_doc,
"register() -> bool\n\n"
"Register this process for MEMBARRIER_CMD_GLOBAL_EXPEDITED, which flock-only processes\n"
"send (their side of the fence); False where the kernel refuses: this process then\n"
"must not take the word without the flock.");

static PyObject *register_process(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    long rc = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0);
    return PyBool_FromLong(rc == 0);
}

static PyMethodDef methods[] = {
    {"lock", (PyCFunction)(void (*)(void))lock, METH_FASTCALL, lock_doc},
    {"take_over", (PyCFunction)(void (*)(void))take_over, METH_FASTCALL, take_over_doc},
    {"unlock", (PyCFunction)(void (*)(void))unlock, METH_FASTCALL, unlock_doc},
    {"register", register_process, METH_NOARGS, register_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvcache._poollock",
    "The pool lock's futex word (see kvcache.lock).", -1, methods,
};

PyMODINIT_FUNC PyInit__poollock(void) { return PyModule_Create(&module); }
