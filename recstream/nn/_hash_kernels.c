/*
 * Compiled CPU kernels of recstream.nn's hash tables: TensorHashTable's lookup and insert of
 * int64 keys, HashEmbedding's admission of a step's keys (admit), and the least-recently-seen
 * selection of its eviction (oldest, for lru_select.oldest).
 *
 * Why C and not torch ops: on a CPU a batched lookup in torch costs ~80 ops over every key
 * (hash, a window of probes, a compaction per round, winner selection for contested slots);
 * a full HashEmbedding spent most of its forward there. One pass per key, with the next keys'
 * first probe prefetched, does the same work with one random memory access per probe. No
 * library offers an open-addressing table over caller-owned arrays with this probe sequence
 * and tombstone rule (the layout must stay the one the torch ops of TensorHashTable read and
 * write, on CPU and CUDA alike), so it is written here. Likewise the admission (ten torch ops
 * over the keys after the lookup become one pass) and the LRU select (a dozen torch ops, each a
 * pass over every row -- ~30 ms per eviction for 2.6M rows -- become two or three passes). Each kernel
 * leaves exactly the state its torch ops leave; recstream/nn/native.py says whether this module
 * was built, and the torch ops run where it was not (and on CUDA).
 *
 * Table layout (owned by TensorHashTable): keys[num_slots] (int64, EMPTY = -1, DELETED = -2),
 * num_slots a power of two, triangular probing h, h+1, h+3, h+6, ... from
 * h = hash_keys(key) & (num_slots - 1), at most max_rounds probes per key. The payload arrays
 * rows / counts / last_seen are reset here for inserted keys, as TensorHashTable._reset_payload
 * does.
 *
 * Arguments are C-contiguous int64 buffers (numpy views of CPU tensors, no copy; HashEmbedding's
 * dirty flags a byte buffer); every index read from the caller is bounds-checked before anything
 * is written, so a wrong argument raises instead of writing out of bounds or half a result. The
 * GIL is released while a kernel runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define EMPTY (-1)
#define DELETED (-2)
#define M32 0xFFFFFFFFull
/* Keys ahead whose first probe slot is prefetched: enough misses in flight to cover DRAM latency. */
#define AHEAD 16

/* hash_keys of tensor_hash_table.py, bit for bit (unsigned arithmetic: the products stay < 2**63). */
static inline uint64_t hash_key(int64_t key) {
    uint64_t u = (uint64_t)key;
    uint64_t lo = u & M32, hi = (u >> 32) & M32;
    uint64_t h = lo ^ ((hi * 0x5BD1E995ull) & M32);
    h = ((h ^ (h >> 16)) * 0x27D4EB2Full) & M32;
    h = ((h ^ (h >> 13)) * 0x165667B1ull) & M32;
    return h ^ (h >> 16);
}

static inline void prefetch(const int64_t *p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p);
#else
    (void)p;
#endif
}

static inline int is_free(int64_t cur) { return cur == EMPTY || cur == DELETED; }

typedef struct {
    Py_buffer view;
    int64_t *data;
    Py_ssize_t n;
} Array;

/* An int64 buffer argument: C-contiguous, a whole number of int64s. */
static int get_array(PyObject *obj, Array *a, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &a->view, flags) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s int64 buffer", name,
                     writable ? " writable" : "");
        return -1;
    }
    if (a->view.len % 8 != 0) {
        PyBuffer_Release(&a->view);
        PyErr_Format(PyExc_ValueError, "%s: buffer length %zd is not a multiple of 8", name, a->view.len);
        return -1;
    }
    a->data = (int64_t *)a->view.buf;
    a->n = a->view.len / 8;
    return 0;
}

/* The int64 buffer arguments objs[0..n) into a[0..n); held[k] (zeroed by the caller) marks each one
 * taken, for release_arrays. An argument marked in `optional` may be None: a[k] is then empty (data
 * NULL, n 0). Returns -1 with the error set. */
static int get_arrays(PyObject *const *objs, const char *const *names, const int *writable, const int *optional,
                      int n, Array *a, int *held) {
    for (int k = 0; k < n; k++) {
        a[k].data = NULL;
        a[k].n = 0;
        if (optional[k] && objs[k] == Py_None) continue;
        if (get_array(objs[k], &a[k], writable[k], names[k]) < 0) return -1;
        held[k] = 1;
    }
    return 0;
}

