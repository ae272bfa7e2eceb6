/* Copy and checksum in one pass (sumcopy.h), so a value's bytes cross the memory bus
 * once on the way in and once on the way out, instead of once more for the sum.
 *
 * The sum is XXH3-64 over the same bytes, in the same order, as kvcache.transfer's
 * pure-Python path (the xxhash module), so a pool written by either is read by both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "sumcopy.h" /* xxhash, copy_bytes, and sum_copy: the copy riding in the sum */

/* From this many bytes up a copy into the pool's pages goes round the cache
 * (non-temporal stores): the sum has just read each stretch into the cache, and
 * writing through it would read every target line from memory first and evict the
 * source; a value this large is not read back soon by the process that put it.
 * Measured from memory: summing and streaming 1.15-1.20x the speed of a plain copy, the
 * one pass through the cache (sum_copy) 1.03-1.07x (docs/performance.md). */
#define STREAM_BYTES ((Py_ssize_t)65536)

typedef struct {
    Py_buffer *views;
    Py_ssize_t count;
} Buffers;

static void release(Buffers *buffers) {
    for (Py_ssize_t i = 0; i < buffers->count; i++) PyBuffer_Release(&buffers->views[i]);
    PyMem_Free(buffers->views);
    buffers->views = NULL;
    buffers->count = 0;
}

/* Take a buffer of each item of a sequence (writable ones for targets). */
static int acquire(PyObject *sequence, int writable, Buffers *out, Py_ssize_t *total) {
    PyObject *fast = PySequence_Fast(sequence, "expected a sequence of buffers");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    out->views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    out->count = 0;
    *total = 0;
    if (out->views == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &out->views[i], flags) < 0) {
            Py_DECREF(fast);
            release(out);
            return -1;
        }
        out->count = i + 1;
        *total += out->views[i].len;
    }
    Py_DECREF(fast);
    return 0;
}

/* Sum ``sources`` (into ``state``; NULL: no sum) while copying them back to back into
 * ``targets``: each piece in one pass (sum_copy), or with ``stream`` (which sums) round
 * the cache, stretch by stretch, each summed and then streamed from L1. */
static void copy_summing(XXH3_state_t *state, const Buffers *sources, const Buffers *targets,
                         int stream) {
    const Py_ssize_t stretch = (Py_ssize_t)STRETCH;
    Py_ssize_t t = 0, filled = 0;
    for (Py_ssize_t s = 0; s < sources->count; s++) {
        const char *from = sources->views[s].buf;
        Py_ssize_t left = sources->views[s].len;
        while (left > 0) {
            while (targets->views[t].len == filled) {
                t++;
                filled = 0;
            }
            Py_ssize_t room = targets->views[t].len - filled;
            Py_ssize_t take = stream && left > stretch ? stretch : left;
            if (take > room) take = room;
            char *to = (char *)targets->views[t].buf + filled;
            if (stream && take == stretch && take < left && take < room) /* end on a line */
                take -= (Py_ssize_t)((uintptr_t)(to + take) & 63);
            if (stream) {
                XXH3_64bits_update(state, from, (size_t)take);
                copy_streaming(to, from, (size_t)take);
            } else if (state != NULL) {
                /* what it copies next: the rest of this source, or the next one */
                const Py_buffer *next = take < left ? NULL
                    : s + 1 < sources->count ? &sources->views[s + 1] : NULL;
                sum_copy(state, from, to, (size_t)take, next ? next->buf : from + take,
                         (size_t)(next ? next->len : left - take));
            } else {
                copy_bytes(to, from, (size_t)take);
            }
            from += take;
            left -= take;
            filled += take;
        }
    }
}

/* XXH3-64 of ``summed`` then ``sources``, copying ``sources`` into ``targets`` meanwhile. */
static XXH64_hash_t sum_copying(const Buffers *summed, Py_ssize_t summed_bytes,
                                const Buffers *sources, Py_ssize_t source_bytes,
                                const Buffers *targets, int stream) {
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    int release_gil = summed_bytes + source_bytes >= RELEASE_GIL_BYTES;
    PyThreadState *saved = release_gil ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < summed->count; i++)
        XXH3_64bits_update(&state, summed->views[i].buf, (size_t)summed->views[i].len);
    copy_summing(&state, sources, targets, stream);
    if (stream) STREAMED_STORES_FENCE();
    XXH64_hash_t digest = XXH3_64bits_digest(&state);
    if (release_gil) PyEval_RestoreThread(saved);
    return digest;
}

PyDoc_STRVAR(sum_and_copy_doc,
"sum_and_copy(summed, sources, targets) -> int\n\n"
"XXH3-64 of the buffers ``summed`` then ``sources``, back to back, as an unsigned\n"
"int; ``sources`` are copied back to back into the writable ``targets`` (which\n"
"must hold at least as many bytes) in the same pass. The GIL is released while\n"
"large copies run.");

/* Buffers of ``sources`` and of the writable ``targets``, which must hold at least as
 * many bytes: the bytes to copy, or -1 with an exception set (and nothing held). */
