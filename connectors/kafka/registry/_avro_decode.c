/*
 * Columnar decoding of Confluent-framed Avro records of a flat record schema into Arrow
 * buffers: the source's fast path (connectors/kafka/registry/avro.py, "Fast path").
 *
 * decode(program, n, validity, offsets, data, schema_id) walks the n framed values of one
 * Arrow binary array (its validity bitmap or None, its int32 offsets and its data buffer)
 * once, and appends every field of every record to that field's Arrow buffers. The program
 * has one byte per field of the record:
 *
 *   bits 0-3  the type: 1 boolean, 2 int, 3 long, 4 float, 5 double, 6 string, 7 bytes
 *   bit 4     the field is a union of null and that type
 *   bit 5     the null branch's index in that union (0: ["null", T], 1: [T, "null"])
 *
 * It returns (record validity, [(validity, data) or (validity, offsets, data) per field])
 * as bytes objects, or an int: the index of the first record it will not decode (a header
 * that is not magic 0 + schema_id, bytes that do not decode as the schema, bytes left over
 * after the record, a string that is not UTF-8). The caller then decodes the whole batch
 * with fastavro, which resolves other schema ids and names the bad record; so this module
 * never reports an error itself and never decides what a record means: any doubt falls back.
 *
 * Avro binary encoding (the specification, "Binary Encoding"): int and long are zig-zag
 * varints, float and double little-endian IEEE 754, boolean one byte 0 or 1, string and
 * bytes a long length then the bytes, a union the branch index (a long) then the value.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { T_BOOL = 1, T_INT, T_LONG, T_FLOAT, T_DOUBLE, T_STRING, T_BYTES };
#define NULLABLE 0x10
#define NULL_SECOND 0x20
#define MAX_FIELDS 4096

typedef struct {
    int type, nullable, null_index, width;
    uint8_t *valid;          /* bitmap, n bits */
    uint8_t *data;           /* fixed width: n * width; variable: grows */
    int32_t *offsets;        /* variable width: n + 1 */
    size_t used, cap;        /* variable width data */
} Column;

static int read_long(const uint8_t **p, const uint8_t *end, int64_t *out) {
    uint64_t v = 0;
    int shift = 0;
    while (*p < end) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
        shift += 7;
        if (shift > 63) return -1;
    }
    return -1;
}

