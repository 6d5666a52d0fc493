/*
 * Compiled CPU kernels of recstream.optim's row-sparse updates: lazy Adam's, RowWiseAdagrad's and
 * FTRL's update of the touched rows of a float32 table (lazy_adam, rowwise_adagrad, ftrl).
 *
 * Why C and not torch ops: on a CPU the torch form of a row update gathers each state tensor's
 * rows (index_select), runs half a dozen elementwise ops over those copies and scatters them back
 * (index_copy_/scatter_/index_add_): for the ~19k rows of a Criteo-sized step that is a dozen
 * passes, three of them random accesses into tables of millions of rows, each paying its cache
 * misses again. One loop over the rows reads each touched row once, updates it in registers and
 * writes it back, with the next rows prefetched. No library offers a fused sparse update of these
 * optimizers on a CPU over tensors it does not own (FBGEMM's fused embedding optimizers own their
 * table storage, and boost keeps a user's Adam state in Adam's own tensors), so it is written here.
 *
 * The arithmetic is the one of the torch ops (same formulas, in float32, in the same order), so the
 * kernels and the ops agree to rounding: the ops' vectorised reductions and fused multiply-adds
 * may round differently in the last bit (tests compare the two within float32 tolerance).
 *
 * Arguments: C-contiguous buffers (numpy views of CPU tensors, no copy), float32 for values and
 * int64 for row numbers; `rows` must be unique (a coalesced gradient's). Every row number is
 * bounds-checked and every size compared before anything is written, so a wrong argument raises
 * instead of writing out of bounds or half a result. The GIL is released while a kernel runs.
 * recstream/optim/native.py says whether this module was built; the torch ops run where it was
 * not (and on CUDA, and for other dtypes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

/* Rows ahead whose weights and state are prefetched: enough misses in flight to cover DRAM latency. */
#define AHEAD 16

static inline void prefetch(const void *p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p);
#else
    (void)p;
#endif
}

typedef struct {
    Py_buffer view;
    void *data;
    Py_ssize_t n; /* elements */
} Array;

/* A C-contiguous buffer of 4-byte floats ('f') or 8-byte integers ('q'/'l'), per `kind`. */
static int get_array(PyObject *obj, Array *a, int writable, char kind, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    const char *what = kind == 'f' ? "float32" : "int64";
    if (PyObject_GetBuffer(obj, &a->view, flags) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s %s buffer", name, writable ? " writable" : "", what);
        return -1;
    }
    const char *f = a->view.format ? a->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = kind == 'f' ? (a->view.itemsize == 4 && f[0] == 'f' && !f[1])
                         : (a->view.itemsize == 8 && (f[0] == 'q' || f[0] == 'l') && !f[1]);
    if (!ok) {
        PyBuffer_Release(&a->view);
        PyErr_Format(PyExc_TypeError, "%s must be a %s buffer, got format '%s'", name, what, a->view.format);
        return -1;
    }
    a->data = a->view.buf;
    a->n = a->view.len / a->view.itemsize;
    return 0;
}

/* Take the buffer arguments objs[0..n) into a[0..n) (kinds[k]: 'f' or 'q'); release them all if one
 * fails. Returns -1 with the error set. */
static int get_arrays(PyObject *const *objs, const char *const *names, const char *kinds, const int *writable,
                      int n, Array *a) {
    for (int k = 0; k < n; k++) {
        if (get_array(objs[k], &a[k], writable[k], kinds[k], names[k]) < 0) {
            while (k-- > 0) PyBuffer_Release(&a[k].view);
            return -1;
        }
    }
    return 0;
}

static void release_arrays(Array *a, int n) {
    for (int k = 0; k < n; k++) PyBuffer_Release(&a[k].view);
}

/* Every row number in [0, num_rows): else ValueError naming the first bad one. */
static int check_rows(const int64_t *rows, Py_ssize_t n, Py_ssize_t num_rows) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (rows[i] < 0 || rows[i] >= num_rows) {
            PyErr_Format(PyExc_ValueError, "rows[%zd] = %lld is outside the table's %zd rows", i,
                         (long long)rows[i], num_rows);
            return -1;
        }
    }
    return 0;
}

/* The shapes: weight [num_rows * dim], grad [n * dim]; `n_state` per-row state buffers of
 * num_rows * state_width values each. */
static int check_sizes(const Array *a, Py_ssize_t dim, int n_state, Py_ssize_t state_width, Py_ssize_t *num_rows) {
    /* a[0] weight, a[1 .. n_state] state, a[n_state + 1] rows, a[n_state + 2] grad */
    if (dim <= 0 || a[0].n % dim != 0) {
        PyErr_Format(PyExc_ValueError, "dim must be > 0 and divide the weight's %zd values, got %zd", a[0].n, dim);
        return -1;
    }
    *num_rows = a[0].n / dim;
    for (int k = 1; k <= n_state; k++) {
        if (a[k].n != *num_rows * state_width) {
            PyErr_Format(PyExc_ValueError, "state buffer %d holds %zd values, expected %zd", k, a[k].n,
                         *num_rows * state_width);
            return -1;
        }
    }
    Py_ssize_t n = a[n_state + 1].n;
    if (a[n_state + 2].n != n * dim) {
        PyErr_Format(PyExc_ValueError, "grad holds %zd values, expected %zd (rows) x %zd (dim)",
                     a[n_state + 2].n, n, dim);
        return -1;
    }
    return 0;
}