static void release_arrays(Array *a, const int *held, int n) {
    for (int k = 0; k < n; k++)
        if (held[k]) PyBuffer_Release(&a[k].view);
}

/* Probe for `key`: its slot, or -1 when absent; *free_slot gets the first EMPTY or DELETED slot
 * of its probe sequence (-1 if none). Returns 0, or -1 when no hit and no EMPTY slot came within
 * max_rounds probes. */
static inline int probe(const int64_t *table, uint64_t mask, int64_t max_rounds, int64_t key,
                        int64_t *slot, int64_t *free_slot) {
    uint64_t pos = hash_key(key) & mask;
    *free_slot = -1;
    for (int64_t r = 0; r < max_rounds; r++) {
        int64_t cur = table[pos];
        if (cur == key) {
            *slot = (int64_t)pos;
            return 0;
        }
        if (is_free(cur)) {
            if (*free_slot < 0) *free_slot = (int64_t)pos;
            if (cur == EMPTY) {
                *slot = -1;
                return 0;
            }
        }
        pos = (pos + (uint64_t)r + 1) & mask; /* offsets r(r+1)/2: add r+1 to go from probe r to r+1 */
    }
    return -1;
}

static int check_table(const Array *table) {
    uint64_t n = (uint64_t)table->n;
    if (n == 0 || (n & (n - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "table_keys: length must be a power of two, got %zd", table->n);
        return -1;
    }
    return 0;
}

static int check_same_length(const Array *a, const char *name, Py_ssize_t n) {
    if (a->n != n) {
        PyErr_Format(PyExc_ValueError, "%s: length %zd, expected %zd", name, a->n, n);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(locate_doc,
"locate(table_keys, keys, slots, free, max_rounds) -> int\n\n"
"Slot of each key in slots (-1 if absent) and, if free is not None, each absent key's first\n"
"free slot (EMPTY or DELETED) in free (-1 for present keys). Returns the number of absent keys.\n"
"RuntimeError when a key's probe meets neither it nor an EMPTY slot within max_rounds.");

static PyObject *locate(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[4];
    Py_ssize_t max_rounds;
    if (!PyArg_ParseTuple(args, "OOOOn", &o[0], &o[1], &o[2], &o[3], &max_rounds)) return NULL;
    static const char *names[4] = {"table_keys", "keys", "slots", "free"};
    static const int writable[4] = {0, 0, 1, 1}, optional[4] = {0, 0, 0, 1};
    Array a[4];
    int held[4] = {0}, want_free = o[3] != Py_None;
    if (get_arrays(o, names, writable, optional, 4, a, held) < 0) goto fail;
    if (check_table(&a[0]) < 0 || check_same_length(&a[2], "slots", a[1].n) < 0
        || (want_free && check_same_length(&a[3], "free", a[1].n) < 0)) goto fail;

    const int64_t *table = a[0].data, *keys = a[1].data;
    int64_t *slots = a[2].data, *free_out = want_free ? a[3].data : NULL;
    uint64_t mask = (uint64_t)a[0].n - 1;
    Py_ssize_t n = a[1].n, absent = 0, bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) prefetch(table + (hash_key(keys[i + AHEAD]) & mask));
        int64_t slot, free_slot;
        if (probe(table, mask, max_rounds, keys[i], &slot, &free_slot) < 0) {
            bad = i;
            break;
        }
        slots[i] = slot;
        if (free_out) free_out[i] = slot >= 0 ? -1 : free_slot;
        absent += slot < 0;
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_RuntimeError, "hash table probe exceeded max_rounds=%zd (key %lld)", max_rounds,
                     (long long)keys[bad]);
        goto fail;
    }
    release_arrays(a, held, 4);
    return PyLong_FromSsize_t(absent);
fail:
    release_arrays(a, held, 4);
    return NULL;
}

/* Write `key` into free slot `s` and reset the slot's payload; returns 1 if s held a tombstone. */
static inline int take(int64_t *table, int64_t *rows, int64_t *counts, int64_t *last_seen, int64_t s,
                       int64_t key) {
    int reused = table[s] == DELETED;
    table[s] = key;
    rows[s] = -1;
    counts[s] = 0;
    last_seen[s] = 0;
    return reused;
}


/* Slot of probe number r of a key whose probe sequence starts at `start`. */
static inline uint64_t probe_slot(uint64_t start, int64_t r, uint64_t mask) {
    return (start + (uint64_t)r * (uint64_t)(r + 1) / 2) & mask;
}