/* UTF-8 as the Unicode standard defines it (no overlongs, no surrogates, <= U+10FFFF). */
static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) { /* ASCII, eight bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) { i += 8; continue; }
        }
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; }
        else return 0;
        if (n - i <= k) return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k + 1;
    }
    return 1;
}

static int grow(Column *c, size_t need) {
    if (c->used + need <= c->cap) return 0;
    size_t cap = c->cap ? c->cap : 4096;
    while (cap < c->used + need) cap *= 2;
    uint8_t *d = realloc(c->data, cap);
    if (!d) return -1;
    c->data = d;
    c->cap = cap;
    return 0;
}

static void free_columns(Column *cols, int k) {
    for (int i = 0; i < k; i++) {
        free(cols[i].valid);
        free(cols[i].data);
        free(cols[i].offsets);
    }
    free(cols);
}

/* One record's fields into the columns at row r; -1 when the bytes do not decode. */
static int decode_record(Column *cols, int k, Py_ssize_t r, const uint8_t *p,
                         const uint8_t *end) {
    for (int f = 0; f < k; f++) {
        Column *c = &cols[f];
        int present = 1;
        if (c->nullable) {
            int64_t branch;
            if (read_long(&p, end, &branch)) return -1;
            if (branch != 0 && branch != 1) return -1;
            present = (branch != c->null_index);
        }
        if (present) c->valid[r >> 3] |= (uint8_t)(1u << (r & 7));
        switch (c->type) {
        case T_BOOL: {
            uint8_t v = 0;
            if (present) {
                if (p >= end || *p > 1) return -1;
                v = *p++;
            }
            c->data[r] = v;
            break;
        }
        case T_INT: {
            int64_t v = 0;
            if (present && (read_long(&p, end, &v) || v < INT32_MIN || v > INT32_MAX)) return -1;
            int32_t v32 = (int32_t)v;
            memcpy(c->data + r * 4, &v32, 4);
            break;
        }
        case T_LONG: {
            int64_t v = 0;
            if (present && read_long(&p, end, &v)) return -1;
            memcpy(c->data + r * 8, &v, 8);
            break;
        }
        case T_FLOAT:
            if (present) {
                if (end - p < 4) return -1;
                memcpy(c->data + r * 4, p, 4);
                p += 4;
            } else memset(c->data + r * 4, 0, 4);
            break;
        case T_DOUBLE:
            if (present) {
                if (end - p < 8) return -1;
                memcpy(c->data + r * 8, p, 8);
                p += 8;
            } else memset(c->data + r * 8, 0, 8);
            break;
        case T_STRING:
        case T_BYTES: {
            if (present) {
                int64_t len;
                if (read_long(&p, end, &len) || len < 0 || len > end - p) return -1;
                if (c->type == T_STRING && !utf8_ok(p, (size_t)len)) return -1;
                if (c->used + (size_t)len > INT32_MAX) return -1;
                if (grow(c, (size_t)len)) return -2;
                memcpy(c->data + c->used, p, (size_t)len);
                c->used += (size_t)len;
                p += len;
            }
            c->offsets[r + 1] = (int32_t)c->used;
            break;
        }
        default:
            return -1;
        }
    }
    return p == end ? 0 : -1;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer prog, offs, data, valid = {0};
    Py_ssize_t n;
    PyObject *valid_obj;
    long long schema_id;
    if (!PyArg_ParseTuple(args, "y*nOy*y*L", &prog, &n, &valid_obj, &offs, &data, &schema_id))
        return NULL;
    PyObject *result = NULL;
    Column *cols = NULL;
    uint8_t *rec_valid = NULL;
    int k = (int)prog.len;
    int have_valid = valid_obj != Py_None;
    if (have_valid && PyObject_GetBuffer(valid_obj, &valid, PyBUF_SIMPLE) < 0) goto done_args;
    if (k < 1 || k > MAX_FIELDS || n < 0 || offs.len < (Py_ssize_t)((n + 1) * 4) ||
        (have_valid && valid.len < (n + 7) / 8)) {
        PyErr_SetString(PyExc_ValueError, "_avro_decode.decode: inconsistent buffers");
        goto done;
    }
    cols = calloc((size_t)k, sizeof(Column));
    rec_valid = calloc((size_t)(n + 7) / 8 + 1, 1);
    if (!cols || !rec_valid) { PyErr_NoMemory(); goto done; }
    const uint8_t *pg = prog.buf;
    for (int f = 0; f < k; f++) {
        Column *c = &cols[f];
        c->type = pg[f] & 0x0F;
        c->nullable = (pg[f] & NULLABLE) != 0;
        c->null_index = (pg[f] & NULL_SECOND) ? 1 : 0;
        c->width = c->type == T_BOOL ? 1 : (c->type == T_INT || c->type == T_FLOAT) ? 4
                 : (c->type == T_LONG || c->type == T_DOUBLE) ? 8 : 0;
        if (c->type < T_BOOL || c->type > T_BYTES) {
            PyErr_SetString(PyExc_ValueError, "_avro_decode.decode: bad program");
            goto done;
        }
        c->valid = calloc((size_t)(n + 7) / 8 + 1, 1);
        if (c->width) c->data = calloc((size_t)n * c->width + 1, 1);
        else c->offsets = calloc((size_t)n + 1, sizeof(int32_t));
        if (!c->valid || (c->width ? !c->data : !c->offsets)) { PyErr_NoMemory(); goto done; }
    }
    const int32_t *off = offs.buf;
    const uint8_t *bytes = data.buf;
    const uint8_t *vbits = have_valid ? valid.buf : NULL;
    uint8_t header[5] = {0, (uint8_t)(schema_id >> 24), (uint8_t)(schema_id >> 16),
                         (uint8_t)(schema_id >> 8), (uint8_t)schema_id};
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n; r++) {
        int32_t a = off[r], b = off[r + 1];
        if (a < 0 || b < a || (Py_ssize_t)b > data.len) { bad = r; break; }
        if (vbits && !(vbits[r >> 3] & (1u << (r & 7)))) {
            /* a null value (a tombstone): a null record, its fields null */
            for (int f = 0; f < k; f++)
                if (!cols[f].width) cols[f].offsets[r + 1] = (int32_t)cols[f].used;
            continue;
        }
        if (b - a < 5 || memcmp(bytes + a, header, 5) != 0) { bad = r; break; }
        int rc = decode_record(cols, k, r, bytes + a + 5, bytes + b);
        if (rc) { bad = rc == -2 ? -2 : r; break; }
        rec_valid[r >> 3] |= (uint8_t)(1u << (r & 7));
    }
    Py_END_ALLOW_THREADS
    if (bad == -2) { PyErr_NoMemory(); goto done; }
    if (bad >= 0) { result = PyLong_FromSsize_t(bad); goto done; }
    PyObject *fields = PyList_New(k);
    if (!fields) goto done;
    Py_ssize_t vlen = (n + 7) / 8;
    for (int f = 0; f < k; f++) {
        Column *c = &cols[f];
        PyObject *item;
        if (c->width)
            item = Py_BuildValue("(y#y#)", c->valid, vlen, c->data, n * c->width);
        else
            item = Py_BuildValue("(y#y#y#)", c->valid, vlen, (char *)c->offsets,
                                 (Py_ssize_t)((n + 1) * 4), c->data ? (char *)c->data : "",
                                 (Py_ssize_t)c->used);
        if (!item) { Py_DECREF(fields); goto done; }
        PyList_SET_ITEM(fields, f, item);
    }
    result = Py_BuildValue("(y#N)", rec_valid, vlen, fields);
done:
    if (cols) free_columns(cols, k);
    free(rec_valid);
    if (have_valid && valid.obj) PyBuffer_Release(&valid);
done_args:
    PyBuffer_Release(&prog);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    return result;
}