static Py_ssize_t acquire_copy(PyObject *source_list, PyObject *target_list, Buffers *sources,
                               Buffers *targets) {
    Py_ssize_t source_bytes, target_bytes;
    if (acquire(source_list, 0, sources, &source_bytes) < 0) return -1;
    if (acquire(target_list, 1, targets, &target_bytes) < 0) {
        release(sources);
        return -1;
    }
    if (target_bytes < source_bytes) {
        PyErr_Format(PyExc_ValueError, "targets hold %zd bytes, fewer than the %zd to copy",
                     target_bytes, source_bytes);
        release(sources);
        release(targets);
        return -1;
    }
    return source_bytes;
}

/* sum_and_copy and sum_and_stream: ``stream`` copies round the cache from STREAM_BYTES. */
static PyObject *sum_into(PyObject *const *args, Py_ssize_t nargs, int stream) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "takes summed, sources and targets");
        return NULL;
    }
    Buffers summed = {0}, sources = {0}, targets = {0};
    Py_ssize_t summed_bytes, source_bytes;
    PyObject *result = NULL;
    if (acquire(args[0], 0, &summed, &summed_bytes) < 0) return NULL;
    if ((source_bytes = acquire_copy(args[1], args[2], &sources, &targets)) < 0) goto done;
    XXH64_hash_t digest = sum_copying(&summed, summed_bytes, &sources, source_bytes, &targets,
                                      stream && source_bytes >= STREAM_BYTES);
    result = PyLong_FromUnsignedLongLong((unsigned long long)digest);
done:
    release(&summed);
    release(&sources);
    release(&targets);
    return result;
}

static PyObject *sum_and_copy(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return sum_into(args, nargs, 0);
}

PyDoc_STRVAR(sum_and_stream_doc,
"sum_and_stream(summed, sources, targets) -> int\n\n"
"As ``sum_and_copy``, for targets not read again soon (a put into the pool's pages):\n"
"from 64 KiB up the copy goes round the CPU's cache (non-temporal stores, on x86-64).");

static PyObject *sum_and_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return sum_into(args, nargs, 1);
}

PyDoc_STRVAR(sum_and_join_doc,
"sum_and_join(summed, sources) -> (int, bytes)\n\n"
"As ``sum_and_copy``, into a new ``bytes`` holding ``sources`` back to back: a read\n"
"of a plain value summed in the pass that copies it out.");

static PyObject *sum_and_join(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "sum_and_join takes summed and sources");
        return NULL;
    }
    Buffers summed = {0}, sources = {0};
    Py_ssize_t summed_bytes, source_bytes;
    PyObject *joined = NULL, *result = NULL;
    if (acquire(args[0], 0, &summed, &summed_bytes) < 0) return NULL;
    if (acquire(args[1], 0, &sources, &source_bytes) < 0) goto done;
    joined = PyBytes_FromStringAndSize(NULL, source_bytes);
    if (joined == NULL) goto done;
    Py_buffer target = {.buf = PyBytes_AS_STRING(joined), .len = source_bytes};
    Buffers targets = {.views = &target, .count = 1};
    XXH64_hash_t digest =
        sum_copying(&summed, summed_bytes, &sources, source_bytes, &targets, 0);
    result = Py_BuildValue("(KN)", (unsigned long long)digest, joined);
    joined = NULL; /* Py_BuildValue's "N" took it, or released it on failure */
done:
    Py_XDECREF(joined);
    release(&summed);
    release(&sources);
    return result;
}

PyDoc_STRVAR(copy_doc,
"copy(sources, targets) -> None\n\n"
"Copy ``sources`` back to back into the writable ``targets``, as ``sum_and_copy``\n"
"does but without the sum (a read that does not verify), and without memcpy's slow\n"
"case (copybytes.h). The GIL is released while large copies run.");

static PyObject *copy(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy takes sources and targets");
        return NULL;
    }
    Buffers sources = {0}, targets = {0};
    Py_ssize_t source_bytes = acquire_copy(args[0], args[1], &sources, &targets);
    if (source_bytes < 0) return NULL;
    PyThreadState *saved = source_bytes >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    copy_summing(NULL, &sources, &targets, 0);
    if (saved != NULL) PyEval_RestoreThread(saved);
    release(&sources);
    release(&targets);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy", (PyCFunction)(void (*)(void))copy, METH_FASTCALL, copy_doc},
    {"sum_and_copy", (PyCFunction)(void (*)(void))sum_and_copy, METH_FASTCALL, sum_and_copy_doc},
    {"sum_and_join", (PyCFunction)(void (*)(void))sum_and_join, METH_FASTCALL, sum_and_join_doc},
    {"sum_and_stream", (PyCFunction)(void (*)(void))sum_and_stream, METH_FASTCALL,
     sum_and_stream_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvcache._copysum",
    "Copy and XXH3-64 checksum in one pass (see kvcache.transfer).", -1, methods,
};

PyMODINIT_FUNC PyInit__copysum(void) {
    choose_copy();
    choose_sum_copy();
    return PyModule_Create(&module);
}