/* The arguments of a row update, taken and checked: the buffers objs[0..n_state + 3) (weight, n_state
 * state buffers of state_width values per row, rows, grad) into a[], their sizes against `dim`, every
 * row number against the table. Returns the number of rows (via *n) and 0, or -1 with the error set
 * and nothing held. */
static int take_update(PyObject *const *objs, const char *const *names, int n_state, Py_ssize_t state_width,
                       Py_ssize_t dim, Array *a, Py_ssize_t *n) {
    char kinds[8] = "f";
    int writable[8] = {1};
    for (int k = 1; k <= n_state; k++) {
        kinds[k] = 'f';
        writable[k] = 1;
    }
    kinds[n_state + 1] = 'q';
    kinds[n_state + 2] = 'f';
    writable[n_state + 1] = writable[n_state + 2] = 0;
    int count = n_state + 3;
    if (get_arrays(objs, names, kinds, writable, count, a) < 0) return -1;
    Py_ssize_t num_rows;
    if (check_sizes(a, dim, n_state, state_width < 0 ? dim : state_width, &num_rows) < 0 ||
        check_rows(a[n_state + 1].data, a[n_state + 1].n, num_rows) < 0) {
        release_arrays(a, count);
        return -1;
    }
    *n = a[n_state + 1].n;
    return 0;
}

/* What a row update returns once done: None, its buffers released. */
static PyObject *updated(Array *a, int count) {
    release_arrays(a, count);
    Py_RETURN_NONE;
}

static const char lazy_adam_doc[] =
    "lazy_adam(weight, exp_avg, exp_avg_sq, rows, grad, dim, one_minus_beta1, beta2, one_minus_beta2, eps,\n"
    "          step_size, bias_correction2_sqrt)\n\n"
    "Lazy Adam's update of the unique `rows` of `weight`, `exp_avg` (m) and `exp_avg_sq` (v), each\n"
    "[num_rows * dim] float32, from their gradient `grad` ([len(rows) * dim]): m += (1 - beta1) (g - m),\n"
    "v = beta2 v + (1 - beta2) g g, w -= step_size m / (sqrt(v) / bias_correction2_sqrt + eps). 1 - beta1\n"
    "and 1 - beta2 come as the caller computed them (in double, as the torch ops get them).";

static PyObject *lazy_adam(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[5];
    Py_ssize_t dim;
    float weight1, beta2, weight2, eps, step_size, bc2;
    if (!PyArg_ParseTuple(args, "OOOOOnffffff:lazy_adam", &o[0], &o[1], &o[2], &o[3], &o[4], &dim, &weight1, &beta2,
                          &weight2, &eps, &step_size, &bc2))
        return NULL;
    static const char *const names[] = {"weight", "exp_avg", "exp_avg_sq", "rows", "grad"};
    Array a[5];
    Py_ssize_t n;
    if (take_update(o, names, 2, -1, dim, a, &n) < 0) return NULL;
    float *w = a[0].data, *m = a[1].data, *v = a[2].data;
    const int64_t *rows = a[3].data;
    const float *grad = a[4].data;
    Py_BEGIN_ALLOW_THREADS
    float neg_step = -step_size;
    int small = fabsf(weight1) < 0.5f;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            Py_ssize_t ahead = rows[i + AHEAD] * dim;
            prefetch(w + ahead);
            prefetch(m + ahead);
            prefetch(v + ahead);
        }
        Py_ssize_t base = rows[i] * dim;
        const float *g = grad + i * dim;
        for (Py_ssize_t j = 0; j < dim; j++) {
            float mj = small ? m[base + j] + weight1 * (g[j] - m[base + j]) /* torch's lerp, both forms */
                             : g[j] - (g[j] - m[base + j]) * (1.0f - weight1);
            float vj = v[base + j] * beta2 + weight2 * g[j] * g[j];
            float denom = sqrtf(vj) / bc2 + eps;
            m[base + j] = mj;
            v[base + j] = vj;
            w[base + j] += (mj / denom) * neg_step;
        }
    }
    Py_END_ALLOW_THREADS
    return updated(a, 5);
}

static const char rowwise_adagrad_doc[] =
    "rowwise_adagrad(weight, acc, rows, grad, dim, lr, eps, weight_decay)\n\n"
    "RowWiseAdagrad's update of the unique `rows` of `weight` ([num_rows * dim] float32) and `acc`\n"
    "([num_rows]) from their gradient `grad` ([len(rows) * dim]): g = grad + weight_decay * w,\n"
    "acc += mean(g * g), w -= lr * g / (sqrt(acc) + eps).";

