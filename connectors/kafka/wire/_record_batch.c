/*
 * Kafka record batches (magic 2) built straight from Arrow buffers: the transactional
 * sink's wire path (docs/design.md, "Record batches on the wire").
 *
 * connectors/kafka/wire/producer.py calls encode() once per chunk of a task's rows. Without this
 * module (no C compiler at install time, not CPython) the sink hands its rows to librdkafka
 * instead (connectors/kafka/sink/batch_produce.py).
 *
 * The layout is Kafka's (org.apache.kafka.common.record.DefaultRecordBatch and
 * DefaultRecord): a 61-byte batch header, then per record a varint length, attributes 0, a
 * timestamp delta 0, its offset delta, the key and value (length -1: null) and no headers.
 * The CRC is CRC-32C over everything after the CRC field.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BATCH_HEADER 61
#define ATTR_TRANSACTIONAL 0x10

/* CRC-32C: SSE4.2 where the CPU has it, else a table. */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[i] = c;
    }
}

static uint32_t crc_soft(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc_hard(const uint8_t *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}
static int have_sse42(void) { return __builtin_cpu_supports("sse4.2"); }
#else
static uint32_t crc_hard(const uint8_t *p, size_t n) { return crc_soft(p, n); }
static int have_sse42(void) { return 0; }
#endif

static uint32_t (*crc32c)(const uint8_t *, size_t) = crc_soft;

static inline int varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *put_varint(uint8_t *o, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z >= 0x80) {
        *o++ = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    *o++ = (uint8_t)z;
    return o;
}

static inline void be16(uint8_t *o, uint16_t v) { o[0] = v >> 8; o[1] = (uint8_t)v; }
static inline void be32(uint8_t *o, uint32_t v) {
    o[0] = v >> 24; o[1] = (uint8_t)(v >> 16); o[2] = (uint8_t)(v >> 8); o[3] = (uint8_t)v;
}
static inline void be64(uint8_t *o, uint64_t v) { be32(o, (uint32_t)(v >> 32)); be32(o + 4, (uint32_t)v); }

/* One Arrow binary or large_binary array (offsets, data, validity, offset). */
typedef struct {
    Py_buffer offsets, data, validity;
    int has, has_validity, large;
    Py_ssize_t offset;
} column_t;

static int column_open(column_t *c, PyObject *spec) {
    /* spec: None, or (offsets, data, validity or None, offset, large) */
    memset(c, 0, sizeof(*c));
    if (spec == Py_None) return 0;
    PyObject *offs, *data, *valid;
    if (!PyArg_ParseTuple(spec, "OOOnp", &offs, &data, &valid, &c->offset, &c->large)) return -1;
    if (PyObject_GetBuffer(offs, &c->offsets, PyBUF_SIMPLE) < 0) return -1;
    if (data == Py_None) {
        /* an array of empty or null values may come without a data buffer */
        if (PyObject_GetBuffer(PyBytes_FromStringAndSize("", 0), &c->data, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&c->offsets);
            return -1;
        }
        Py_DECREF(c->data.obj); /* the buffer holds its own reference */
    } else if (PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&c->offsets);
        return -1;
    }
    if (valid != Py_None) {
        if (PyObject_GetBuffer(valid, &c->validity, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&c->offsets);
            PyBuffer_Release(&c->data);
            return -1;
        }
        c->has_validity = 1;
    }
    c->has = 1;
    return 0;
}

static void column_close(column_t *c) {
    if (!c->has) return;
    PyBuffer_Release(&c->offsets);
    PyBuffer_Release(&c->data);
    if (c->has_validity) PyBuffer_Release(&c->validity);
}

/* Row r's bytes: length (-1 for null) and start. */
static inline int64_t column_get(const column_t *c, int64_t r, const uint8_t **start) {
    if (!c->has) return -1;
    int64_t i = r + c->offset;
    if (c->has_validity && !((((const uint8_t *)c->validity.buf)[i >> 3] >> (i & 7)) & 1)) return -1;
    int64_t a, b;
    if (c->large) {
        a = ((const int64_t *)c->offsets.buf)[i];
        b = ((const int64_t *)c->offsets.buf)[i + 1];
    } else {
        a = ((const int32_t *)c->offsets.buf)[i];
        b = ((const int32_t *)c->offsets.buf)[i + 1];
    }
    *start = (const uint8_t *)c->data.buf + a;
    return b - a;
}