/* TensorHashTable.insert's torch ops, round for round, so that both leave the same layout: each
 * round every unplaced key looks at `width` probes from its next one, in the table as the round
 * found it, and wants the first free slot there; of the keys wanting one slot the first in order
 * takes it; losers go on past the slot they lost, keys that saw no free slot past the window.
 * `idx` lists the keys to place (ascending); `next_probe` and `want` are scratch of the same length.
 * Returns the index of a key that ran out of probes (max_rounds), or -1. */
static Py_ssize_t insert_rounds(int64_t *table, int64_t *rows, int64_t *counts, int64_t *last_seen, uint64_t mask,
                                int64_t max_rounds, int64_t width, const int64_t *keys, int64_t *out,
                                int64_t *idx, Py_ssize_t pending, int64_t *next_probe, int64_t *want,
                                Py_ssize_t *reused) {
    for (Py_ssize_t j = 0; j < pending; j++) next_probe[j] = 0;
    while (pending > 0) {
        for (Py_ssize_t j = 0; j < pending; j++) { /* wants, against the table as the round found it */
            if (j + AHEAD < pending) prefetch(table + probe_slot(hash_key(keys[idx[j + AHEAD]]) & mask,
                                                                 next_probe[j + AHEAD], mask));
            uint64_t start = hash_key(keys[idx[j]]) & mask;
            int64_t d = 0;
            want[j] = -1;
            for (; d < width && next_probe[j] + d < max_rounds; d++) {
                uint64_t pos = probe_slot(start, next_probe[j] + d, mask);
                if (is_free(table[pos])) {
                    want[j] = (int64_t)pos;
                    break;
                }
            }
            next_probe[j] += want[j] >= 0 ? d + 1 : width; /* where a loser goes on from */
        }
        Py_ssize_t kept = 0;
        for (Py_ssize_t j = 0; j < pending; j++) { /* claims, in call order */
            int64_t s = want[j];
            if (s >= 0 && is_free(table[s])) {
                *reused += take(table, rows, counts, last_seen, s, keys[idx[j]]);
                out[idx[j]] = s;
                continue;
            }
            if (next_probe[j] >= max_rounds) return idx[j];
            idx[kept] = idx[j];
            next_probe[kept] = next_probe[j];
            kept++;
        }
        pending = kept;
    }
    return -1;
}

/* Insert unique absent keys[0..n): with free_in, each first claims its free slot (the first in order
 * wins a slot several claim), the rest -- every key without free_in -- go through insert_rounds.
 * Slots to out, payload reset. free_in must hold valid slots. scratch: 3n int64. Returns the index
 * of a key that ran out of probes, or -1. */
static Py_ssize_t place(int64_t *table, int64_t *rows, int64_t *counts, int64_t *last_seen, uint64_t mask,
                        int64_t max_rounds, int64_t probe_window, int64_t wide_max, const int64_t *keys,
                        const int64_t *free_in, int64_t *out, Py_ssize_t n, int64_t *scratch, Py_ssize_t *reused) {
    int64_t *idx = scratch, *probe_at = scratch + n, *want = scratch + 2 * n;
    Py_ssize_t pending = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = -1;
        if (free_in && is_free(table[free_in[i]])) { /* claims in call order */
            *reused += take(table, rows, counts, last_seen, free_in[i], keys[i]);
            out[i] = free_in[i];
            continue;
        }
        idx[pending++] = i;
    }
    if (pending == 0) return -1;
    int64_t width = pending <= wide_max ? probe_window : 1;
    if (width > max_rounds) width = max_rounds;
    return insert_rounds(table, rows, counts, last_seen, mask, max_rounds, width, keys, out, idx, pending, probe_at,
                         want, reused);
}

PyDoc_STRVAR(insert_doc,
"insert(table_keys, rows, counts, last_seen, keys, free, out, max_rounds, probe_window, wide_window_max_keys)\n"
"-> int\n\n"
"Insert unique keys that are not in the table; their slots go to out. With free (locate's free\n"
"slots of these keys) each key first claims its free slot -- of several claiming one, the first\n"
"in order takes it -- and the others, like every key when free is None, are placed in the rounds\n"
"of TensorHashTable.insert (probe_window probes per round when at most wide_window_max_keys keys\n"
"are placed, else one). Payload of the new slots is reset (row -1, count 0, last seen 0).\n"
"Returns the number of tombstones reused.");