static PyObject *rowwise_adagrad(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[4];
    Py_ssize_t dim;
    float lr, eps, wd;
    if (!PyArg_ParseTuple(args, "OOOOnfff:rowwise_adagrad", &o[0], &o[1], &o[2], &o[3], &dim, &lr, &eps, &wd))
        return NULL;
    static const char *const names[] = {"weight", "acc", "rows", "grad"};
    Array a[4];
    Py_ssize_t n;
    if (take_update(o, names, 1, 1, dim, a, &n) < 0) return NULL;
    float *w = a[0].data, *acc = a[1].data;
    const int64_t *rows = a[2].data;
    const float *grad = a[3].data;
    Py_BEGIN_ALLOW_THREADS
    float neg_lr = -lr;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            prefetch(w + rows[i + AHEAD] * dim);
            prefetch(acc + rows[i + AHEAD]);
        }
        float *wr = w + rows[i] * dim;
        const float *gr = grad + i * dim;
        /* g is formed twice (for its mean square, then for the step) rather than kept: a row of any
         * width, no buffer. */
        float sum = 0.0f;
        for (Py_ssize_t j = 0; j < dim; j++) {
            float g = wd != 0.0f ? gr[j] + wd * wr[j] : gr[j];
            sum += g * g;
        }
        float a_r = acc[rows[i]] + sum / (float)dim;
        acc[rows[i]] = a_r;
        float std = sqrtf(a_r) + eps;
        for (Py_ssize_t j = 0; j < dim; j++) {
            float g = wd != 0.0f ? gr[j] + wd * wr[j] : gr[j];
            wr[j] += (g / std) * neg_lr;
        }
    }
    Py_END_ALLOW_THREADS
    return updated(a, 4);
}

static const char ftrl_doc[] =
    "ftrl(weight, accumulator, linear, rows, grad, dim, lr, l1, l2)\n\n"
    "FTRL-proximal's update (lr_power -0.5) of the unique `rows` of `weight`, `accumulator` (n) and\n"
    "`linear` (z), each [num_rows * dim] float32, from their gradient `grad` ([len(rows) * dim]):\n"
    "n' = n + g*g, z += g - (sqrt(n') - sqrt(n)) / lr * w, w = |z| > l1 ? (sign(z) l1 - z) /\n"
    "(sqrt(n') / lr + l2) : 0.";

static PyObject *ftrl(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[5];
    Py_ssize_t dim;
    float lr, l1, l2;
    if (!PyArg_ParseTuple(args, "OOOOOnfff:ftrl", &o[0], &o[1], &o[2], &o[3], &o[4], &dim, &lr, &l1, &l2))
        return NULL;
    static const char *const names[] = {"weight", "accumulator", "linear", "rows", "grad"};
    if (!(lr > 0.0f)) {
        PyErr_Format(PyExc_ValueError, "lr must be > 0, got %g", (double)lr);
        return NULL;
    }
    Array a[5];
    Py_ssize_t n;
    if (take_update(o, names, 2, -1, dim, a, &n) < 0) return NULL;
    float *w = a[0].data, *acc = a[1].data, *lin = a[2].data;
    const int64_t *rows = a[3].data;
    const float *grad = a[4].data;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            Py_ssize_t ahead = rows[i + AHEAD] * dim;
            prefetch(w + ahead);
            prefetch(acc + ahead);
            prefetch(lin + ahead);
        }
        Py_ssize_t base = rows[i] * dim;
        for (Py_ssize_t j = 0; j < dim; j++) {
            float g = grad[i * dim + j], old_n = acc[base + j], wj = w[base + j];
            float new_n = old_n + g * g;
            float root = sqrtf(new_n);
            float sigma = (root - sqrtf(old_n)) / lr;
            float z = (lin[base + j] + g) - sigma * wj;
            lin[base + j] = z;
            acc[base + j] = new_n;
            float quadratic = root / lr + l2;
            float sign = (float)((z > 0.0f) - (z < 0.0f));
            w[base + j] = fabsf(z) > l1 ? (sign * l1 - z) / quadratic : 0.0f;
        }
    }
    Py_END_ALLOW_THREADS
    return updated(a, 5);
}

static PyMethodDef methods[] = {
    {"lazy_adam", lazy_adam, METH_VARARGS, lazy_adam_doc},
    {"rowwise_adagrad", rowwise_adagrad, METH_VARARGS, rowwise_adagrad_doc},
    {"ftrl", ftrl, METH_VARARGS, ftrl_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_row_kernels",
    "Compiled CPU kernels of recstream.optim's row-sparse updates (see the comment atop _row_kernels.c).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__row_kernels(void) { return PyModule_Create(&module); }