/* A record's size without its length prefix; hdr: the bytes of its one header after the
   header count (0: no header). */
static inline int64_t body_size(int64_t delta, int64_t klen, int64_t vlen, int64_t hdr) {
    return 1 + 1 + varint_size(delta) + varint_size(klen) + (klen > 0 ? klen : 0)
           + varint_size(vlen) + (vlen > 0 ? vlen : 0) + 1 + hdr;
}

/* The buffers hold n rows from c->offset on, and every row's bytes lie inside the data
   buffer: offsets ascend from 0 or more to at most the data buffer's length (a malformed or
   hostile Arrow array must fail here, not read past a buffer). */
static int check_bounds(const column_t *c, Py_ssize_t n, const char *what) {
    if (!c->has) return 0;
    Py_ssize_t width = c->large ? 8 : 4;
    if (c->offset < 0 || n < 0 || c->offsets.len < (c->offset + n + 1) * width
        || (c->has_validity && c->validity.len * 8 < c->offset + n)) {
        PyErr_Format(PyExc_ValueError, "%s: buffers shorter than %zd rows", what, n);
        return -1;
    }
    int64_t previous = -1, limit = (int64_t)c->data.len;
    for (Py_ssize_t i = c->offset; i <= c->offset + n; i++) {
        int64_t at = c->large ? ((const int64_t *)c->offsets.buf)[i]
                              : (int64_t)((const int32_t *)c->offsets.buf)[i];
        if (at < 0 || at > limit || at < previous) {
            PyErr_Format(PyExc_ValueError,
                         "%s: offset %lld of row %zd is outside the data buffer (%lld bytes) "
                         "or below the row before", what, (long long)at, i - c->offset,
                         (long long)limit);
            return -1;
        }
        previous = at;
    }
    return 0;
}

/*
 * encode(values, keys, length, rows, groups, first_seqs, timestamp, producer_id, epoch,
 *        transactional, max_batch_bytes, header_key, header_prefix, seq_base)
 *   -> (bytearray, bytes)
 *
 * header_key: None, or every record gets one header of that name whose value is
 * header_prefix followed by (seq_base + the row index) as 8 big-endian bytes (the
 * recovery key, connectors/kafka/sink/recovery.py).
 * values, keys: column specs (keys may be None); length: the arrays' row count;
 * rows: int64 row indices in produce order; groups: int64 boundaries into rows (one group per
 * target partition, n_groups + 1 entries); first_seqs: int32 base sequence of each group.
 * A group becomes one or more batches of at most max_batch_bytes (a single larger record is
 * a batch of its own). The second result holds int64 quadruples per batch: group, start and
 * end in the bytearray, record count.
 */
