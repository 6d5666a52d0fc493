/*
 * Compiled CPU kernels of recstream.nn's disk tier (tier_cache, tier_file): row copies between a
 * table's cache, its store's memory-mapped files and the arrays between them (copy_rows), and a
 * step's lookup of ids that are all cached (lookup_cached).
 *
 * Why C and not numpy: a cache-full step of a tiered table moves a few thousand rows of a few dozen
 * bytes each, scattered over tensors and files of hundreds of MiB, several times over (the evicted
 * rows out of the cache, into the file; the loaded ones out of the file, into the cache). numpy's
 * `take` and indexed assignment copy one row after the other, each waiting on its cache (and TLB)
 * miss, with the GIL held, so the training thread and the prefetch thread take turns. One loop with
 * the rows ahead prefetched keeps several misses in flight, and runs with the GIL released. A
 * step's lookup, once every id is cached (what a prefetch makes the rule), is one pass over the ids
 * instead of a dozen numpy calls (a sort for the distinct ids among them). No library offers these on
 * buffers it does not own; they are short, so they are written here.
 *
 * Arguments are buffers (numpy arrays, no copy), bounds-checked before anything is written: a wrong
 * argument raises instead of writing out of bounds or half a result. recstream/nn/tier_kernels.py
 * says whether this module was built; numpy runs where it was not.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Rows ahead whose bytes are prefetched: enough misses in flight to cover DRAM latency. */
#define AHEAD 16

static inline void prefetch_read(const void *p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p, 0);
#else
    (void)p;
#endif
}

static inline void prefetch_write(const void *p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p, 1);
#else
    (void)p;
#endif
}

/* A 2-D buffer whose rows are contiguous (any distance between rows): its base, rows, bytes a row
 * and the distance between rows. */
typedef struct {
    Py_buffer view;
    char *base;
    Py_ssize_t rows, row_bytes, stride;
} Rows;

static int get_rows(PyObject *obj, Rows *r, int writable, const char *name) {
    int flags = PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &r->view, flags) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a%s 2-D buffer whose rows are contiguous", name,
                     writable ? " writable" : "");
        return -1;
    }
    if (r->view.ndim != 2 || r->view.strides[1] != r->view.itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must be 2-D with contiguous rows, got %d dimensions", name, r->view.ndim);
        PyBuffer_Release(&r->view);
        return -1;
    }
    r->base = r->view.buf;
    r->rows = r->view.shape[0];
    r->row_bytes = r->view.shape[1] * r->view.itemsize;
    r->stride = r->view.strides[0];
    return 0;
}

/* An int64 vector (or None: no buffer, *n untouched). */
static int get_index(PyObject *obj, Py_buffer *view, const int64_t **data, Py_ssize_t *n, const char *name) {
    if (obj == Py_None) {
        *data = NULL;
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (view->itemsize != 8 || (f[0] != 'q' && f[0] != 'l') || f[1]) {
        PyErr_Format(PyExc_TypeError, "%s must be an int64 vector, got format '%s'", name, view->format);
        PyBuffer_Release(view);
        return -1;
    }
    *data = view->buf;
    *n = view->len / 8;
    return 0;
}

static int check_index(const int64_t *index, Py_ssize_t n, Py_ssize_t rows, const char *name) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (index[i] < 0 || index[i] >= rows) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] = %lld is outside the %zd rows", name, i, (long long)index[i], rows);
            return -1;
        }
    }
    return 0;
}

static const char copy_rows_doc[] =
    "copy_rows(dst, dst_rows, src, src_rows)\n\n"
    "dst[dst_rows[i]] = src[src_rows[i]] for each i: `dst` (writable) and `src` 2-D buffers with\n"
    "contiguous rows of the same bytes, `dst_rows` and `src_rows` int64 vectors of one length, or None\n"
    "for 0, 1, ... (the other's length). The GIL is released while rows are copied.";

static PyObject *copy_rows(PyObject *self, PyObject *args) {
    PyObject *dst_obj, *dst_rows_obj, *src_obj, *src_rows_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &dst_obj, &dst_rows_obj, &src_obj, &src_rows_obj)) return NULL;
    Rows dst, src;
    Py_buffer dst_view, src_view;
    const int64_t *di = NULL, *si = NULL;
    Py_ssize_t dn = -1, sn = -1;
    if (get_rows(dst_obj, &dst, 1, "dst") < 0) return NULL;
    if (get_rows(src_obj, &src, 0, "src") < 0) {
        PyBuffer_Release(&dst.view);
        return NULL;
    }
    if (get_index(dst_rows_obj, &dst_view, &di, &dn, "dst_rows") < 0) goto fail_rows;
    if (get_index(src_rows_obj, &src_view, &si, &sn, "src_rows") < 0) goto fail_dst_index;
    Py_ssize_t n = di ? dn : (si ? sn : src.rows);
    if (di == NULL && si == NULL && dst.rows != src.rows) {
        PyErr_Format(PyExc_ValueError, "dst has %zd rows, src %zd", dst.rows, src.rows);
        goto fail;
    }
    if ((di && si && dn != sn) || (!di && n > dst.rows) || (!si && n > src.rows) ||
        (!di && si && dst.rows != n) || (di && !si && src.rows != n)) {
        PyErr_Format(PyExc_ValueError, "copy_rows: %zd rows to copy, dst has %zd, src %zd", n, dst.rows, src.rows);
        goto fail;
    }
    if (dst.row_bytes != src.row_bytes) {
        PyErr_Format(PyExc_ValueError, "dst rows hold %zd bytes, src rows %zd", dst.row_bytes, src.row_bytes);
        goto fail;
    }
    if ((di && check_index(di, n, dst.rows, "dst_rows") < 0) || (si && check_index(si, n, src.rows, "src_rows") < 0))
        goto fail;
    Py_ssize_t bytes = dst.row_bytes;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            Py_ssize_t ahead_d = di ? di[i + AHEAD] : i + AHEAD, ahead_s = si ? si[i + AHEAD] : i + AHEAD;
            const char *s = src.base + ahead_s * src.stride;
            char *d = dst.base + ahead_d * dst.stride;
            prefetch_read(s);
            prefetch_read(s + bytes - 1);
            prefetch_write(d);
            prefetch_write(d + bytes - 1);
        }
        Py_ssize_t d = di ? di[i] : i, s = si ? si[i] : i;
        memcpy(dst.base + d * dst.stride, src.base + s * src.stride, (size_t)bytes);
    }
    Py_END_ALLOW_THREADS
    if (si) PyBuffer_Release(&src_view);
    if (di) PyBuffer_Release(&dst_view);
    PyBuffer_Release(&src.view);
    PyBuffer_Release(&dst.view);
    Py_RETURN_NONE;