/* -- encoding: the sink's fast path ---------------------------------------------------------
 *
 * encode(program, n, header, validity, fields) -> (offsets, data) | int
 *
 * The n rows of a struct column (its validity bitmap or None) as framed Avro: header (the
 * 5-byte magic and schema id) then the record. fields: per program byte, (validity or None,
 * values, offsets or None) Arrow buffers at offset 0: booleans bit-packed, int/long/float/
 * double little-endian, strings and bytes int32 offsets and data. A null row gives a null
 * value (the offsets repeat; the caller marks it null). It returns the index of the first row
 * it will not encode (a null in a field whose schema has no null branch, a length over
 * 2 GiB), and the caller encodes the batch with fastavro, which names the problem.
 */
typedef struct {
    int type, nullable, null_index;
    const uint8_t *valid, *values;
    const int32_t *offsets;
} In;

static size_t put_long(uint8_t *p, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    size_t i = 0;
    while (z & ~0x7FULL) { p[i++] = (uint8_t)((z & 0x7F) | 0x80); z >>= 7; }
    p[i++] = (uint8_t)z;
    return i;
}

static PyObject *encode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer prog, header;
    Py_ssize_t n;
    PyObject *valid_obj, *fields;
    if (!PyArg_ParseTuple(args, "y*ny*OO", &prog, &n, &header, &valid_obj, &fields))
        return NULL;
    PyObject *result = NULL;
    int k = (int)prog.len;
    Py_buffer *bufs = NULL;
    In *in = NULL;
    int nbufs = 0;
    Py_buffer rowvalid = {0};
    int have_rowvalid = valid_obj != Py_None;
    uint8_t *out = NULL;
    int32_t *offs = NULL;
    if (!PyList_Check(fields) || PyList_GET_SIZE(fields) != k || k < 1 || k > MAX_FIELDS ||
        header.len != 5 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "_avro_decode.encode: inconsistent arguments");
        goto done;
    }
    if (have_rowvalid && PyObject_GetBuffer(valid_obj, &rowvalid, PyBUF_SIMPLE) < 0) {
        have_rowvalid = 0;
        goto done;
    }
    bufs = calloc((size_t)k * 3, sizeof(Py_buffer));
    in = calloc((size_t)k, sizeof(In));
    offs = malloc(((size_t)n + 1) * sizeof(int32_t));
    if (!bufs || !in || !offs) { PyErr_NoMemory(); goto done; }
    const uint8_t *pg = prog.buf;
    size_t bound = 0; /* an upper bound of the output: every row's largest encoding */
    for (int f = 0; f < k; f++) {
        PyObject *t = PyList_GET_ITEM(fields, f);
        In *c = &in[f];
        c->type = pg[f] & 0x0F;
        c->nullable = (pg[f] & NULLABLE) != 0;
        c->null_index = (pg[f] & NULL_SECOND) ? 1 : 0;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
            PyErr_SetString(PyExc_ValueError, "_avro_decode.encode: a field is not a triple");
            goto done;
        }
        for (int j = 0; j < 3; j++) {
            PyObject *o = PyTuple_GET_ITEM(t, j);
            if (o == Py_None) continue;
            if (PyObject_GetBuffer(o, &bufs[nbufs], PyBUF_SIMPLE) < 0) goto done;
            const void *b = bufs[nbufs].buf;
            Py_ssize_t len = bufs[nbufs].len;
            nbufs++;
            if (j == 0) { if (len < (n + 7) / 8) goto bad; c->valid = b; }
            else if (j == 1) c->values = b;
            else { if (len < (n + 1) * 4) goto bad; c->offsets = b; }
        }
        bound += 10; /* a union index */
        switch (c->type) {
        case T_BOOL: bound += 1; break;
        case T_INT: case T_LONG: bound += 10; break;
        case T_FLOAT: bound += 4; break;
        case T_DOUBLE: bound += 8; break;
        case T_STRING: case T_BYTES: bound += 10; break;
        default: goto bad;
        }
        if ((c->type == T_STRING || c->type == T_BYTES) && !c->offsets) goto bad;
        if (!c->values && n > 0 && !(c->type == T_STRING || c->type == T_BYTES)) goto bad;
    }
    size_t total = 0;
    for (int f = 0; f < k; f++)
        if (in[f].offsets && n > 0) total += (size_t)(in[f].offsets[n] - in[f].offsets[0]);
    total += (size_t)n * (bound + 5);
    out = malloc(total + 1);
    if (!out) { PyErr_NoMemory(); goto done; }
    const uint8_t *rv = have_rowvalid ? rowvalid.buf : NULL;
    size_t pos = 0;
    Py_ssize_t bad_row = -1;
    offs[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n && bad_row < 0; r++) {
        if (rv && !(rv[r >> 3] & (1u << (r & 7)))) { offs[r + 1] = (int32_t)pos; continue; }
        memcpy(out + pos, header.buf, 5);
        pos += 5;
        for (int f = 0; f < k; f++) {
            In *c = &in[f];
            int present = !c->valid || (c->valid[r >> 3] & (1u << (r & 7)));
            if (c->nullable) {
                pos += put_long(out + pos, present ? 1 - c->null_index : c->null_index);
                if (!present) continue;
            } else if (!present) { bad_row = r; break; }
            switch (c->type) {
            case T_BOOL: out[pos++] = (c->values[r >> 3] >> (r & 7)) & 1; break;
            case T_INT: { int32_t v; memcpy(&v, c->values + r * 4, 4); pos += put_long(out + pos, v); break; }
            case T_LONG: { int64_t v; memcpy(&v, c->values + r * 8, 8); pos += put_long(out + pos, v); break; }
            case T_FLOAT: memcpy(out + pos, c->values + r * 4, 4); pos += 4; break;
            case T_DOUBLE: memcpy(out + pos, c->values + r * 8, 8); pos += 8; break;
            default: {
                int32_t a = c->offsets[r], b = c->offsets[r + 1];
                if (b < a) { bad_row = r; break; }
                pos += put_long(out + pos, b - a);
                if (b > a) memcpy(out + pos, c->values + a, (size_t)(b - a));
                pos += (size_t)(b - a);
            }
            }
            if (bad_row >= 0) break;
        }
        if (pos > INT32_MAX) bad_row = r;
        offs[r + 1] = (int32_t)pos;
    }
    Py_END_ALLOW_THREADS
    if (bad_row >= 0) { result = PyLong_FromSsize_t(bad_row); goto done; }
    result = Py_BuildValue("(y#y#)", (char *)offs, (Py_ssize_t)((n + 1) * 4), (char *)out,
                           (Py_ssize_t)pos);
    goto done;
bad:
    PyErr_SetString(PyExc_ValueError, "_avro_decode.encode: a buffer is missing or short");
done:
    for (int i = 0; i < nbufs; i++) PyBuffer_Release(&bufs[i]);
    free(bufs);
    free(in);
    free(out);
    free(offs);
    if (have_rowvalid) PyBuffer_Release(&rowvalid);
    PyBuffer_Release(&prog);
    PyBuffer_Release(&header);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(program, n, validity, offsets, data, schema_id) -> (validity, fields) | int"},
    {"encode", encode, METH_VARARGS,
     "encode(program, n, header, validity, fields) -> (offsets, data) | int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_avro_decode",
                                    "Columnar Avro decoding (see the source).", -1, methods};

PyMODINIT_FUNC PyInit__avro_decode(void) { return PyModule_Create(&module); }