static PyObject *insert(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[7];
    Py_ssize_t max_rounds, probe_window, wide_max;
    if (!PyArg_ParseTuple(args, "OOOOOOOnnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &max_rounds,
                          &probe_window, &wide_max))
        return NULL;
    if (max_rounds < 1 || probe_window < 1) {
        PyErr_Format(PyExc_ValueError, "max_rounds and probe_window must be >= 1, got %zd and %zd", max_rounds,
                     probe_window);
        return NULL;
    }
    static const char *names[7] = {"table_keys", "rows", "counts", "last_seen", "keys", "free", "out"};
    static const int writable[7] = {1, 1, 1, 1, 0, 0, 1}, optional[7] = {0, 0, 0, 0, 0, 1, 0};
    Array a[7];
    int held[7] = {0}, have_free = o[5] != Py_None;
    int64_t *scratch = NULL;
    PyObject *result = NULL;
    if (get_arrays(o, names, writable, optional, 7, a, held) < 0) goto done;
    if (check_table(&a[0]) < 0) goto done;
    for (int k = 1; k < 4; k++)
        if (check_same_length(&a[k], names[k], a[0].n) < 0) goto done;
    if (check_same_length(&a[6], "out", a[4].n) < 0 || (have_free && check_same_length(&a[5], "free", a[4].n) < 0))
        goto done;

    int64_t *table = a[0].data, *rows = a[1].data, *counts = a[2].data, *last_seen = a[3].data, *out = a[6].data;
    const int64_t *keys = a[4].data, *free_in = have_free ? a[5].data : NULL;
    uint64_t mask = (uint64_t)a[0].n - 1;
    Py_ssize_t n = a[4].n, reused = 0, bad_free = -1, full = -1;
    scratch = PyMem_Malloc(sizeof(int64_t) * 3 * (size_t)(n > 0 ? n : 1));
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; free_in && i < n; i++) { /* every slot checked before anything is written */
        if (free_in[i] < 0 || (uint64_t)free_in[i] > mask) {
            bad_free = i;
            break;
        }
    }
    if (bad_free < 0)
        full = place(table, rows, counts, last_seen, mask, max_rounds, probe_window, wide_max, keys, free_in, out, n,
                     scratch, &reused);
    Py_END_ALLOW_THREADS
    if (bad_free >= 0) {
        PyErr_Format(PyExc_ValueError, "free[%zd]=%lld is not a slot of a table of %zd slots", bad_free,
                     (long long)free_in[bad_free], a[0].n);
    } else if (full >= 0) {
        PyErr_Format(PyExc_RuntimeError, "hash table insert exceeded max_rounds=%zd (key %lld)", max_rounds,
                     (long long)keys[full]);
    } else {
        result = PyLong_FromSsize_t(reused);
    }
done:
    PyMem_Free(scratch);
    release_arrays(a, held, 7);
    return result;
}

PyDoc_STRVAR(admit_doc,
"admit(table_keys, table_rows, counts, last_seen, row_slots, row_last_seen, dirty, free_rows, num_free,\n"
"      keys, occurrences, slots, free, step, max_rounds, probe_window, wide_window_max_keys,\n"
"      rows_out, new_rows_out) -> int\n\n"
"HashEmbedding's admission of a step's unique keys when every new key gets a row at once (no\n"
"eviction, no rehash): the absent keys (slots[i] == -1, free slots from locate) are inserted as\n"
"insert() would with free; new key j takes row free_rows[num_free - 1 - j] (the top of the free\n"
"stack first) and its slot goes to slots; then every key is counted (counts += occurrences),\n"
"seen (last_seen, and its row's row_last_seen, = step), its row marked dirty and written to\n"
"rows_out; the new rows to new_rows_out (its length: the number of new keys). Arguments are\n"
"checked before anything is written. Returns the number of tombstones reused.");

/* A writable C-contiguous byte buffer (a bool tensor's numpy view). */
static int get_bytes(PyObject *obj, Py_buffer *view, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous writable byte buffer", name);
        return -1;
    }
    return 0;
}

