/*
 * The recovery-key sink's produce loop in C (docs/design.md, recovery keys, step 3).
 *
 * connectors/kafka/sink/batch_produce.produce_keyed calls it; without this module (no C
 * compiler at install time, not CPython) the sink produces record by record from Python.
 *
 * One call enqueues a run of records to one topic with librdkafka's rd_kafka_produceva,
 * each with the recovery-key header "<prefix><seq as 8 big-endian bytes>" (none when the
 * header name is empty: the transactional mode), on the handle of a confluent-kafka
 * Producer. Nothing is linked: librdkafka's functions come in as
 * addresses (from the library confluent-kafka loaded), and its public types are declared
 * here as rdkafka.h declares them.
 *
 * Delivery reports: every record carries confluent-kafka's own per-message state
 * {Handle *self, PyObject *dr_cb}, allocated with calloc like confluent-kafka's produce()
 * does, so its delivery-report trampoline handles these records exactly like its own:
 * a failed delivery calls dr_cb(err, msg) (the sink's ProducerSlot.on_delivery), and the
 * state is freed after the report, success or not.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* rdkafka.h: rd_kafka_vtype_t and rd_kafka_vu_t (public ABI since librdkafka 1.0). */
enum {
    VTYPE_END,
    VTYPE_TOPIC,
    VTYPE_RKT,
    VTYPE_PARTITION,
    VTYPE_VALUE,
    VTYPE_KEY,
    VTYPE_OPAQUE,
    VTYPE_MSGFLAGS,
    VTYPE_TIMESTAMP,
    VTYPE_HEADER,
    VTYPE_HEADERS
};

typedef struct {
    int vtype;
    union {
        const char *cstr;
        void *rkt;
        int i;
        int32_t i32;
        int64_t i64;
        struct {
            void *ptr;
            size_t size;
        } mem;
        struct {
            const char *name;
            const void *val;
            ssize_t size;
        } header;
        void *headers;
        void *ptr;
        char _pad[64];
    } u;
} vu_t;

#define MSG_F_COPY 0x2

typedef void *(*produceva_fn)(void *rk, const vu_t *vus, size_t cnt);
typedef int (*error_code_fn)(const void *error);
typedef void (*error_destroy_fn)(void *error);

/* confluent-kafka's struct Producer_msgstate (src/confluent_kafka/src/Producer.c). */
typedef struct {
    PyObject *self;
    PyObject *dr_cb;
} msgstate_t;

#define HEADER_MAX 512

static PyObject *produce(PyObject *module, PyObject *args) {
    PyObject *producer, *dr_cb;
    unsigned long long produceva_p, error_code_p, error_destroy_p, rk, rkt;
    unsigned long long values_p, value_lens_p, keys_p, key_lens_p, partitions_p, seqs_p;
    Py_ssize_t n, prefix_len;
    const char *header_name;
    const char *prefix;

    if (!PyArg_ParseTuple(args, "OOKKKKKnKKKKKKyy#", &producer, &dr_cb, &produceva_p,
                          &error_code_p, &error_destroy_p, &rk, &rkt, &n, &values_p,
                          &value_lens_p, &keys_p, &key_lens_p, &partitions_p, &seqs_p,
                          &header_name, &prefix, &prefix_len))
        return NULL;
    if (prefix_len < 0 || prefix_len + 8 > HEADER_MAX) {
        PyErr_SetString(PyExc_ValueError, "recovery-key prefix too long");
        return NULL;
    }
    if (!PyCallable_Check(dr_cb)) {
        PyErr_SetString(PyExc_TypeError, "dr_cb must be callable");
        return NULL;
    }

    produceva_fn produceva = (produceva_fn)(uintptr_t)produceva_p;
    error_code_fn error_code = (error_code_fn)(uintptr_t)error_code_p;
    error_destroy_fn error_destroy = (error_destroy_fn)(uintptr_t)error_destroy_p;
    const uint64_t *values = (const uint64_t *)(uintptr_t)values_p;
    const uint64_t *value_lens = (const uint64_t *)(uintptr_t)value_lens_p;
    const uint64_t *keys = (const uint64_t *)(uintptr_t)keys_p;
    const uint64_t *key_lens = (const uint64_t *)(uintptr_t)key_lens_p;
    const int32_t *partitions = (const int32_t *)(uintptr_t)partitions_p;
    const uint64_t *seqs = (const uint64_t *)(uintptr_t)seqs_p;

    unsigned char header[HEADER_MAX];
    memcpy(header, prefix, (size_t)prefix_len);

    /* RKT, PARTITION, VALUE, KEY, MSGFLAGS, OPAQUE, then HEADER when there is one. */
    int with_header = header_name[0] != '\0';
    size_t count = with_header ? 7 : 6;
    vu_t vus[7];
    memset(vus, 0, sizeof(vus));
    vus[0].vtype = VTYPE_RKT;
    vus[0].u.rkt = (void *)(uintptr_t)rkt;
    vus[1].vtype = VTYPE_PARTITION;
    vus[2].vtype = VTYPE_VALUE;
    vus[3].vtype = VTYPE_KEY;
    vus[4].vtype = VTYPE_MSGFLAGS;
    vus[4].u.i = MSG_F_COPY; /* the Arrow buffers may be released right after */
    vus[5].vtype = VTYPE_OPAQUE;
    vus[6].vtype = VTYPE_HEADER;
    vus[6].u.header.name = header_name;
    vus[6].u.header.val = header;
    vus[6].u.header.size = (ssize_t)(prefix_len + 8);

    Py_ssize_t i;
    int err = 0;
    for (i = 0; i < n; i++) {
        if (with_header) {
            uint64_t seq = seqs[i];
            for (int b = 0; b < 8; b++)
                header[prefix_len + b] = (unsigned char)(seq >> (56 - 8 * b));
        }
        msgstate_t *state = calloc(1, sizeof(*state));
        if (!state)
            return PyErr_NoMemory();
        state->self = producer;
        state->dr_cb = dr_cb;
        Py_INCREF(dr_cb);
        vus[1].u.i32 = partitions[i];
        vus[2].u.mem.ptr = (void *)(uintptr_t)values[i];
        vus[2].u.mem.size = (size_t)value_lens[i];
        vus[3].u.mem.ptr = (void *)(uintptr_t)keys[i];
        vus[3].u.mem.size = (size_t)key_lens[i];
        vus[5].u.ptr = state;
        void *error = produceva((void *)(uintptr_t)rk, vus, count);
        if (error) {
            /* Not enqueued: no delivery report will free the state. */
            err = error_code(error);
            error_destroy(error);
            Py_DECREF(dr_cb);
            free(state);
            break;
        }
    }
    return Py_BuildValue("(ni)", i, err);
}

static PyMethodDef methods[] = {
    {"produce", produce, METH_VARARGS,
     "produce(producer, dr_cb, produceva, error_code, error_destroy, rk, rkt, n, values, "
     "value_lens, keys, key_lens, partitions, seqs, header_name, prefix) -> (enqueued, err); "
     "an empty header_name: no header"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_keyed_produce",
                                    "The recovery-key sink's produce loop.", -1, methods};

PyMODINIT_FUNC PyInit__keyed_produce(void) { return PyModule_Create(&module); }