fail:
    if (si) PyBuffer_Release(&src_view);
fail_dst_index:
    if (di) PyBuffer_Release(&dst_view);
fail_rows:
    PyBuffer_Release(&src.view);
    PyBuffer_Release(&dst.view);
    return NULL;
}

/* A C-contiguous buffer of `itemsize`-byte items (writable or not); -1 with the error set. */
static int get_vector(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s must hold %zd-byte items, got %zd", name, itemsize, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static const char lookup_cached_doc[] =
    "lookup_cached(ids, row2slot, last_use, tick, dirty, out, fresh) -> int\n\n"
    "The slots of `ids` (int64) in a cache whose rows map to slots by `row2slot` (int32, -1 or less:\n"
    "not cached), if every one is cached: their slots into `out` (int64, as many as the ids), the\n"
    "slots not used at `tick` yet (`last_use`, int64 per slot) given `tick` and written into `fresh`\n"
    "(int64, room for the ids) in order of first use, and, unless `dirty` is None, each slot's byte\n"
    "of `dirty` (one per slot) set to 1. Returns how many slots are fresh; -1 (nothing written) if an\n"
    "id is not cached (or its slot is reserved: `last_use` at INT64_MAX), -2 if an id is outside row2slot.";

static PyObject *lookup_cached(PyObject *self, PyObject *args) {
    PyObject *ids_obj, *map_obj, *last_obj, *dirty_obj, *out_obj, *fresh_obj;
    long long tick;
    if (!PyArg_ParseTuple(args, "OOOLOOO", &ids_obj, &map_obj, &last_obj, &tick, &dirty_obj, &out_obj, &fresh_obj))
        return NULL;
    Py_buffer b[6];
    int held = 0;
    PyObject *objs[6] = {ids_obj, map_obj, last_obj, out_obj, fresh_obj, dirty_obj};
    const char *names[6] = {"ids", "row2slot", "last_use", "out", "fresh", "dirty"};
    const int writable[6] = {0, 0, 1, 1, 1, 1};
    const Py_ssize_t sizes[6] = {8, 4, 8, 8, 8, 1};
    int count = dirty_obj == Py_None ? 5 : 6;
    for (; held < count; held++)
        if (get_vector(objs[held], &b[held], writable[held], sizes[held], names[held]) < 0) goto fail;
    const int64_t *ids = b[0].buf;
    const int32_t *row2slot = b[1].buf;
    int64_t *last_use = b[2].buf, *out = b[3].buf, *fresh = b[4].buf;
    uint8_t *dirty = count == 6 ? b[5].buf : NULL;
    Py_ssize_t n = b[0].len / 8, rows = b[1].len / 4, slots = b[2].len / 8;
    if (b[3].len / 8 < n || b[4].len / 8 < n || (dirty && b[5].len < slots)) {
        PyErr_SetString(PyExc_ValueError, "lookup_cached: out and fresh need room for every id, dirty a byte a slot");
        goto fail;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n && ids[i + AHEAD] >= 0 && ids[i + AHEAD] < rows) prefetch_read(row2slot + ids[i + AHEAD]);
        int64_t id = ids[i];
        if (id < 0 || id >= rows) {
            k = -2;
            break;
        }
        int32_t s = row2slot[id];
        if (s < 0) {
            k = -1;
            break;
        }
        if (s >= slots) {
            PyErr_Format(PyExc_ValueError, "lookup_cached: row %lld maps to slot %d of %zd", (long long)id, s, slots);
            goto fail;
        }
        if (last_use[s] == INT64_MAX) { /* a slot reserved by a prefetch (mapped rows never are): not here */
            k = -1;
            break;
        }
        out[i] = s;
    }
    if (k == 0) {
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t s = out[i];
            if (dirty) dirty[s] = 1;
            if (last_use[s] != tick) {
                last_use[s] = tick;
                fresh[k++] = s;
            }
        }
    }
    for (int j = 0; j < held; j++) PyBuffer_Release(&b[j]);
    return PyLong_FromSsize_t(k);
fail:
    for (int j = 0; j < held; j++) PyBuffer_Release(&b[j]);
    return NULL;
}

static PyMethodDef methods[] = {
    {"copy_rows", copy_rows, METH_VARARGS, copy_rows_doc},
    {"lookup_cached", lookup_cached, METH_VARARGS, lookup_cached_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tier_kernels",
    "Compiled CPU kernels of recstream.nn's disk tier (see the comment atop _tier_kernels.c).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__tier_kernels(void) { return PyModule_Create(&module); }