static PyObject *admit(PyObject *self, PyObject *args) {
    (void)self;
    enum { TK, TR, CNT, LS, RS, RLS, FREE_ROWS, KEYS, OCC, SLOTS, FREE, ROWS_OUT, NEW_OUT, N_ARRAYS };
    static const char *names[N_ARRAYS] = {"table_keys", "table_rows", "counts", "last_seen", "row_slots",
                                          "row_last_seen", "free_rows", "keys", "occurrences", "slots", "free",
                                          "rows_out", "new_rows_out"};
    static const int writable[N_ARRAYS] = {1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 1, 1}, optional[N_ARRAYS] = {0};
    PyObject *o[N_ARRAYS], *o_dirty;
    Py_ssize_t num_free, max_rounds, probe_window, wide_max;
    long long step;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnOOOOLnnnOO", &o[TK], &o[TR], &o[CNT], &o[LS], &o[RS], &o[RLS], &o_dirty,
                          &o[FREE_ROWS], &num_free, &o[KEYS], &o[OCC], &o[SLOTS], &o[FREE], &step, &max_rounds,
                          &probe_window, &wide_max, &o[ROWS_OUT], &o[NEW_OUT]))
        return NULL;
    Array a[N_ARRAYS];
    Py_buffer dirty_view;
    int held[N_ARRAYS] = {0}, dirty_held = 0;
    int64_t *scratch = NULL;
    PyObject *result = NULL;
    if (get_arrays(o, names, writable, optional, N_ARRAYS, a, held) < 0) goto done;
    if (get_bytes(o_dirty, &dirty_view, "dirty") < 0) goto done;
    dirty_held = 1;
    Py_ssize_t num_slots = a[TK].n, capacity = a[RS].n, n = a[KEYS].n, n_new = a[NEW_OUT].n;
    if (check_table(&a[TK]) < 0) goto done;
    for (int k = TR; k <= LS; k++)
        if (check_same_length(&a[k], names[k], num_slots) < 0) goto done;
    for (int k = RLS; k <= FREE_ROWS; k++)
        if (check_same_length(&a[k], names[k], capacity) < 0) goto done;
    for (int k = OCC; k <= ROWS_OUT; k++)
        if (check_same_length(&a[k], names[k], n) < 0) goto done;
    if (dirty_view.len != capacity || max_rounds < 1 || probe_window < 1 || num_free < n_new || num_free > capacity) {
        PyErr_Format(PyExc_ValueError, "admit: dirty has %zd bytes for %zd rows; max_rounds %zd, probe_window %zd "
                     "(>= 1); %zd new keys, %zd free rows", dirty_view.len, capacity, max_rounds, probe_window,
                     n_new, num_free);
        goto done;
    }
    int64_t *table = a[TK].data, *rows = a[TR].data, *counts = a[CNT].data, *last_seen = a[LS].data;
    int64_t *row_slots = a[RS].data, *row_last_seen = a[RLS].data, *slots = a[SLOTS].data;
    int64_t *rows_out = a[ROWS_OUT].data, *new_out = a[NEW_OUT].data;
    const int64_t *free_rows = a[FREE_ROWS].data, *keys = a[KEYS].data, *occ = a[OCC].data, *free_in = a[FREE].data;
    uint8_t *dirty = dirty_view.buf;
    uint64_t mask = (uint64_t)num_slots - 1;
    scratch = PyMem_Malloc(sizeof(int64_t) * 7 * (size_t)(n_new > 0 ? n_new : 1));
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *new_idx = scratch, *new_keys = scratch + n_new, *new_free = scratch + 2 * n_new;
    int64_t *new_slots = scratch + 3 * n_new, *place_scratch = scratch + 4 * n_new;
    Py_ssize_t bad = -1, absent = 0, full = -1, bad_row = -1, reused = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && bad < 0; i++) { /* everything checked before anything is written */
        if (slots[i] < -1 || slots[i] >= num_slots) bad = i;
        else if (slots[i] == -1 && (free_in[i] < 0 || free_in[i] >= num_slots)) bad = i;
        else if (slots[i] == -1 && absent < n_new) {
            new_idx[absent] = i;
            new_keys[absent] = keys[i];
            new_free[absent++] = free_in[i];
        } else if (slots[i] == -1) absent++;
    }
    for (Py_ssize_t j = 0; bad < 0 && absent == n_new && j < n_new; j++)
        if (free_rows[num_free - 1 - j] < 0 || free_rows[num_free - 1 - j] >= capacity) bad_row = j;
    if (bad < 0 && bad_row < 0 && absent == n_new) {
        full = place(table, rows, counts, last_seen, mask, max_rounds, probe_window, wide_max, new_keys, new_free,
                     new_slots, n_new, place_scratch, &reused);
    }
    if (bad < 0 && bad_row < 0 && absent == n_new && full < 0) {
        for (Py_ssize_t j = 0; j < n_new; j++) { /* the new keys' rows, top of the free stack first */
            int64_t s = new_slots[j], r = free_rows[num_free - 1 - j];
            rows[s] = r;
            row_slots[r] = s;
            slots[new_idx[j]] = s;
            new_out[j] = r;
        }
        for (Py_ssize_t i = 0; i < n; i++) { /* every key: counted, seen, its row dirty */
            if (i + AHEAD < n) {
                int64_t ahead = slots[i + AHEAD];
                prefetch(rows + ahead);
                prefetch(counts + ahead);
                prefetch(last_seen + ahead);
            }
            int64_t s = slots[i], r = rows[s];
            if (r < 0 || r >= capacity) {
                bad_row = n_new + i; /* a found key without a row: a table admit() can not serve */
                break;
            }
            counts[s] += occ[i];
            last_seen[s] = step;
            rows_out[i] = r;
            dirty[r] = 1;
            row_last_seen[r] = step;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0)
        PyErr_Format(PyExc_ValueError, "admit: slots[%zd]=%lld / free[%zd]=%lld is not a slot of a table of %zd slots",
                     bad, (long long)slots[bad], bad, (long long)free_in[bad], num_slots);
    else if (absent != n_new)
        PyErr_Format(PyExc_ValueError, "admit: %zd keys are absent, new_rows_out has room for %zd", absent, n_new);
    else if (full >= 0)
        PyErr_Format(PyExc_RuntimeError, "hash table insert exceeded max_rounds=%zd (key %lld)", max_rounds,
                     (long long)new_keys[full]);
    else if (bad_row >= 0 && bad_row < n_new)
        PyErr_Format(PyExc_ValueError, "admit: free_rows[%zd] is not a row of %zd", num_free - 1 - bad_row, capacity);
    else if (bad_row >= 0)
        PyErr_Format(PyExc_RuntimeError, "admit: key %lld's slot holds no row (pending keys need the general path)",
                     (long long)keys[bad_row - n_new]);
    else
        result = PyLong_FromSsize_t(reused);
done:
    PyMem_Free(scratch);
    if (dirty_held) PyBuffer_Release(&dirty_view);
    release_arrays(a, held, N_ARRAYS);
    return result;
}