static PyObject *encode(PyObject *module, PyObject *args) {
    PyObject *vspec, *kspec, *rows_o, *groups_o, *seqs_o;
    Py_ssize_t length;
    long long ts, pid, max_batch, seq_base;
    int epoch, txn;
    const char *hk = NULL, *hp = NULL;
    Py_ssize_t hklen = 0, hplen = 0;
    if (!PyArg_ParseTuple(args, "OOnOOOLLiiLz#y#L", &vspec, &kspec, &length, &rows_o,
                          &groups_o, &seqs_o, &ts, &pid, &epoch, &txn, &max_batch, &hk, &hklen,
                          &hp, &hplen, &seq_base))
        return NULL;
    /* one header: name length, name, value length, prefix, 8-byte seq */
    int64_t hdr = hk ? varint_size(hklen) + hklen + varint_size(hplen + 8) + hplen + 8 : 0;
    column_t vals, keys;
    Py_buffer rb = {0}, gb = {0}, sb = {0};
    PyObject *out = NULL, *meta = NULL, *result = NULL;
    if (column_open(&vals, vspec) < 0) return NULL;
    if (!vals.has) {
        PyErr_SetString(PyExc_ValueError, "values: a column is required");
        return NULL;
    }
    if (column_open(&keys, kspec) < 0) goto done_vals;
    if (PyObject_GetBuffer(rows_o, &rb, PyBUF_SIMPLE) < 0) goto done_keys;
    if (PyObject_GetBuffer(groups_o, &gb, PyBUF_SIMPLE) < 0) goto done_rows;
    if (PyObject_GetBuffer(seqs_o, &sb, PyBUF_SIMPLE) < 0) goto done_groups;
    if (check_bounds(&vals, length, "values") < 0 || check_bounds(&keys, length, "keys") < 0)
        goto done;
    const int64_t *rows = rb.buf, *groups = gb.buf;
    const int32_t *seqs = sb.buf;
    Py_ssize_t n_rows = rb.len / 8, n_groups = gb.len / 8 - 1;
    int groups_ok = n_groups >= 0 && sb.len / 4 >= n_groups && groups[0] >= 0
                    && groups[n_groups] <= n_rows;
    for (Py_ssize_t g = 0; groups_ok && g < n_groups; g++) groups_ok = groups[g] <= groups[g + 1];
    if (!groups_ok) {
        PyErr_SetString(PyExc_ValueError, "groups, first_seqs and rows do not match");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_rows; i++) {
        if (rows[i] < 0 || rows[i] >= length) {
            PyErr_SetString(PyExc_ValueError, "a row index is out of range");
            goto done;
        }
    }
    /* Pass 1: sizes and batch count. */
    Py_ssize_t total = 0, n_batches = 0;
    for (Py_ssize_t g = 0; g < n_groups; g++) {
        int64_t size = 0, count = 0;
        for (int64_t i = groups[g]; i < groups[g + 1]; i++) {
            const uint8_t *p;
            int64_t kl = column_get(&keys, rows[i], &p), vl = column_get(&vals, rows[i], &p);
            int64_t body = body_size(count, kl, vl, hdr);
            int64_t rec = varint_size(body) + body;
            if (count && size + rec > max_batch) {
                total += size;
                n_batches++;
                size = 0;
                count = 0;
                body = body_size(0, kl, vl, hdr);
                rec = varint_size(body) + body;
            }
            if (!count) size = BATCH_HEADER;
            size += rec;
            count++;
        }
        if (count) {
            total += size;
            n_batches++;
        }
    }
    out = PyByteArray_FromStringAndSize(NULL, total);
    meta = PyBytes_FromStringAndSize(NULL, n_batches * 32);
    if (!out || !meta) goto done;
    uint8_t *base = (uint8_t *)PyByteArray_AS_STRING(out);
    int64_t *m = (int64_t *)PyBytes_AS_STRING(meta);
    Py_BEGIN_ALLOW_THREADS
    /* Pass 2: the bytes. */
    uint8_t *o = base;
    for (Py_ssize_t g = 0; g < n_groups; g++) {
        uint8_t *h = NULL;
        int64_t count = 0, seq = seqs[g];
        for (int64_t i = groups[g]; i <= groups[g + 1]; i++) {
            const uint8_t *kp = NULL, *vp = NULL;
            int64_t kl = 0, vl = 0, rec = 0;
            int last = i == groups[g + 1];
            if (!last) {
                kl = column_get(&keys, rows[i], &kp);
                vl = column_get(&vals, rows[i], &vp);
                int64_t body = body_size(count, kl, vl, hdr);
                rec = varint_size(body) + body;
            }
            if (h && (last || (o - h) + rec > max_batch)) {
                /* close the batch at h */
                int64_t size = o - h;
                be64(h, 0);
                be32(h + 8, (uint32_t)(size - 12));
                be32(h + 12, 0xFFFFFFFFu); /* partition leader epoch: the broker sets it */
                h[16] = 2;
                be16(h + 21, txn ? ATTR_TRANSACTIONAL : 0);
                be32(h + 23, (uint32_t)(count - 1));
                be64(h + 27, (uint64_t)ts);
                be64(h + 35, (uint64_t)ts);
                be64(h + 43, (uint64_t)pid);
                be16(h + 51, (uint16_t)epoch);
                be32(h + 53, (uint32_t)(seq % 2147483648LL)); /* sequences wrap at 2^31 */
                be32(h + 57, (uint32_t)count);
                be32(h + 17, crc32c(h + 21, (size_t)(size - 21)));
                m[0] = g;
                m[1] = h - base;
                m[2] = o - base;
                m[3] = count;
                m += 4;
                seq += count;
                h = NULL;
                count = 0;
                if (!last) {
                    int64_t body = body_size(0, kl, vl, hdr);
                    rec = varint_size(body) + body;
                }
            }
            if (last) break;
            if (!h) {
                h = o;
                o += BATCH_HEADER;
            }
            o = put_varint(o, body_size(count, kl, vl, hdr)); /* the record's length */
            *o++ = 0; /* attributes */
            *o++ = 0; /* timestamp delta */
            o = put_varint(o, count);
            o = put_varint(o, kl);
            if (kl > 0) {
                memcpy(o, kp, (size_t)kl);
                o += kl;
            }
            o = put_varint(o, vl);
            if (vl > 0) {
                memcpy(o, vp, (size_t)vl);
                o += vl;
            }
            if (hk) {
                *o++ = 2; /* one header (zigzag varint) */
                o = put_varint(o, hklen);
                memcpy(o, hk, (size_t)hklen);
                o += hklen;
                o = put_varint(o, hplen + 8);
                memcpy(o, hp, (size_t)hplen);
                o += hplen;
                be64(o, (uint64_t)(seq_base + rows[i]));
                o += 8;
            } else {
                *o++ = 0; /* no headers */
            }
            count++;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(OO)", out, meta);
done:
    PyBuffer_Release(&sb);
done_groups:
    PyBuffer_Release(&gb);
done_rows:
    PyBuffer_Release(&rb);
done_keys:
    column_close(&keys);
done_vals:
    column_close(&vals);
    Py_XDECREF(out);
    Py_XDECREF(meta);
    return result;
}

static PyObject *crc(PyObject *module, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    uint32_t c = crc32c(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

/*
 * hash64(column, length, out): mix every row of an Arrow binary column into out[r] (uint64,
 * length rows), the row hash of the recovery-key mode's order (connectors/kafka/sink/
 * ordering.py, which also holds the same function in numpy: both must agree bit for bit).
 *
 *   h = out[r] ^ (len + 1) * K          (len -1 for null: a null and b"" differ)
 *   per 8-byte little-endian word w (the last one zero-padded): h = (rotl(h, 27) ^ w) * K
 *   out[r] = splitmix64's finaliser of h
 */
#define HASH_K 0x9E3779B97F4A7C15ULL

static inline uint64_t load_le64(const uint8_t *p, int64_t n) {
    uint64_t w = 0;
    for (int64_t b = 0; b < n; b++) w |= (uint64_t)p[b] << (8 * b);
    return w;
}

static inline uint64_t word_le64(const uint8_t *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
#else
    return load_le64(p, 8);
#endif
}

static inline uint64_t finalise(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static PyObject *hash64(PyObject *module, PyObject *args) {
    PyObject *spec, *out_o;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "OnO", &spec, &length, &out_o)) return NULL;
    column_t col;
    if (column_open(&col, spec) < 0) return NULL;
    Py_buffer ob;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(out_o, &ob, PyBUF_WRITABLE) < 0) goto done_col;
    if (!col.has || check_bounds(&col, length, "column") < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "hash64 needs a column");
        goto done_out;
    }
    if (ob.len < length * 8) {
        PyErr_SetString(PyExc_ValueError, "out is shorter than the column");
        goto done_out;
    }
    uint64_t *out = ob.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < length; r++) {
        const uint8_t *p = NULL;
        int64_t n = column_get(&col, r, &p);
        uint64_t h = out[r] ^ ((uint64_t)(n + 1) * HASH_K);
        for (; n >= 8; n -= 8, p += 8) h = (((h << 27) | (h >> 37)) ^ word_le64(p)) * HASH_K;
        if (n > 0) h = (((h << 27) | (h >> 37)) ^ load_le64(p, n)) * HASH_K;
        out[r] = finalise(h);
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done_out:
    PyBuffer_Release(&ob);
done_col:
    column_close(&col);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS, "Kafka record batches from Arrow buffers."},
    {"crc32c", crc, METH_VARARGS, "CRC-32C of a buffer."},
    {"hash64", hash64, METH_VARARGS, "Mix an Arrow binary column's rows into uint64 hashes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_record_batch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__record_batch(void) {
    crc_init();
    if (have_sse42()) crc32c = crc_hard;
    return PyModule_Create(&module_def);
}