/* Number of bits of x (0 for 0): Python's int.bit_length. */
static inline int bit_length(uint64_t x) {
    int n = 0;
    while (x) {
        n++;
        x >>= 1;
    }
    return n;
}

typedef struct {
    int64_t age, index;
} Aged;

static int by_age_then_index(const void *a, const void *b) {
    const Aged *x = a, *y = b;
    if (x->age != y->age) return x->age < y->age ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

PyDoc_STRVAR(oldest_doc,
"oldest(last_seen, rows, step, k, bucket_bits, out) -> int\n\n"
"recstream.nn.lru_select.oldest's histogram select in two passes (three for a span of ages\n"
"over 2**bucket_bits steps): the indices of the k\n"
"candidates (last_seen < step, and rows < 0 where rows is not None) seen longest ago go to out\n"
"(length >= k): every candidate of an older bucket, in index order, then the oldest (buckets of\n"
"several steps) or evenly spread (buckets of one step) part of the bucket holding the k-th.\n"
"Returns how many were written: min(k, candidates).");

static PyObject *oldest(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[3];
    long long step_ll, k_ll;
    int bits;
    if (!PyArg_ParseTuple(args, "OOLLiO", &o[0], &o[1], &step_ll, &k_ll, &bits, &o[2])) return NULL;
    if (bits < 1 || bits > 24) {
        PyErr_Format(PyExc_ValueError, "bucket_bits must be in [1, 24], got %d", bits);
        return NULL;
    }
    static const char *names[3] = {"last_seen", "rows", "out"};
    static const int writable[3] = {0, 0, 1}, optional[3] = {0, 1, 0};
    Array a[3];
    int held[3] = {0};
    PyObject *result = NULL;
    int64_t *hist = NULL;
    Aged *edge = NULL;
    if (get_arrays(o, names, writable, optional, 3, a, held) < 0) goto done;
    if (held[1] && check_same_length(&a[1], "rows", a[0].n) < 0) goto done;
    if (k_ll > a[2].n) {
        PyErr_Format(PyExc_ValueError, "out: length %zd, expected at least k=%lld", a[2].n, k_ll);
        goto done;
    }
    const int64_t *ls = a[0].data, *rows = held[1] ? a[1].data : NULL, step = step_ll;
    int64_t *out = a[2].data, k = k_ll;
    Py_ssize_t n = a[0].n, n_cand = 0, written = 0;
    int64_t lo = INT64_MAX;
#define CANDIDATE(i) (ls[i] < step && (rows == NULL || rows[i] < 0))
    Py_ssize_t buckets = (Py_ssize_t)1 << bits;
    hist = PyMem_Calloc((size_t)buckets, sizeof(int64_t));
    if (hist == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* One pass for the count, the oldest step and -- by age, step - 1 - last_seen -- the histogram
     * of the candidates seen in the last `buckets` steps: when they span no more (the usual case)
     * that is the histogram the select needs, reversed, and the second pass is spared. */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        if (CANDIDATE(i)) {
            n_cand++;
            if (ls[i] < lo) lo = ls[i];
            uint64_t age = (uint64_t)step - 1 - (uint64_t)ls[i];
            if (age < (uint64_t)buckets) hist[age]++;
        }
    Py_END_ALLOW_THREADS
    if (k <= 0 || n_cand == 0) {
        result = PyLong_FromLong(0);
        goto done;
    }
    if (k >= n_cand) { /* every candidate */
        for (Py_ssize_t i = 0; i < n; i++)
            if (CANDIDATE(i)) out[written++] = i;
        result = PyLong_FromSsize_t(written);
        goto done;
    }
    /* Power-of-two bucket width (see lru_select.oldest); span >= 1 as lo < step. */
    uint64_t span = (uint64_t)step - (uint64_t)lo;
    int shift = bit_length(span - 1) - bits;
    if (shift <= 0) { /* bucket of last_seen = lo + b is age span - 1 - b: reverse ages [0, span) */
        shift = 0;
        for (Py_ssize_t b = 0, c = (Py_ssize_t)span - 1; b < c; b++, c--) {
            int64_t x = hist[b];
            hist[b] = hist[c];
            hist[c] = x;
        }
    } else {
        memset(hist, 0, sizeof(int64_t) * (size_t)buckets);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            if (CANDIDATE(i)) hist[((uint64_t)ls[i] - (uint64_t)lo) >> shift]++;
        Py_END_ALLOW_THREADS
    }
    Py_ssize_t t = 0, older = 0;
    while (older + hist[t] < k) older += hist[t++]; /* t: the first bucket reaching k */
    Py_ssize_t n_edge = hist[t], m = k - older, e = 0;
    edge = PyMem_Malloc(sizeof(Aged) * (size_t)n_edge);
    if (edge == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!CANDIDATE(i)) continue;
        Py_ssize_t b = (Py_ssize_t)(((uint64_t)ls[i] - (uint64_t)lo) >> shift);
        if (b < t) {
            out[written++] = i;
        } else if (b == t) {
            edge[e].age = ls[i];
            edge[e++].index = i;
        }
    }
    if (shift) { /* the edge bucket spans several steps: its oldest, ties in index order */
        qsort(edge, (size_t)n_edge, sizeof(Aged), by_age_then_index);
        for (Py_ssize_t j = 0; j < m; j++) out[written++] = edge[j].index;
    } else { /* one age: m of its entries evenly spread */
        for (Py_ssize_t j = 0; j < m; j++) out[written++] = edge[j * n_edge / m].index;
    }
    Py_END_ALLOW_THREADS
#undef CANDIDATE
    result = PyLong_FromSsize_t(written);
done:
    PyMem_Free(hist);
    PyMem_Free(edge);
    release_arrays(a, held, 3);
    return result;
}

static PyMethodDef methods[] = {
    {"locate", locate, METH_VARARGS, locate_doc},
    {"insert", insert, METH_VARARGS, insert_doc},
    {"admit", admit, METH_VARARGS, admit_doc},
    {"oldest", oldest, METH_VARARGS, oldest_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hash_kernels",
    "Compiled CPU kernels of recstream.nn's hash tables (see the comment atop _hash_kernels.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hash_kernels(void) { return PyModule_Create(&module); }
