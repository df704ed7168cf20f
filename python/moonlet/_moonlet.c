/*
 * _moonlet.c - the CPython extension under the `moonlet` package: one type,
 * moonlet._moonlet.Client, that owns a moonlet_client (include/moonlet/client.h)
 * and exposes its calls to Python.  The pure-Python package (moonlet/__init__.py)
 * subclasses it as moonlet.Store and adds what is easier to say in Python
 * (constructors, inspect(), repr, the context manager); moonlet/mooncake.py
 * builds Mooncake Store's Python class on top.
 *
 * Conventions of every method:
 *  - A moonlet error code becomes moonlet.StoreError(code, message) (the class
 *    lives in moonlet/errors.py; .code is Mooncake's number).  A per-key error
 *    inside a batch raises too, with .results holding every key's outcome, so
 *    an error never reads as "absent".
 *  - The GIL is released around every call that may block (anything that talks
 *    to the master, a store node or a RealClient).  Arguments are converted
 *    and pinned before: keys of a batch are copied into a tuple that this call
 *    owns, so another thread mutating the caller's list cannot free a key
 *    while C reads it; byte values stay exported (Py_buffer) for the call.
 *  - close() may race with calls on other threads: calls hold the object's
 *    rwlock shared (taken with the GIL released), close() takes it exclusive,
 *    so it waits for calls in flight and later calls see a closed store.
 *
 * Every method is a thin wrapper: the copying batches (batch_put,
 * put_parts, batch_get, the multi-buffer batches) are the C client's
 * moonlet_client_batch_put / moonlet_client_batch_get; the SharedBuffer type
 * lives in shared.c, what both files share in _moonlet.h.
 *
 * Built by python/moonlet/meson.build against Debian's python3-dev and the
 * internal static libraries of libmoonlet; no warning flag is relaxed for it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moonlet/client.h"
#include "moonlet/error.h"
#include "moonlet/policy.h"

#include "_moonlet.h"
#include "client_gpu.h"
#include "cuda_driver.h"

/* A PyCFunction-compatible pointer to a METH_VARARGS | METH_KEYWORDS method
 * (the cast through void (*)(void) is what CPython itself does). */
#define ML_KW(f) ((PyCFunction)(void (*)(void))(f))

/* The two methods off() and on() of common(self, args, kw, flag), flag false
 * and true (put / upsert, is_exist / probe_key, remove / _remove_force, ...). */
#define ML_FLAG_PAIR(off, on, common)                                                     \
    static PyObject *off(ClientObject *self, PyObject *args, PyObject *kw)                \
    {                                                                                     \
        return common(self, args, kw, false);                                             \
    }                                                                                     \
    static PyObject *on(ClientObject *self, PyObject *args, PyObject *kw)                 \
    {                                                                                     \
        return common(self, args, kw, true);                                              \
    }

static PyObject *g_store_error; /* moonlet.errors.StoreError */

/* ---- errors ------------------------------------------------------------------------ */

/* Raises StoreError(code, "<what>: NAME (code)", results=results). */
PyObject *ml_raise(int code, const char *what, PyObject *results)
{
    PyObject *exc;
    if (code == ML_CLOSED) {
        code = MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
        exc = PyObject_CallFunction(g_store_error, "is", code, "the store is closed");
    } else {
        PyObject *msg = PyUnicode_FromFormat("%s: %s (%d)", what, moonlet_strerror(code), code);
        exc = msg ? PyObject_CallFunction(g_store_error, "iO", code, msg) : NULL;
        Py_XDECREF(msg);
    }
    if (exc && results && PyObject_SetAttrString(exc, "results", results) < 0)
        Py_CLEAR(exc);
    if (exc) {
        PyErr_SetObject(g_store_error, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* As ml_raise for the first negative entry of a batch (key named in the message). */
static PyObject *ml_raise_batch(const char *what, const char *const *keys, const int32_t *codes,
                                size_t n, PyObject *results)
{
    for (size_t i = 0; i < n; i++) {
        if (codes[i] < 0) {
            char buf[160];
            snprintf(buf, sizeof(buf), "%s: key %zu ('%.64s')", what, i, keys[i]);
            return ml_raise(codes[i], buf, results);
        }
    }
    return ml_raise(MOONLET_ERR_INTERNAL_ERROR, what, results);
}

/* ---- argument conversion ----------------------------------------------------------- */

/* A str as UTF-8 without NUL into *out; what names the argument in the
 * TypeError / ValueError (expected: what a TypeError says it must be).
 * The pointer lives as long as the str.  Returns 1, or 0 with an exception. */
static int ml_utf8(PyObject *o, const char *what, const char *expected, const char **out)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be %s, not %.80s", what, expected,
                     Py_TYPE(o)->tp_name);
        return 0;
    }
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(o, &len);
    if (!s)
        return 0;
    if ((size_t)len != strlen(s)) {
        PyErr_Format(PyExc_ValueError, "%s contains a NUL character", what);
        return 0;
    }
    *out = s;
    return 1;
}

/* O& converter: a str key (UTF-8, no NUL) to const char *.  The pointer lives
 * as long as the str, which the argument tuple keeps alive for the call. */
static int conv_key(PyObject *o, void *out)
{
    return ml_utf8(o, "key", "str", out);
}

/* O& converter: None or a str tenant id. */
static int conv_tenant(PyObject *o, void *out)
{
    if (o == Py_None) {
        *(const char **)out = NULL;
        return 1;
    }
    return ml_utf8(o, "tenant_id", "str or None", out);
}

/* An int (not bool) in [0, max]; `what` names it in errors. */
static int ml_uint(PyObject *o, uint64_t max, const char *what, uint64_t *out)
{
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be int, not %.80s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s out of range (0..%llu)", what, (unsigned long long)max);
        return -1;
    }
    if (v > max) {
        PyErr_Format(PyExc_ValueError, "%s out of range (0..%llu)", what, (unsigned long long)max);
        return -1;
    }
    *out = v;
    return 0;
}

/* O& converters of a Python int: name(o, out) stores it as
 * `*(type *)out` when it is in [0, max], else raises naming what. */
#define ML_CONV_UINT(name, type, max, what)                                               \
    int name(PyObject *o, void *out)                                                      \
    {                                                                                     \
        uint64_t v;                                                                       \
        if (ml_uint(o, (max), (what), &v))                                                \
            return 0;                                                                     \
        *(type *)out = (type)v;                                                           \
        return 1;                                                                         \
    }

/* A byte count (shared.c uses it too), a uint32, a uint64. */
ML_CONV_UINT(conv_size, size_t, SIZE_MAX, "size")
static ML_CONV_UINT(conv_u32, uint32_t, UINT32_MAX, "value")
static ML_CONV_UINT(conv_u64, uint64_t, UINT64_MAX, "value")
static ML_CONV_UINT(conv_port, uint16_t, UINT16_MAX, "port")

/* O& converter: a memory address. */
static int conv_addr(PyObject *o, void *out)
{
    uint64_t v;
    if (ml_uint(o, UINTPTR_MAX, "address", &v))
        return 0;
    *(void **)out = (void *)(uintptr_t)v;
    return 1;
}

/* O& converter: None or a str without NUL (as conv_tenant). */
static int conv_opt_str(PyObject *o, void *out)
{
    return conv_tenant(o, out);
}

/* The keys of a batch: a tuple this call owns and their UTF-8 pointers. */
typedef struct {
    PyObject *tuple;
    const char **keys;
    size_t n;
} ml_keys;

static int ml_keys_init(ml_keys *k, PyObject *seq)
{
    k->keys = NULL;
    k->n = 0;
    if (PyUnicode_Check(seq) || PyBytes_Check(seq)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a sequence of str, not a single str");
        k->tuple = NULL;
        return -1;
    }
    k->tuple = PySequence_Tuple(seq);
    if (!k->tuple)
        return -1;
    k->n = (size_t)PyTuple_GET_SIZE(k->tuple);
    k->keys = PyMem_Malloc((k->n ? k->n : 1) * sizeof(*k->keys));
    if (!k->keys) {
        Py_CLEAR(k->tuple);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < k->n; i++) {
        if (!conv_key(PyTuple_GET_ITEM(k->tuple, (Py_ssize_t)i), &k->keys[i])) {
            PyMem_Free(k->keys);
            k->keys = NULL;
            Py_CLEAR(k->tuple);
            return -1;
        }
    }
    return 0;
}

static void ml_keys_free(ml_keys *k)
{
    PyMem_Free(k->keys);
    Py_XDECREF(k->tuple);
}

/* n ints of a sequence (addresses or sizes) converted with conv into out[]. */
static int ml_seq_conv(PyObject *seq, size_t n, const char *what, int (*conv)(PyObject *, void *),
                       void *out, size_t elem)
{
    PyObject *t = PySequence_Tuple(seq);
    if (!t)
        return -1;
    if ((size_t)PyTuple_GET_SIZE(t) != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries for %zu keys", what,
                     PyTuple_GET_SIZE(t), n);
        Py_DECREF(t);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!conv(PyTuple_GET_ITEM(t, (Py_ssize_t)i), (char *)out + i * elem)) {
            Py_DECREF(t);
            return -1;
        }
    }
    Py_DECREF(t);
    return 0;
}

/* The policy object's lease_mode (0..255, the wire type) and candidate_size
 * (0..2^64-1), read as attributes; None is the default policy.  Values the
 * master rejects (unknown mode, size 0 or not dividing) pass unchanged. */
static int ml_policy(PyObject *o, moonlet_grant_lease_policy *p)
{
    *p = MOONLET_GRANT_LEASE_POLICY_DEFAULT;
    if (o == Py_None)
        return 0;
    PyObject *mode = PyObject_GetAttrString(o, "lease_mode");
    PyObject *size = mode ? PyObject_GetAttrString(o, "candidate_size") : NULL;
    uint64_t m = 0, s = 0;
    int rc = -1;
    if (mode && size && !ml_uint(mode, UINT8_MAX, "lease_mode", &m) &&
        !ml_uint(size, UINT64_MAX, "candidate_size", &s)) {
        p->lease_mode = (uint8_t)m;
        p->candidate_size = s;
        rc = 0;
    } else if (!mode || !size) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "policy must be a moonlet.GrantLeasePolicy (or None), not %.80s",
                     Py_TYPE(o)->tp_name);
    }
    Py_XDECREF(mode);
    Py_XDECREF(size);
    return rc;
}

/* A put's placement keywords: preferred_segments (None, a str, or a
 * sequence of str; copied here so no reference outlives the parse),
 * hard_pin, soft_pin_ttl_ms. */
#define ML_MAX_PREFERRED 64
typedef struct ml_place {
    char names[ML_MAX_PREFERRED][MOONLET_MAX_ID_BYTES + 1];
    const char *ptrs[ML_MAX_PREFERRED];
    size_t n;
    int hard_pin;
    uint64_t ttl_ms;
} ml_place;

/* Only the scalars: the 16 KiB of names are written as they are parsed
 * (no memset on every put). */
static void ml_place_init(ml_place *pl)
{
    pl->n = 0;
    pl->hard_pin = 0;
    pl->ttl_ms = 0;
}

static int ml_place_name(ml_place *pl, PyObject *item)
{
    Py_ssize_t len;
    const char *s = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, &len) : NULL;
    if (!s) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "preferred_segments: segment names must be str");
        return -1;
    }
    if (len > MOONLET_MAX_ID_BYTES || memchr(s, 0, (size_t)len)) {
        PyErr_SetString(PyExc_ValueError, "preferred_segments: a name is too long or has a NUL");
        return -1;
    }
    if (len == 0) /* Mooncake's "" means no preference */
        return 0;
    if (pl->n == ML_MAX_PREFERRED) {
        PyErr_SetString(PyExc_ValueError, "preferred_segments: at most 64 names");
        return -1;
    }
    memcpy(pl->names[pl->n], s, (size_t)len);
    pl->names[pl->n][len] = 0;
    pl->ptrs[pl->n] = pl->names[pl->n];
    pl->n++;
    return 0;
}

/* O& converter for preferred_segments into an ml_place. */
static int conv_place_pref(PyObject *o, void *out)
{
    ml_place *pl = out;
    pl->n = 0;
    if (o == Py_None)
        return 1;
    if (PyUnicode_Check(o))
        return ml_place_name(pl, o) ? 0 : 1;
    PyObject *seq = PySequence_Fast(o, "preferred_segments must be a str or a sequence of str");
    if (!seq)
        return 0;
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(seq); i++)
        ok = ml_place_name(pl, PySequence_Fast_GET_ITEM(seq, i)) == 0;
    Py_DECREF(seq);
    return ok;
}

/* Put options from keyword arguments. */
static void ml_put_opts(moonlet_put_options *o, const char *tenant, uint32_t replica_num,
                        int soft_pin, const ml_place *pl)
{
    memset(o, 0, sizeof(*o));
    o->tenant = tenant;
    o->replica_num = replica_num;
    o->soft_pin = soft_pin != 0;
    o->preferred_segments = pl->n ? pl->ptrs : NULL;
    o->preferred_segments_count = pl->n;
    o->hard_pin = pl->hard_pin != 0;
    o->soft_pin_ttl_ms = pl->ttl_ms;
}

/* A put's keyword-only options (tenant_id, replica_num, soft_pin and the
 * placement keywords), parsed once for every put-like method by
 * ml_parse_put(); o points into pl. */
typedef struct {
    const char *tenant;
    uint32_t replica_num;
    int soft_pin;
    ml_place pl;
    moonlet_put_options o;
} ml_putkw;

static char *ml_put_kwnames[] = {"tenant_id", "replica_num", "soft_pin", "preferred_segments",
                                 "hard_pin", "soft_pin_ttl_ms", NULL};

/* Moves the put options out of a copy of kw into *opts (both new dicts, or
 * NULL when kw has no keywords); -1 with an exception set. */
static int ml_put_kw_split(PyObject *kw, PyObject **rest, PyObject **opts)
{
    *rest = *opts = NULL;
    if (!kw || PyDict_GET_SIZE(kw) == 0)
        return 0;
    *rest = PyDict_Copy(kw);
    *opts = PyDict_New();
    if (!*rest || !*opts)
        return -1;
    for (size_t i = 0; ml_put_kwnames[i]; i++) {
        PyObject *v = PyDict_GetItemString(*rest, ml_put_kwnames[i]); /* borrowed */
        if (v && (PyDict_SetItemString(*opts, ml_put_kwnames[i], v) < 0 ||
                  PyDict_DelItemString(*rest, ml_put_kwnames[i]) < 0))
            return -1;
    }
    return 0;
}

/* TypeError naming the first keyword of rest that is neither a put option
 * nor in kwl (as CPython's own message); -1 then. */
static int ml_kw_known(PyObject *rest, char **kwl, const char *name)
{
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (rest && PyDict_Next(rest, &pos, &k, &v)) {
        const char *ks = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : NULL;
        bool known = false;
        for (size_t i = 0; ks && kwl[i] && !known; i++)
            known = strcmp(ks, kwl[i]) == 0;
        if (!known) {
            PyErr_Format(PyExc_TypeError, "%R is an invalid keyword argument for %s()", k,
                         name ? name + 1 : "function");
            return -1;
        }
    }
    return 0;
}

/* PyArg_ParseTupleAndKeywords for a put-like method: fmt / kwl / the
 * varargs describe the method's own arguments (fmt ends in ":name"); the put
 * options, keyword-only, go to *pk.  Returns 1, or 0 with an exception set. */
static int ml_parse_put(PyObject *args, PyObject *kw, const char *fmt, char **kwl, ml_putkw *pk,
                        ...)
{
    pk->tenant = NULL;
    pk->replica_num = 0;
    pk->soft_pin = 0;
    ml_place_init(&pk->pl);
    PyObject *rest, *opts, *empty = NULL;
    int ok = 0;
    const char *name = strchr(fmt, ':');
    char ofmt[80];
    snprintf(ofmt, sizeof(ofmt), "|$O&O&pO&pO&%s", name ? name : "");
    if (ml_put_kw_split(kw, &rest, &opts) == 0 && ml_kw_known(rest, kwl, name) == 0 &&
        (empty = PyTuple_New(0)) != NULL &&
        PyArg_ParseTupleAndKeywords(empty, opts, ofmt, ml_put_kwnames, conv_tenant, &pk->tenant,
                                    conv_u32, &pk->replica_num, &pk->soft_pin, conv_place_pref,
                                    &pk->pl, &pk->pl.hard_pin, conv_u64, &pk->pl.ttl_ms)) {
        va_list ap;
        va_start(ap, pk);
        ok = PyArg_VaParseTupleAndKeywords(args, rest, fmt, kwl, ap);
        va_end(ap);
    }
    Py_XDECREF(empty);
    Py_XDECREF(rest);
    Py_XDECREF(opts);
    if (ok)
        ml_put_opts(&pk->o, pk->tenant, pk->replica_num, pk->soft_pin, &pk->pl);
    return ok;
}

/* The arguments of the (key, *, tenant_id=None) methods; name is the
 * method's, for the messages.  Returns 1, or 0 with an exception set. */
static int ml_parse_key(PyObject *args, PyObject *kw, const char *name, const char **key,
                        const char **tenant)
{
    static char *kwl[] = {"key", "tenant_id", NULL};
    char fmt[64];
    snprintf(fmt, sizeof(fmt), "O&|$O&:%s", name);
    *tenant = NULL;
    return PyArg_ParseTupleAndKeywords(args, kw, fmt, kwl, conv_key, key, conv_tenant, tenant);
}

/* As ml_parse_key for the (*, tenant_id=None) methods. */
static int ml_parse_tenant(PyObject *args, PyObject *kw, const char *name, const char **tenant)
{
    static char *kwl[] = {"tenant_id", NULL};
    char fmt[64];
    snprintf(fmt, sizeof(fmt), "|$O&:%s", name);
    *tenant = NULL;
    return PyArg_ParseTupleAndKeywords(args, kw, fmt, kwl, conv_tenant, tenant);
}

/* As ml_parse_key for the (keys, *, tenant_id=None) methods, with the keys
 * pinned in *k (ml_keys_free is the caller's once this returned 1). */
static int ml_parse_keys(PyObject *args, PyObject *kw, const char *name, ml_keys *k,
                         const char **tenant)
{
    static char *kwl[] = {"keys", "tenant_id", NULL};
    char fmt[64];
    PyObject *keys;
    snprintf(fmt, sizeof(fmt), "O|$O&:%s", name);
    *tenant = NULL;
    return PyArg_ParseTupleAndKeywords(args, kw, fmt, kwl, &keys, conv_tenant, tenant) &&
           ml_keys_init(k, keys) == 0;
}

/* A call's outcome: None, or StoreError(rc) naming what. */
static PyObject *ml_none_or_raise(int rc, const char *what)
{
    if (rc)
        return ml_raise(rc, what, NULL);
    Py_RETURN_NONE;
}

/* A call's outcome: the count v, or StoreError(rc) naming what. */
static PyObject *ml_u64_or_raise(int rc, const char *what, uint64_t v)
{
    return rc ? ml_raise(rc, what, NULL) : PyLong_FromUnsignedLongLong(v);
}

/* The batches over (keys, addresses, sizes) (kwl: those three names and
 * "tenant_id"): parses them, with the put options into *pk when pk is set,
 * else with tenant_id into *tenant, then fills st with init(st, keys,
 * addresses, sizes).  Returns 0, or -1 with an exception set. */
static int ml_batch_args(PyObject *args, PyObject *kw, const char *name, char **kwl,
                         ml_putkw *pk, const char **tenant,
                         int (*init)(void *, PyObject *, PyObject *, PyObject *), void *st)
{
    PyObject *keys, *addrs, *sizes;
    char fmt[64];
    int ok;
    if (pk) {
        char *own[] = {kwl[0], kwl[1], kwl[2], NULL};
        snprintf(fmt, sizeof(fmt), "OOO:%s", name);
        ok = ml_parse_put(args, kw, fmt, own, pk, &keys, &addrs, &sizes);
    } else {
        snprintf(fmt, sizeof(fmt), "OOO|$O&:%s", name);
        *tenant = NULL;
        ok = PyArg_ParseTupleAndKeywords(args, kw, fmt, kwl, &keys, &addrs, &sizes, conv_tenant,
                                         tenant);
    }
    return ok ? init(st, keys, addrs, sizes) : -1;
}

/* ---- the type ------------------------------------------------------------------------ */

static PyObject *Client_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    ClientObject *self = (ClientObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* close() must not starve behind a steady stream of calls */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&self->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    self->client = NULL;
    self->kind = ML_KIND_NONE;
    Py_INCREF(Py_None);
    self->target = Py_None;
    Py_INCREF(Py_None);
    self->tenant = Py_None;
    return (PyObject *)self;
}

/* Destroys the client (waiting for calls in flight); idempotent. */
static void ml_close(ClientObject *self)
{
    moonlet_client *c;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&self->lock);
    c = self->client;
    self->client = NULL;
    pthread_rwlock_unlock(&self->lock);
    moonlet_client_destroy(c);
    Py_END_ALLOW_THREADS
}

static void Client_dealloc(ClientObject *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->client)
        ml_close(self);
    pthread_rwlock_destroy(&self->lock);
    Py_CLEAR(self->target);
    Py_CLEAR(self->tenant);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Stores the connection's description once connected. */
static void ml_connected(ClientObject *self, ml_kind kind, PyObject *target, const char *tenant)
{
    self->kind = kind;
    Py_INCREF(target);
    Py_SETREF(self->target, target);
    /* A DummyClient without a tenant uses its RealClient's default, unknown here. */
    if (!tenant && kind == ML_KIND_DUMMY)
        return;
    PyObject *t = PyUnicode_FromString(tenant ? tenant : MOONLET_DEFAULT_TENANT);
    if (t)
        Py_SETREF(self->tenant, t);
    else
        PyErr_Clear();
}

/* Before a connect: target (the master's address or the socket path, a
 * str) into *out, and the object must not be connected yet.  Returns 1, or
 * 0 with an exception set. */
static int ml_can_connect(ClientObject *self, PyObject *target, const char **out)
{
    if (!conv_tenant(target, out))
        return 0;
    if (self->client || self->kind != ML_KIND_NONE) {
        PyErr_SetString(PyExc_RuntimeError, "already connected");
        return 0;
    }
    return 1;
}

/* After a connect: StoreError naming what, or the object now holds c. */
static PyObject *ml_connect_result(ClientObject *self, int rc, moonlet_client *c,
                                   const char *what, ml_kind kind, PyObject *target,
                                   const char *tenant)
{
    if (rc)
        return ml_raise(rc, what, NULL);
    self->client = c;
    ml_connected(self, kind, target, tenant);
    Py_RETURN_NONE;
}

static int ml_protocol(PyObject *o, void *out)
{
    const char *s;
    if (!conv_tenant(o, &s))
        return 0;
    moonlet_protocol *p = out;
    if (!s || !strcmp(s, "auto") || !*s) {
        *p = MOONLET_PROTOCOL_AUTO;
    } else if (!strcmp(s, "tcp")) {
        *p = MOONLET_PROTOCOL_TCP;
    } else if (!strcmp(s, "rdma")) {
        *p = MOONLET_PROTOCOL_RDMA;
    } else {
        PyErr_Format(PyExc_ValueError, "protocol must be 'auto', 'tcp' or 'rdma', not '%s'", s);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(connect_doc,
"_connect(master_addr, protocol, segment_size, device, auth_token, default_tenant,\n"
"         replica_num, rpc_timeout_ms, transfer_timeout_ms, local_listen_addr,\n"
"         checksum=True, http_server=False, http_port=0, http_address=None,\n"
"         gpu_staging_size=0, tls_ca=None, tls_cert=None, tls_key=None,\n"
"         disk_path=None, disk_size=0)\n"
"--\n\n"
"Connects this unconnected object to a master (moonlet_client_create).\n"
"Use moonlet.Store.connect() instead.");

static PyObject *Client_connect(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"master_addr", "protocol", "segment_size", "device", "auth_token",
                          "default_tenant", "replica_num", "rpc_timeout_ms",
                          "transfer_timeout_ms", "local_listen_addr", "checksum",
                          "http_server", "http_port", "http_address", "gpu_staging_size",
                          "tls_ca", "tls_cert", "tls_key", "disk_path", "disk_size", NULL};
    PyObject *addr_obj;
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    int checksum = 1, http_server = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UO&O&O&O&O&O&O&O&O&|ppO&O&O&O&O&O&O&O&:_connect",
                                     kwl,
                                     &addr_obj,
                                     ml_protocol, &cfg.protocol, conv_u64, &cfg.local_segment_size,
                                     conv_opt_str, &cfg.device, conv_opt_str, &cfg.auth_token,
                                     conv_opt_str, &cfg.default_tenant, conv_u32, &cfg.replica_num,
                                     conv_u32, &cfg.rpc_timeout_ms, conv_u32,
                                     &cfg.transfer_timeout_ms, conv_opt_str,
                                     &cfg.local_listen_addr, &checksum, &http_server, conv_port,
                                     &cfg.http_port, conv_opt_str, &cfg.http_address, conv_u64,
                                     &cfg.gpu_staging_size, conv_opt_str, &cfg.tls_ca,
                                     conv_opt_str, &cfg.tls_cert, conv_opt_str, &cfg.tls_key,
                                     conv_opt_str, &cfg.local_disk_path, conv_u64,
                                     &cfg.local_disk_size))
        return NULL;
    cfg.skip_checksum = !checksum;
    cfg.http_server = http_server;
    if (!ml_can_connect(self, addr_obj, &cfg.master_addr))
        return NULL;
    moonlet_client *c = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = moonlet_client_create(&cfg, &c);
    Py_END_ALLOW_THREADS
    return ml_connect_result(self, rc, c, "connect", ML_KIND_DIRECT, addr_obj, cfg.default_tenant);
}

PyDoc_STRVAR(connect_dummy_doc,
"_connect_dummy(socket_path, default_tenant, rpc_timeout_ms, staging_bytes, max_connections,\n"
"               peer_uid=None, peer_gid=None, gpu_staging_size=0)\n"
"--\n\n"
"Connects this unconnected object to a RealClient (moonlet_client_create_dummy).\n"
"Use moonlet.Store.connect_dummy() instead.");

static PyObject *Client_connect_dummy(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"socket_path", "default_tenant", "rpc_timeout_ms", "staging_bytes",
                          "max_connections", "peer_uid", "peer_gid", "gpu_staging_size", NULL};
    PyObject *path_obj, *uid_obj = Py_None, *gid_obj = Py_None;
    const char *path;
    moonlet_dummy_config cfg;
    moonlet_dummy_config_init(&cfg, sizeof cfg);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UO&O&O&O&|OOO&:_connect_dummy", kwl, &path_obj,
                                     conv_opt_str, &cfg.default_tenant, conv_u32,
                                     &cfg.rpc_timeout_ms, conv_u64, &cfg.staging_bytes, conv_u32,
                                     &cfg.max_connections, &uid_obj, &gid_obj, conv_u64,
                                     &cfg.gpu_staging_size))
        return NULL;
    if (uid_obj != Py_None) {
        if (!conv_u32(uid_obj, &cfg.peer_uid))
            return NULL;
        cfg.peer_uid_set = true;
    }
    if (gid_obj != Py_None) {
        if (!conv_u32(gid_obj, &cfg.peer_gid))
            return NULL;
        cfg.peer_gid_set = true;
    }
    if (!ml_can_connect(self, path_obj, &path))
        return NULL;
    moonlet_client *c = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = moonlet_client_create_dummy(path, &cfg, &c);
    Py_END_ALLOW_THREADS
    return ml_connect_result(self, rc, c, "connect_dummy", ML_KIND_DUMMY, path_obj,
                             cfg.default_tenant);
}

PyDoc_STRVAR(Client_close_doc,
             "close()\n--\n\nDisconnects and frees the client; waits for calls in flight on other "
             "threads.  Buffers registered with it are unregistered (the memory stays yours).  "
             "Calling it again does nothing; any other call afterwards raises StoreError "
             "(UNAVAILABLE_IN_CURRENT_STATUS).");

static PyObject *Client_close(ClientObject *self, PyObject *unused)
{
    for (SharedObject *b = self->shared; b; b = b->next) {
        if (b->exports > 0) {
            PyErr_SetString(PyExc_BufferError,
                            "close: a view of a SharedBuffer of this store is still alive "
                            "(release memoryviews / arrays of it first)");
            return NULL;
        }
    }
    /* the client frees alloc_shared memory with itself */
    while (self->shared)
        ml_shared_unlink(self->shared);
    ml_close(self);
    Py_RETURN_NONE;
}

/* ---- objects ------------------------------------------------------------------------ */

static PyObject *ml_put_common(ClientObject *self, PyObject *args, PyObject *kw, bool upsert)
{
    static char *kwl[] = {"key", "value", NULL};
    const char *key;
    Py_buffer value;
    ml_putkw pk;
    if (!ml_parse_put(args, kw, upsert ? "O&y*:upsert" : "O&y*:put", kwl, &pk, conv_key, &key,
                      &value))
        return NULL;
    int (*fn)(moonlet_client *, const char *, const void *, size_t,
              const moonlet_put_options *) = upsert ? moonlet_client_upsert : moonlet_client_put;
    int rc;
    ML_CALL(self, rc, fn(c, key, value.buf, (size_t)value.len, &pk.o));
    PyBuffer_Release(&value);
    return ml_none_or_raise(rc, upsert ? "upsert" : "put");
}

PyDoc_STRVAR(Client_put_doc,
             "put(key, value, *, tenant_id=None, replica_num=0, soft_pin=False)\n--\n\n"
             "Stores the bytes-like value under key (0 bytes is a valid object).  replica_num 0 "
             "means the connection's default.  Raises StoreError: OBJECT_ALREADY_EXISTS (-705), "
             "NO_AVAILABLE_HANDLE (-200), INVALID_KEY (-400), TRANSFER_FAIL (-800), ...");

PyDoc_STRVAR(Client_upsert_doc,
             "upsert(key, value, *, tenant_id=None, replica_num=0, soft_pin=False)\n--\n\n"
             "Put, or replace an existing object (remove then put; not atomic).  An object under "
             "a read lease cannot be replaced: StoreError OBJECT_HAS_LEASE (-706).");

ML_FLAG_PAIR(Client_put, Client_upsert, ml_put_common)

PyDoc_STRVAR(Client_get_doc,
             "get(key, *, tenant_id=None) -> bytes\n--\n\n"
             "Reads an object (and leases it).  Raises StoreError OBJECT_NOT_FOUND (-704), "
             "REPLICA_IS_NOT_READY (-703), LEASE_EXPIRED (-707), TRANSFER_FAIL (-800).");

/* get / _inspect_json: a key's object as bytes (moonlet_client_get_alloc,
 * which leases it), or the master's InspectKey of it as the JSON text of the
 * C API (moonlet_client_inspect_key, which never leases; moonlet.Store.inspect()
 * turns it into a dict).  Both results are library memory, freed here. */
static PyObject *ml_get_alloc(ClientObject *self, PyObject *args, PyObject *kw, bool inspect)
{
    const char *key, *tenant;
    if (!ml_parse_key(args, kw, inspect ? "_inspect_json" : "get", &key, &tenant))
        return NULL;
    void *buf = NULL;
    char *json = NULL;
    size_t len = 0;
    int rc;
    ML_CALL(self, rc, inspect ? moonlet_client_inspect_key(c, key, tenant, &json)
                              : moonlet_client_get_alloc(c, key, tenant, &buf, &len));
    if (rc)
        return ml_raise(rc, inspect ? "inspect" : "get", NULL);
    PyObject *out = inspect                ? PyUnicode_FromString(json)
                    : len <= PY_SSIZE_T_MAX ? PyBytes_FromStringAndSize(buf, (Py_ssize_t)len)
                                            : PyErr_NoMemory();
    moonlet_free(buf);
    moonlet_free(json);
    return out;
}

PyDoc_STRVAR(Client_get_size_doc,
             "get_size(key, *, tenant_id=None) -> int\n--\n\n"
             "The size of a readable object in bytes (asks like a get, so it leases it too).");

static PyObject *Client_get_size(ClientObject *self, PyObject *args, PyObject *kw)
{
    const char *key, *tenant;
    uint64_t size = 0;
    int rc;
    if (!ml_parse_key(args, kw, "get_size", &key, &tenant))
        return NULL;
    ML_CALL(self, rc, moonlet_client_get_size(c, key, tenant, &size));
    return ml_u64_or_raise(rc, "get_size", size);
}

/* remove / _remove_force.  force (Mooncake's remove(key, force=True), through
 * moonlet.mooncake) also removes an object under a read lease
 * (moonlet_client_remove_force). */
static PyObject *ml_remove(ClientObject *self, PyObject *args, PyObject *kw, bool force)
{
    const char *key, *tenant;
    if (!ml_parse_key(args, kw, force ? "_remove_force" : "remove", &key, &tenant))
        return NULL;
    int (*fn)(moonlet_client *, const char *, const char *) =
        force ? moonlet_client_remove_force : moonlet_client_remove;
    int rc;
    ML_CALL(self, rc, fn(c, key, tenant));
    return ml_none_or_raise(rc, force ? "remove(force)" : "remove");
}

/* remove_all / _remove_all_force (force: Mooncake's remove_all(force=True),
 * also objects under a read lease). */
static PyObject *ml_remove_all(ClientObject *self, PyObject *args, PyObject *kw, bool force)
{
    const char *tenant;
    if (!ml_parse_tenant(args, kw, force ? "_remove_all_force" : "remove_all", &tenant))
        return NULL;
    int (*fn)(moonlet_client *, const char *, uint64_t *) =
        force ? moonlet_client_remove_all_force : moonlet_client_remove_all;
    uint64_t n = 0;
    int rc;
    ML_CALL(self, rc, fn(c, tenant, &n));
    return ml_u64_or_raise(rc, force ? "remove_all(force)" : "remove_all", n);
}

PyDoc_STRVAR(Client_remove_doc,
             "remove(key, *, tenant_id=None)\n--\n\n"
             "Removes an object.  StoreError OBJECT_NOT_FOUND (-704), OBJECT_HAS_LEASE (-706), "
             "REPLICA_IS_NOT_READY (-703).");

PyDoc_STRVAR(Client_remove_force_doc,
             "_remove_force(key, *, tenant_id=None)\n--\n\n"
             "remove that also removes an object under a read lease (Mooncake's force).");

ML_FLAG_PAIR(Client_remove, Client_remove_force, ml_remove)
PyDoc_STRVAR(Client_remove_all_doc,
             "remove_all(*, tenant_id=None) -> int\n--\n\n"
             "Removes every object of the tenant that holds no lease and has no put in progress; "
             "returns how many were removed.");

PyDoc_STRVAR(Client_remove_all_force_doc,
             "_remove_all_force(*, tenant_id=None) -> int\n--\n\n"
             "remove_all that also removes objects under a read lease (Mooncake's force).");

ML_FLAG_PAIR(Client_remove_all, Client_remove_all_force, ml_remove_all)

PyDoc_STRVAR(Client_inspect_json_doc,
             "_inspect_json(key, *, tenant_id=None) -> str\n--\n\n"
             "The master's InspectKey result as JSON (moonlet_client_inspect_key); never leases.  "
             "moonlet.Store.inspect() parses it.");

ML_FLAG_PAIR(Client_get, Client_inspect_json, ml_get_alloc)

/* ---- existence and probes ---------------------------------------------------------------- */

static PyObject *ml_exist_one(ClientObject *self, PyObject *args, PyObject *kw, bool probe)
{
    const char *key, *tenant;
    if (!ml_parse_key(args, kw, probe ? "probe_key" : "is_exist", &key, &tenant))
        return NULL;
    int (*fn)(moonlet_client *, const char *, const char *, bool *) =
        probe ? moonlet_client_probe_key : moonlet_client_exist_key;
    bool ex = false;
    int rc;
    ML_CALL(self, rc, fn(c, key, tenant, &ex));
    if (rc)
        return ml_raise(rc, probe ? "probe_key" : "is_exist", NULL);
    return PyBool_FromLong(ex);
}

PyDoc_STRVAR(Client_is_exist_doc,
             "is_exist(key, *, tenant_id=None) -> bool\n--\n\n"
             "Whether a readable object exists.  Mooncake semantics: a hit is leased.");

PyDoc_STRVAR(Client_probe_key_doc,
             "probe_key(key, *, tenant_id=None) -> bool\n--\n\n"
             "Point-in-time existence; never grants or extends a lease.");

ML_FLAG_PAIR(Client_is_exist, Client_probe_key, ml_exist_one)

/* A list of n ints from codes[], or of bools when every code is 0 or 1 and
 * as_bool is set. */
static PyObject *ml_result_list(const int32_t *codes, size_t n, bool as_bool)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    if (!l)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *v;
        if (as_bool) {
            v = codes[i] ? Py_True : Py_False;
            Py_INCREF(v);
        } else {
            v = PyLong_FromLong(codes[i]);
            if (!v) {
                Py_DECREF(l);
                return NULL;
            }
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    return l;
}

/* batch_is_exist / batch_probe_key: list[bool], or StoreError (with .results,
 * the per-key 1 / 0 / negative codes) when any key failed.  codes=True gives
 * the per-key ints instead of raising for per-key errors (Mooncake's form). */
static PyObject *ml_exist_batch(ClientObject *self, PyObject *args, PyObject *kw, bool probe)
{
    static char *kwl_exist[] = {"keys", "tenant_id", "codes", NULL};
    static char *kwl_probe[] = {"keys", "policy", "tenant_id", "codes", NULL};
    PyObject *keys_obj, *policy_obj = Py_None;
    const char *tenant = NULL;
    int as_codes = 0;
    int ok = probe ? PyArg_ParseTupleAndKeywords(args, kw, "O|O$O&p:batch_probe_key", kwl_probe,
                                                 &keys_obj, &policy_obj, conv_tenant, &tenant,
                                                 &as_codes)
                   : PyArg_ParseTupleAndKeywords(args, kw, "O|$O&p:batch_is_exist", kwl_exist,
                                                 &keys_obj, conv_tenant, &tenant, &as_codes);
    if (!ok)
        return NULL;
    moonlet_grant_lease_policy pol;
    if (probe && ml_policy(policy_obj, &pol))
        return NULL;
    ml_keys k;
    if (ml_keys_init(&k, keys_obj))
        return NULL;
    int32_t stack[256];
    int32_t *r = k.n <= 256 ? stack : PyMem_Malloc(k.n * sizeof(*r));
    if (!r) {
        ml_keys_free(&k);
        return PyErr_NoMemory();
    }
    int rc;
    if (probe)
        ML_CALL(self, rc, moonlet_client_batch_probe_key(c, k.keys, k.n, pol, tenant, r));
    else
        ML_CALL(self, rc, moonlet_client_batch_exist_key(c, k.keys, k.n, tenant, r));
    const char *what = probe ? "batch_probe_key" : "batch_is_exist";
    PyObject *out = NULL;
    if (rc) {
        ml_raise(rc, what, NULL);
    } else {
        bool failed = false;
        for (size_t i = 0; i < k.n && !failed; i++)
            failed = r[i] < 0 || r[i] > 1;
        if (failed && !as_codes) {
            PyObject *codes = ml_result_list(r, k.n, false);
            if (codes)
                ml_raise_batch(what, k.keys, r, k.n, codes);
            Py_XDECREF(codes);
        } else {
            out = ml_result_list(r, k.n, !as_codes);
        }
    }
    if (r != stack)
        PyMem_Free(r);
    ml_keys_free(&k);
    return out;
}

PyDoc_STRVAR(Client_batch_replicas_json_doc,
             "_batch_replicas_json(keys, *, tenant_id=None) -> str\n--\n\n"
             "The readable replicas of every key, one master call for the batch, as JSON "
             "(moonlet_client_batch_replicas: an entry per key, {size, replicas} or {error}); "
             "each object found is leased.  moonlet.Store.batch_replicas() parses it.");

static PyObject *Client_batch_replicas_json(ClientObject *self, PyObject *args, PyObject *kw)
{
    ml_keys k;
    const char *tenant;
    if (!ml_parse_keys(args, kw, "_batch_replicas_json", &k, &tenant))
        return NULL;
    char *json = NULL;
    int rc;
    ML_CALL(self, rc, moonlet_client_batch_replicas(c, k.keys, k.n, tenant, &json));
    ml_keys_free(&k);
    if (rc)
        return ml_raise(rc, "batch_replicas", NULL);
    PyObject *out = PyUnicode_FromString(json);
    moonlet_free(json);
    return out;
}

PyDoc_STRVAR(Client_batch_is_exist_doc,
             "batch_is_exist(keys, *, tenant_id=None) -> list[bool]\n--\n\n"
             "is_exist for many keys in one round trip; every hit is leased.  A per-key error "
             "raises StoreError with .results (1 / 0 / negative code per key).");

PyDoc_STRVAR(Client_batch_probe_key_doc,
             "batch_probe_key(keys, policy=None, *, tenant_id=None) -> list[bool]\n--\n\n"
             "BatchProbeKey with a GrantLeasePolicy (None: NONE, nothing leased).  With "
             "LAST_HIT_ONLY and candidate_size k, the keys are len(keys)/k candidates of k "
             "contiguous keys; the last complete one is leased and its positions are the only "
             "True values.  The master judges the policy: an unknown mode, a candidate_size of 0 "
             "or one not dividing len(keys) raises StoreError INVALID_PARAMS (-600).  A per-key "
             "error raises StoreError with .results.");

ML_FLAG_PAIR(Client_batch_is_exist, Client_batch_probe_key, ml_exist_batch)

/* ---- ProbeResume: the K3 lookup in one round trip -------------------------------------- */

PyDoc_STRVAR(Client_probe_resume_doc,
             "probe_resume(kv_keys, kda_keys, candidate_size, boundaries, *, tenant_id=None)\n--\n\n"
             "The K3 lookup in one round trip (ProbeResume): the KV prefix (leading present\n"
             "kv_keys), the last candidate of candidate_size kda_keys whose boundary (leading\n"
             "KV keys it needs) lies within it and whose keys all exist, and the selected-only\n"
             "mask over kda_keys.  Leases exactly that candidate's keys and the KV keys below its\n"
             "boundary; nothing when none is selected.  Returns (kv_prefix, selected or None,\n"
             "mask).  StoreError: INVALID_PARAMS, INVALID_KEY, INVALID_VERSION (the master\n"
             "predates ProbeResume).  Releases the GIL.");

/* probe_resume(kv_keys, kda_keys, candidate_size, boundaries, *, tenant_id=None)
 *   -> (kv_prefix, selected or None, list[bool] over kda_keys)
 * StoreError with the code otherwise (INVALID_VERSION: the master predates it). */
static PyObject *Client_probe_resume(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"kv_keys", "kda_keys", "candidate_size", "boundaries", "tenant_id",
                          NULL};
    PyObject *kv_obj, *kda_obj, *b_obj;
    unsigned long long cs;
    const char *tenant = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOKO|$O&:probe_resume", kwl, &kv_obj, &kda_obj,
                                     &cs, &b_obj, conv_tenant, &tenant))
        return NULL;
    ml_keys kv, kda;
    if (ml_keys_init(&kv, kv_obj))
        return NULL;
    if (ml_keys_init(&kda, kda_obj)) {
        ml_keys_free(&kv);
        return NULL;
    }
    PyObject *out = NULL, *bt = PySequence_Tuple(b_obj);
    size_t nb = bt ? (size_t)PyTuple_GET_SIZE(bt) : 0;
    uint64_t *bounds = bt ? PyMem_Malloc((nb ? nb : 1) * sizeof(*bounds)) : NULL;
    int32_t *mask = bounds ? PyMem_Malloc((kda.n ? kda.n : 1) * sizeof(*mask)) : NULL;
    if (bt && !mask)
        PyErr_NoMemory();
    for (size_t i = 0; mask && i < nb; i++) {
        bounds[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(bt, (Py_ssize_t)i));
        if (PyErr_Occurred())
            goto done;
    }
    if (mask && kda.n && (!cs || kda.n % cs || kda.n / cs != nb)) {
        PyErr_Format(PyExc_ValueError, "probe_resume: %zu boundaries for %zu KDA keys in "
                     "candidates of %llu", nb, kda.n, cs);
        goto done;
    }
    if (mask) {
        moonlet_probe_resume_result r;
        int rc;
        ML_CALL(self, rc, moonlet_client_probe_resume(c, kv.keys, kv.n, kda.keys, kda.n, cs,
                                                      bounds, tenant, &r, mask));
        if (rc) {
            ml_raise(rc, "probe_resume", NULL);
        } else {
            PyObject *m = ml_result_list(mask, kda.n, true);
            if (m && r.selected >= 0)
                out = Py_BuildValue("(KLN)", (unsigned long long)r.kv_prefix,
                                    (long long)r.selected, m);
            else if (m)
                out = Py_BuildValue("(KON)", (unsigned long long)r.kv_prefix, Py_None, m);
        }
    }
done:
    PyMem_Free(mask);
    PyMem_Free(bounds);
    Py_XDECREF(bt);
    ml_keys_free(&kda);
    ml_keys_free(&kv);
    return out;
}

/* ---- zero-copy buffers ----------------------------------------------------------------- */

PyDoc_STRVAR(Client_register_buffer_doc,
             "register_buffer(address, size)\n--\n\n"
             "Registers [address, address+size) (an int address, e.g. ctypes.addressof(buf)) as a "
             "source or destination of put_from / get_into.  The memory must stay valid until "
             "unregistered.  StoreError INVALID_PARAMS (-600) for 0 / NULL or a base already "
             "registered.");

PyDoc_STRVAR(Client_unregister_buffer_doc,
             "unregister_buffer(address)\n--\n\n"
             "Unregisters the buffer registered at address (INVALID_PARAMS when none is).");

/* register_buffer(address, size) / unregister_buffer(address). */
static PyObject *ml_register(ClientObject *self, PyObject *args, PyObject *kw, bool unregister)
{
    static char *reg_kwl[] = {"address", "size", NULL}, *unreg_kwl[] = {"address", NULL};
    void *addr;
    size_t size = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw,
                                     unregister ? "O&:unregister_buffer" : "O&O&:register_buffer",
                                     unregister ? unreg_kwl : reg_kwl, conv_addr, &addr,
                                     conv_size, &size))
        return NULL;
    int rc;
    ML_CALL(self, rc, unregister ? moonlet_client_unregister_buffer(c, addr)
                                 : moonlet_client_register_buffer(c, addr, size));
    return ml_none_or_raise(rc, unregister ? "unregister_buffer" : "register_buffer");
}

ML_FLAG_PAIR(Client_register_buffer, Client_unregister_buffer, ml_register)

PyDoc_STRVAR(Client_put_from_doc,
             "put_from(key, address, size, *, tenant_id=None, replica_num=0, soft_pin=False)\n--\n\n"
             "put from registered memory without a copy; [address, address+size) must lie in one "
             "registered buffer, else StoreError INVALID_PARAMS (-600).");

static PyObject *Client_put_from(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"key", "address", "size", NULL};
    const char *key;
    void *addr;
    size_t size;
    ml_putkw pk;
    if (!ml_parse_put(args, kw, "O&O&O&:put_from", kwl, &pk, conv_key, &key, conv_addr, &addr, conv_size, &size))
        return NULL;
    int rc;
    ML_CALL(self, rc, moonlet_client_put_from(c, key, addr, size, &pk.o));
    return ml_none_or_raise(rc, "put_from");
}

PyDoc_STRVAR(Client_get_into_doc,
             "get_into(key, address, size, *, tenant_id=None) -> int\n--\n\n"
             "Reads an object into registered memory of `size` bytes; returns the bytes read.  "
             "StoreError BUFFER_OVERFLOW (-10) when the object is larger, INVALID_PARAMS (-600) "
             "for memory outside a registered buffer.");

static PyObject *Client_get_into(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"key", "address", "size", "tenant_id", NULL};
    const char *key, *tenant = NULL;
    void *addr;
    size_t size, len = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&|$O&:get_into", kwl, conv_key, &key,
                                     conv_addr, &addr, conv_size, &size, conv_tenant, &tenant))
        return NULL;
    int rc;
    ML_CALL(self, rc, moonlet_client_get_into(c, key, addr, size, tenant, &len));
    if (rc)
        return ml_raise(rc, "get_into", NULL);
    return PyLong_FromSize_t(len);
}

/* The outcome of a put batch of n keys: None, or StoreError - with .results
 * (0 or the negative code per key) when keys failed one by one (the others
 * were stored). */
static PyObject *ml_put_batch_result(int rc, const char *what, const char *const *keys,
                                     const int32_t *results, size_t n)
{
    if (rc == ML_CLOSED || (rc && n == 0))
        return ml_raise(rc, what, NULL);
    if (rc) {
        PyObject *res = ml_result_list(results, n, false);
        if (res)
            ml_raise_batch(what, keys, results, n, res);
        Py_XDECREF(res);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The arrays of a batch over the caller's memory: a zero-copy batch
 * (batch_put_from / batch_get_into: addrs, sizes, lens) or a multi-buffer
 * one (_batch_put_multi / _batch_get_multi: iovcnt, iov, lens).  What a
 * kind does not use stays NULL. */
typedef struct {
    ml_keys k;
    void **addrs;
    size_t *sizes;
    size_t *iovcnt;    /* multi: n entries, key i's ranges are the next iovcnt[i] of iov */
    struct iovec *iov; /* multi: every range, key 0's first */
    size_t *lens;      /* bytes read per key */
    int32_t *results;
} ml_batch;

/* ml_batch_args()'s keyword names of the two kinds. */
static char *ml_zbatch_kwl[] = {"keys", "addresses", "sizes", "tenant_id", NULL};
static char *ml_multi_kwl[] = {"keys", "all_addresses", "all_sizes", "tenant_id", NULL};

static void ml_batch_free(ml_batch *b)
{
    ml_keys_free(&b->k);
    PyMem_Free(b->addrs);
    PyMem_Free(b->sizes);
    PyMem_Free(b->iovcnt);
    PyMem_Free(b->iov);
    PyMem_Free(b->lens);
    PyMem_Free(b->results);
}

/* ml_batch_args()'s init of a zero-copy batch: st is an ml_batch. */
static int ml_zbatch_init(void *st, PyObject *keys, PyObject *addrs, PyObject *sizes)
{
    ml_batch *z = st;
    memset(z, 0, sizeof(*z));
    if (ml_keys_init(&z->k, keys))
        return -1;
    size_t n = z->k.n ? z->k.n : 1;
    z->addrs = PyMem_Calloc(n, sizeof(*z->addrs));
    z->sizes = PyMem_Calloc(n, sizeof(*z->sizes));
    z->lens = PyMem_Calloc(n, sizeof(*z->lens));
    z->results = PyMem_Calloc(n, sizeof(*z->results));
    if (!z->addrs || !z->sizes || !z->lens || !z->results) {
        ml_batch_free(z);
        PyErr_NoMemory();
        return -1;
    }
    if (ml_seq_conv(addrs, z->k.n, "addresses", conv_addr, z->addrs, sizeof(*z->addrs)) ||
        ml_seq_conv(sizes, z->k.n, "sizes", conv_size, z->sizes, sizeof(*z->sizes))) {
        ml_batch_free(z);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(Client_batch_put_from_doc,
             "batch_put_from(keys, addresses, sizes, *, tenant_id=None, replica_num=0, "
             "soft_pin=False)\n--\n\n"
             "put_from for many keys, every transfer in one batch.  Any failed key raises "
             "StoreError with .results (0 or the negative code per key); the others were stored.");

static PyObject *Client_batch_put_from(ClientObject *self, PyObject *args, PyObject *kw)
{
    ml_putkw pk;
    ml_batch z;
    if (ml_batch_args(args, kw, "batch_put_from", ml_zbatch_kwl, &pk, NULL, ml_zbatch_init, &z))
        return NULL;
    int rc;
    ML_CALL(self, rc,
            moonlet_client_batch_put_from(c, z.k.keys, z.k.n, (const void *const *)z.addrs,
                                          z.sizes, &pk.o, z.results));
    PyObject *out = ml_put_batch_result(rc, "batch_put_from", z.k.keys, z.results, z.k.n);
    ml_batch_free(&z);
    return out;
}

PyDoc_STRVAR(Client_batch_get_into_doc,
             "batch_get_into(keys, addresses, sizes, *, tenant_id=None) -> list[int]\n--\n\n"
             "get_into for many keys; returns the bytes read per key.  Any failed key raises "
             "StoreError with .results (bytes read, or the negative code, per key).");

static PyObject *Client_batch_get_into(ClientObject *self, PyObject *args, PyObject *kw)
{
    const char *tenant;
    ml_batch z;
    if (ml_batch_args(args, kw, "batch_get_into", ml_zbatch_kwl, NULL, &tenant, ml_zbatch_init,
                      &z))
        return NULL;
    int rc;
    ML_CALL(self, rc,
            moonlet_client_batch_get_into(c, z.k.keys, z.k.n, z.addrs, z.sizes, tenant,
                                          z.lens, z.results));
    PyObject *out = NULL;
    if (rc == ML_CLOSED || (rc && z.k.n == 0)) {
        ml_raise(rc, "batch_get_into", NULL);
    } else {
        /* each key's outcome: bytes read, or its negative code */
        PyObject *res = PyList_New((Py_ssize_t)z.k.n);
        for (size_t i = 0; res && i < z.k.n; i++) {
            PyObject *v = z.results[i] ? PyLong_FromLong(z.results[i]) : PyLong_FromSize_t(z.lens[i]);
            if (!v) {
                Py_CLEAR(res);
                break;
            }
            PyList_SET_ITEM(res, (Py_ssize_t)i, v);
        }
        if (res && rc)
            ml_raise_batch("batch_get_into", z.k.keys, z.results, z.k.n, res);
        else
            out = res, res = NULL;
        Py_XDECREF(res);
    }
    ml_batch_free(&z);
    return out;
}

/* ---- copying batches: batch_put, put_parts, batch_get --------------------------------------- */

/*
 * The copying batch calls of the C client (moonlet_client_batch_put /
 * moonlet_client_batch_get) take any memory as scattered ranges and stage
 * it themselves (store/client/client_copy.c); these methods only export the
 * Python values (Py_buffer) or make the bytes objects, describe them as
 * ranges and make the call with the GIL released.  A key's bytes go to a
 * bytes object that nobody else can see until the call returns.
 */
#define ML_GET_TRIES 3 /* reads of an object that grew since its size was learnt */

/* The exported buffers of a copying put, as ranges: key i's are the next
 * iovcnt[i] entries of iov. */
typedef struct {
    Py_buffer *pieces;
    size_t npieces, nheld; /* entries, and how many hold an export */
    struct iovec *iov;
    size_t *iovcnt;
    int32_t *results;
} ml_puts;

static void ml_puts_free(ml_puts *p)
{
    for (size_t i = 0; i < p->nheld; i++)
        PyBuffer_Release(&p->pieces[i]);
    PyMem_Free(p->pieces);
    PyMem_Free(p->iov);
    PyMem_Free(p->iovcnt);
    PyMem_Free(p->results);
}

/* Exports the npieces objects of `objs` (C-contiguous bytes-like) for n
 * keys; the caller fills iovcnt[] after this returns 0. */
static int ml_puts_init(ml_puts *p, PyObject *const *objs, size_t npieces, size_t n)
{
    memset(p, 0, sizeof(*p));
    p->npieces = npieces;
    p->pieces = PyMem_Calloc(npieces ? npieces : 1, sizeof(*p->pieces));
    p->iov = PyMem_Calloc(npieces ? npieces : 1, sizeof(*p->iov));
    p->iovcnt = PyMem_Calloc(n ? n : 1, sizeof(*p->iovcnt));
    p->results = PyMem_Calloc(n ? n : 1, sizeof(*p->results));
    if (!p->pieces || !p->iov || !p->iovcnt || !p->results) {
        ml_puts_free(p);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < npieces; i++) {
        if (PyObject_GetBuffer(objs[i], &p->pieces[i], PyBUF_SIMPLE) < 0) {
            ml_puts_free(p);
            return -1;
        }
        p->nheld++;
        p->iov[i].iov_base = p->pieces[i].buf;
        p->iov[i].iov_len = (size_t)p->pieces[i].len;
    }
    return 0;
}

PyDoc_STRVAR(Client_batch_put_doc,
             "batch_put(keys, values, *, tenant_id=None, replica_num=0, soft_pin=False)\n--\n\n"
             "put for many keys: values[i] (any contiguous bytes-like object) under keys[i], every "
             "transfer in one batch.  The values are copied once, into memory the batch can use "
             "(shared memory the RealClient reads in place, through a DummyClient).  A values "
             "sequence of another length raises ValueError.  Any failed key raises StoreError with "
             ".results (0 or the negative code per key; OBJECT_ALREADY_EXISTS -705 for a key that "
             "exists); the others were stored.");

static PyObject *Client_batch_put(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"keys", "values", NULL};
    PyObject *keys_obj, *values_obj;
    ml_putkw pk;
    if (!ml_parse_put(args, kw, "OO:batch_put", kwl, &pk, &keys_obj, &values_obj))
        return NULL;
    if (PyUnicode_Check(values_obj) || PyBytes_Check(values_obj) ||
        PyByteArray_Check(values_obj) || PyMemoryView_Check(values_obj)) {
        PyErr_SetString(PyExc_TypeError,
                        "values must be a sequence of bytes-like objects, not a single value");
        return NULL;
    }
    ml_keys k;
    if (ml_keys_init(&k, keys_obj))
        return NULL;
    PyObject *values = PySequence_Tuple(values_obj);
    if (!values) {
        ml_keys_free(&k);
        return NULL;
    }
    if ((size_t)PyTuple_GET_SIZE(values) != k.n) {
        PyErr_Format(PyExc_ValueError, "values has %zd entries for %zu keys",
                     PyTuple_GET_SIZE(values), k.n);
        Py_DECREF(values);
        ml_keys_free(&k);
        return NULL;
    }
    ml_puts p;
    if (ml_puts_init(&p, PySequence_Fast_ITEMS(values), k.n, k.n)) {
        Py_DECREF(values);
        ml_keys_free(&k);
        return NULL;
    }
    for (size_t i = 0; i < k.n; i++)
        p.iovcnt[i] = 1;
    int rc;
    ML_CALL(self, rc, moonlet_client_batch_put(c, k.keys, k.n, p.iov, p.iovcnt, &pk.o, p.results));
    PyObject *out = ml_put_batch_result(rc, "batch_put", k.keys, p.results, k.n);
    ml_puts_free(&p);
    Py_DECREF(values);
    ml_keys_free(&k);
    return out;
}

PyDoc_STRVAR(Client_put_parts_doc,
             "put_parts(key, *parts, tenant_id=None, replica_num=0, soft_pin=False)\n--\n\n"
             "put of the concatenation of the bytes-like parts as one object (no parts: an empty "
             "object), copied once.  Raises StoreError as put does.");

static PyObject *Client_put_parts(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {NULL};
    const char *key;
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "put_parts() missing required argument 'key'");
        return NULL;
    }
    PyObject *empty = PyTuple_New(0);
    if (!empty)
        return NULL;
    ml_putkw pk;
    int ok = ml_parse_put(empty, kw, ":put_parts", kwl, &pk);
    Py_DECREF(empty);
    if (!ok || !conv_key(PyTuple_GET_ITEM(args, 0), &key))
        return NULL;
    ml_puts p;
    if (ml_puts_init(&p, PySequence_Fast_ITEMS(args) + 1, (size_t)nargs - 1, 1))
        return NULL;
    p.iovcnt[0] = (size_t)nargs - 1;
    int rc;
    ML_CALL(self, rc, moonlet_client_batch_put(c, &key, 1, p.iov, p.iovcnt, &pk.o, p.results));
    ml_puts_free(&p);
    return ml_none_or_raise(rc, "put_parts");
}

PyDoc_STRVAR(Client_batch_get_doc,
             "batch_get(keys, *, tenant_id=None) -> list[bytes]\n--\n\n"
             "get for many keys, every read in one transfer batch; leases each object read.  It "
             "asks the master twice per batch (BatchGetReplicaList): once for the sizes, once for "
             "the reads.  Any failed key raises StoreError with .results (the bytes, or the "
             "negative code, per key).");

/*
 * batch_get: the first round asks with capacity 0, which reads nothing and
 * learns each object's size (BUFFER_OVERFLOW with its length; an empty
 * object is done); the next reads every such key into a bytes object of
 * that size.  A key whose object grew in between (it was replaced) is read
 * again at its new size, ML_GET_TRIES times at most.
 */
static PyObject *Client_batch_get(ClientObject *self, PyObject *args, PyObject *kw)
{
    ml_keys k;
    const char *tenant;
    if (!ml_parse_keys(args, kw, "batch_get", &k, &tenant))
        return NULL;
    size_t n = k.n, alloc = n ? n : 1;
    PyObject **objs = PyMem_Calloc(alloc, sizeof(*objs));
    size_t *caps = PyMem_Calloc(alloc, sizeof(*caps));
    int32_t *res = PyMem_Calloc(alloc, sizeof(*res));
    unsigned char *pending = PyMem_Calloc(alloc, 1);
    size_t *idx = PyMem_Calloc(alloc, sizeof(*idx));
    const char **skeys = PyMem_Calloc(alloc, sizeof(*skeys));
    struct iovec *siov = PyMem_Calloc(alloc, sizeof(*siov));
    size_t *scnt = PyMem_Calloc(alloc, sizeof(*scnt));
    size_t *slens = PyMem_Calloc(alloc, sizeof(*slens));
    int32_t *sres = PyMem_Calloc(alloc, sizeof(*sres));
    PyObject *out = NULL, *list = NULL;
    bool failed = false;
    if (!objs || !caps || !res || !pending || !idx || !skeys || !siov || !scnt || !slens ||
        !sres) {
        PyErr_NoMemory();
        goto done;
    }
    memset(pending, 1, n);
    for (int round = 0; round <= ML_GET_TRIES; round++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            if (!pending[i])
                continue;
            idx[m] = i;
            skeys[m] = k.keys[i];
            siov[m].iov_base = objs[i] ? PyBytes_AS_STRING(objs[i]) : NULL;
            siov[m].iov_len = caps[i];
            scnt[m] = caps[i] ? 1 : 0;
            m++;
        }
        if (m == 0)
            break;
        int rc;
        ML_CALL(self, rc, moonlet_client_batch_get(c, skeys, m, siov, scnt, tenant, slens, sres));
        if (rc == ML_CLOSED) {
            ml_raise(rc, "batch_get", NULL);
            goto done;
        }
        for (size_t j = 0; j < m; j++) {
            size_t i = idx[j];
            if (sres[j] == MOONLET_OK) {
                pending[i] = 0;
                res[i] = MOONLET_OK;
                if (!objs[i] || slens[j] < caps[i]) {
                    /* empty, or the object shrank since its size was learnt */
                    PyObject *b = PyBytes_FromStringAndSize(objs[i] ? PyBytes_AS_STRING(objs[i])
                                                                    : NULL,
                                                            objs[i] ? (Py_ssize_t)slens[j] : 0);
                    if (!b)
                        goto done;
                    Py_XSETREF(objs[i], b);
                }
            } else if (sres[j] == MOONLET_ERR_BUFFER_OVERFLOW && round < ML_GET_TRIES &&
                       slens[j] > caps[i]) {
                if (slens[j] > PY_SSIZE_T_MAX) {
                    PyErr_NoMemory();
                    goto done;
                }
                caps[i] = slens[j];
                Py_XSETREF(objs[i], PyBytes_FromStringAndSize(NULL, (Py_ssize_t)caps[i]));
                if (!objs[i])
                    goto done;
            } else {
                pending[i] = 0;
                res[i] = sres[j];
                Py_CLEAR(objs[i]);
            }
        }
    }
    list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        if (pending[i]) /* kept growing */
            res[i] = MOONLET_ERR_BUFFER_OVERFLOW;
        PyObject *v;
        if (res[i] == MOONLET_OK) {
            v = objs[i];
            objs[i] = NULL;
        } else {
            failed = true;
            v = PyLong_FromLong(res[i]);
        }
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    if (list && failed)
        ml_raise_batch("batch_get", k.keys, res, n, list);
    else
        out = list, list = NULL;
    Py_XDECREF(list);
done:
    for (size_t i = 0; objs && i < n; i++)
        Py_XDECREF(objs[i]);
    PyMem_Free(objs);
    PyMem_Free(caps);
    PyMem_Free(res);
    PyMem_Free(pending);
    PyMem_Free(idx);
    PyMem_Free(skeys);
    PyMem_Free(siov);
    PyMem_Free(scnt);
    PyMem_Free(slens);
    PyMem_Free(sres);
    ml_keys_free(&k);
    return out;
}

/* ---- several buffers per key: the multi-buffer batches of moonlet.mooncake ----------------- */

/*
 * _batch_put_multi / _batch_get_multi: key i's object is the concatenation of
 * the caller's ranges all_addresses[i][j] .. + all_sizes[i][j] (Mooncake's
 * batch_put_from_multi_buffers / batch_get_into_multi_buffers, vLLM's layout
 * of one block over every layer's KV tensor).  The client's batch calls take
 * one buffer per key, so the ranges are gathered into (scattered out of) one
 * staging region per call, the region batch_put / batch_get use: one memcpy
 * per range on this side, every key's transfer in one batch.
 *
 * The addresses are the caller's raw memory and are copied from / to as
 * given: moonlet.mooncake checks each range against the buffers registered
 * through it before calling (these methods cannot).  Every key's outcome
 * comes back in a list (0 or a negative code for a put; bytes read or a
 * negative code for a get), never as StoreError; a closed store raises.
 */

/* Keys, and per key a sequence of addresses and one of sizes of the same
 * length (ml_batch_args()'s init of a multi-buffer batch: st is an ml_batch). */
static int ml_multi_init(void *st, PyObject *keys, PyObject *all_addrs, PyObject *all_sizes)
{
    ml_batch *m = st;
    memset(m, 0, sizeof(*m));
    PyObject *ta = NULL, *ts = NULL;
    void **a = NULL;
    size_t *s = NULL;
    if (ml_keys_init(&m->k, keys))
        return -1;
    size_t n = m->k.n, alloc = n ? n : 1, npieces = 0;
    ta = PySequence_Tuple(all_addrs);
    ts = ta ? PySequence_Tuple(all_sizes) : NULL;
    if (!ts)
        goto fail;
    if ((size_t)PyTuple_GET_SIZE(ta) != n || (size_t)PyTuple_GET_SIZE(ts) != n) {
        PyErr_Format(PyExc_ValueError, "%zd address lists and %zd size lists for %zu keys",
                     PyTuple_GET_SIZE(ta), PyTuple_GET_SIZE(ts), n);
        goto fail;
    }
    m->iovcnt = PyMem_Calloc(alloc, sizeof(*m->iovcnt));
    m->lens = PyMem_Calloc(alloc, sizeof(*m->lens));
    m->results = PyMem_Calloc(alloc, sizeof(*m->results));
    if (!m->iovcnt || !m->lens || !m->results) {
        PyErr_NoMemory();
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        Py_ssize_t len = PyObject_Length(PyTuple_GET_ITEM(ta, (Py_ssize_t)i));
        if (len < 0)
            goto fail;
        m->iovcnt[i] = (size_t)len;
        npieces += (size_t)len;
    }
    m->iov = PyMem_Calloc(npieces ? npieces : 1, sizeof(*m->iov));
    a = PyMem_Calloc(npieces ? npieces : 1, sizeof(*a));
    s = PyMem_Calloc(npieces ? npieces : 1, sizeof(*s));
    if (!m->iov || !a || !s) {
        PyErr_NoMemory();
        goto fail;
    }
    for (size_t i = 0, at = 0; i < n; at += m->iovcnt[i], i++) {
        if (ml_seq_conv(PyTuple_GET_ITEM(ta, (Py_ssize_t)i), m->iovcnt[i], "addresses",
                        conv_addr, a + at, sizeof(*a)) ||
            ml_seq_conv(PyTuple_GET_ITEM(ts, (Py_ssize_t)i), m->iovcnt[i], "sizes", conv_size,
                        s + at, sizeof(*s)))
            goto fail;
        for (size_t p = at; p < at + m->iovcnt[i]; p++) {
            m->iov[p].iov_base = a[p];
            m->iov[p].iov_len = s[p];
        }
    }
    PyMem_Free(a);
    PyMem_Free(s);
    Py_DECREF(ta);
    Py_DECREF(ts);
    return 0;
fail:
    PyMem_Free(a);
    PyMem_Free(s);
    Py_XDECREF(ta);
    Py_XDECREF(ts);
    ml_batch_free(m);
    return -1;
}

static PyObject *ml_multi_results(const ml_batch *m, bool sizes)
{
    PyObject *res = PyList_New((Py_ssize_t)m->k.n);
    for (size_t i = 0; res && i < m->k.n; i++) {
        PyObject *v = sizes && m->results[i] == MOONLET_OK ? PyLong_FromSize_t(m->lens[i])
                                                           : PyLong_FromLong(m->results[i]);
        if (!v) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, (Py_ssize_t)i, v);
    }
    return res;
}

/* _batch_put_multi (get false) / _batch_get_multi (get true). */
static PyObject *ml_batch_multi(ClientObject *self, PyObject *args, PyObject *kw, bool get)
{
    ml_putkw pk;
    const char *tenant = NULL;
    ml_batch m;
    if (ml_batch_args(args, kw, get ? "_batch_get_multi" : "_batch_put_multi", ml_multi_kwl,
                      get ? NULL : &pk, &tenant, ml_multi_init, &m))
        return NULL;
    int rc = MOONLET_OK;
    if (m.k.n && get)
        ML_CALL(self, rc, moonlet_client_batch_get(c, m.k.keys, m.k.n, m.iov, m.iovcnt, tenant,
                                                   m.lens, m.results));
    else if (m.k.n)
        ML_CALL(self, rc,
                moonlet_client_batch_put(c, m.k.keys, m.k.n, m.iov, m.iovcnt, &pk.o, m.results));
    PyObject *out =
        rc == ML_CLOSED
            ? ml_raise(rc, get ? "batch_get_into_multi_buffers" : "batch_put_from_multi_buffers",
                       NULL)
            : ml_multi_results(&m, get);
    ml_batch_free(&m);
    return out;
}

PyDoc_STRVAR(Client_batch_put_multi_doc,
             "_batch_put_multi(keys, all_addresses, all_sizes, *, tenant_id=None, replica_num=0, "
             "soft_pin=False) -> list[int]\n--\n\n"
             "Key i is the concatenation of the ranges (all_addresses[i][j], all_sizes[i][j]), "
             "gathered through staging; 0 or a negative code per key.  The addresses are not "
             "checked: moonlet.mooncake checks them against its registered buffers.");

PyDoc_STRVAR(Client_batch_get_multi_doc,
             "_batch_get_multi(keys, all_addresses, all_sizes, *, tenant_id=None) -> list[int]\n--\n\n"
             "Reads key i through staging and scatters it over its ranges in order; bytes read or "
             "a negative code per key.  The addresses are not checked (see _batch_put_multi).");

ML_FLAG_PAIR(Client_batch_put_multi, Client_batch_get_multi, ml_batch_multi)

/* ---- accessors ---------------------------------------------------------------------------- */

static PyObject *Client_get_protocol(ClientObject *self, void *closure)
{
    const char *p = NULL;
    /* without the GIL: a close() waiting for calls in flight holds readers off */
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&self->lock);
    if (self->client)
        p = moonlet_client_protocol(self->client);
    pthread_rwlock_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    if (!p)
        Py_RETURN_NONE;
    return PyUnicode_FromString(p);
}

static PyObject *Client_get_local_endpoint(ClientObject *self, void *closure)
{
    char buf[MOONLET_MAX_ENDPOINT_BYTES + 1];
    int rc;
    ML_CALL(self, rc, moonlet_client_local_endpoint(c, buf, sizeof(buf)));
    if (rc)
        Py_RETURN_NONE;
    return PyUnicode_FromString(buf);
}

PyDoc_STRVAR(Client_gpu_stats_doc,
"gpu_stats() -> dict\n--\n\n"
"How this client serves device (GPU) memory: buffers (device buffers\n"
"registered), in_place (of which the NIC moves in place: GPUDirect RDMA),\n"
"staged_calls and staged_bytes (through pinned host memory), pinned_bytes\n"
"(pinned staging held now) and pinned_bound (its limit, gpu_staging_size).");

static int ml_gpu_stats(moonlet_client *c, moonlet_client_gpu_stats *st)
{
    moonlet_client_gpu_get_stats(c, st);
    return 0;
}

static PyObject *Client_gpu_stats(ClientObject *self, PyObject *unused)
{
    moonlet_client_gpu_stats st;
    int rc;
    ML_CALL(self, rc, ml_gpu_stats(c, &st));
    if (rc)
        return ml_raise(rc, "gpu_stats", NULL);
    return Py_BuildValue("{s:I,s:I,s:K,s:K,s:n,s:n}", "buffers", st.buffers, "in_place",
                         st.in_place, "staged_calls", (unsigned long long)st.staged_calls,
                         "staged_bytes", (unsigned long long)st.staged_bytes, "pinned_bytes",
                         (Py_ssize_t)st.pinned_bytes, "pinned_bound", (Py_ssize_t)st.pinned_bound);
}

static PyObject *Client_get_http_port(ClientObject *self, void *closure)
{
    int port;
    ML_CALL(self, port, moonlet_client_http_port(c));
    if (port <= 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(port);
}

static PyObject *Client_get_closed(ClientObject *self, void *closure)
{
    return PyBool_FromLong(self->client == NULL);
}

static PyObject *Client_get_kind(ClientObject *self, void *closure)
{
    static const char *const names[] = {"none", "direct", "dummy"};
    return PyUnicode_FromString(names[self->kind]);
}

static PyObject *Client_get_target(ClientObject *self, void *closure)
{
    Py_INCREF(self->target);
    return self->target;
}

static PyObject *Client_get_tenant(ClientObject *self, void *closure)
{
    Py_INCREF(self->tenant);
    return self->tenant;
}

/* ---- tables ---------------------------------------------------------------------------------- */

PyDoc_STRVAR(ml_alloc_buffer_doc,
             "alloc_buffer(size) -> SharedBuffer\n--\n\n"
             "size bytes (zeroed) that put_from / get_into and their batches use with no copy on "
             "either backend, already registered (do not register them again).  Through a "
             "DummyClient it is shared memory the RealClient reads and writes directly.  Free it "
             "with .free() (or a with block); close() frees what is left.");

static PyMethodDef Client_methods[] = {
    {"_connect", ML_KW(Client_connect), METH_VARARGS | METH_KEYWORDS, connect_doc},
    {"_connect_dummy", ML_KW(Client_connect_dummy), METH_VARARGS | METH_KEYWORDS, connect_dummy_doc},
    {"gpu_stats", (PyCFunction)Client_gpu_stats, METH_NOARGS, Client_gpu_stats_doc},
    {"_inspect_json", ML_KW(Client_inspect_json), METH_VARARGS | METH_KEYWORDS, Client_inspect_json_doc},
    {"close", (PyCFunction)Client_close, METH_NOARGS, Client_close_doc},
    {"put", ML_KW(Client_put), METH_VARARGS | METH_KEYWORDS, Client_put_doc},
    {"upsert", ML_KW(Client_upsert), METH_VARARGS | METH_KEYWORDS, Client_upsert_doc},
    {"get", ML_KW(Client_get), METH_VARARGS | METH_KEYWORDS, Client_get_doc},
    {"get_size", ML_KW(Client_get_size), METH_VARARGS | METH_KEYWORDS, Client_get_size_doc},
    {"remove", ML_KW(Client_remove), METH_VARARGS | METH_KEYWORDS, Client_remove_doc},
    {"remove_all", ML_KW(Client_remove_all), METH_VARARGS | METH_KEYWORDS, Client_remove_all_doc},
    {"is_exist", ML_KW(Client_is_exist), METH_VARARGS | METH_KEYWORDS, Client_is_exist_doc},
    {"probe_key", ML_KW(Client_probe_key), METH_VARARGS | METH_KEYWORDS, Client_probe_key_doc},
    {"batch_is_exist", ML_KW(Client_batch_is_exist), METH_VARARGS | METH_KEYWORDS, Client_batch_is_exist_doc},
    {"_batch_replicas_json", ML_KW(Client_batch_replicas_json), METH_VARARGS | METH_KEYWORDS,
     Client_batch_replicas_json_doc},
    {"batch_probe_key", ML_KW(Client_batch_probe_key), METH_VARARGS | METH_KEYWORDS, Client_batch_probe_key_doc},
    {"probe_resume", ML_KW(Client_probe_resume), METH_VARARGS | METH_KEYWORDS, Client_probe_resume_doc},
    {"alloc_buffer", ML_KW(ml_alloc_buffer), METH_VARARGS | METH_KEYWORDS, ml_alloc_buffer_doc},
    {"register_buffer", ML_KW(Client_register_buffer), METH_VARARGS | METH_KEYWORDS, Client_register_buffer_doc},
    {"unregister_buffer", ML_KW(Client_unregister_buffer), METH_VARARGS | METH_KEYWORDS, Client_unregister_buffer_doc},
    {"put_from", ML_KW(Client_put_from), METH_VARARGS | METH_KEYWORDS, Client_put_from_doc},
    {"get_into", ML_KW(Client_get_into), METH_VARARGS | METH_KEYWORDS, Client_get_into_doc},
    {"batch_put_from", ML_KW(Client_batch_put_from), METH_VARARGS | METH_KEYWORDS, Client_batch_put_from_doc},
    {"batch_get_into", ML_KW(Client_batch_get_into), METH_VARARGS | METH_KEYWORDS, Client_batch_get_into_doc},
    {"_remove_force", ML_KW(Client_remove_force), METH_VARARGS | METH_KEYWORDS, Client_remove_force_doc},
    {"_remove_all_force", ML_KW(Client_remove_all_force), METH_VARARGS | METH_KEYWORDS, Client_remove_all_force_doc},
    {"_batch_put_multi", ML_KW(Client_batch_put_multi), METH_VARARGS | METH_KEYWORDS, Client_batch_put_multi_doc},
    {"_batch_get_multi", ML_KW(Client_batch_get_multi), METH_VARARGS | METH_KEYWORDS, Client_batch_get_multi_doc},
    {"batch_put", ML_KW(Client_batch_put), METH_VARARGS | METH_KEYWORDS, Client_batch_put_doc},
    {"put_parts", ML_KW(Client_put_parts), METH_VARARGS | METH_KEYWORDS, Client_put_parts_doc},
    {"batch_get", ML_KW(Client_batch_get), METH_VARARGS | METH_KEYWORDS, Client_batch_get_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Client_getset[] = {
    {"protocol", (getter)Client_get_protocol, NULL,
     "The transport in use ('tcp' or 'rdma'); None when closed.", NULL},
    {"local_endpoint", (getter)Client_get_local_endpoint, NULL,
     "Data endpoint of the memory this process contributes ('127.0.0.1:41234'); None "
     "for a pure client.", NULL},
    {"http_port", (getter)Client_get_http_port, NULL,
     "Port of this client's HTTP endpoint (/metrics, /health; connect(http_port=...)); "
     "None when it has none.", NULL},
    {"closed", (getter)Client_get_closed, NULL, "True once closed (or never connected).", NULL},
    {"kind", (getter)Client_get_kind, NULL,
     "'direct' (connected to a master), 'dummy' (through a RealClient) or 'none'.", NULL},
    {"target", (getter)Client_get_target, NULL,
     "The master address or RealClient socket path connected to.", NULL},
    {"default_tenant", (getter)Client_get_tenant, NULL,
     "Tenant of calls that pass no tenant_id (None: a DummyClient's RealClient decides).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(Client_doc,
"A connection to a moonlet cluster (the C moonlet_client).  Use moonlet.Store,\n"
"which subclasses it; this base type holds the calls implemented in C.");

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "moonlet._moonlet.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = Client_doc,
    .tp_new = Client_new,
    .tp_dealloc = (destructor)Client_dealloc,
    .tp_weaklistoffset = offsetof(ClientObject, weakrefs),
    .tp_methods = Client_methods,
    .tp_getset = Client_getset,
};

/* ---- module ---------------------------------------------------------------------------------- */

static PyObject *mod_strerror(PyObject *mod, PyObject *arg)
{
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(code < INT_MIN || code > INT_MAX ? "UNKNOWN_ERROR"
                                                                  : moonlet_strerror((int)code));
}

static PyObject *mod_device_memory(PyObject *mod, PyObject *args)
{
    unsigned long long ptr, size;
    if (!PyArg_ParseTuple(args, "KK:device_memory", &ptr, &size))
        return NULL;
    moonlet_cuda_range r;
    int kind;
    Py_BEGIN_ALLOW_THREADS
    kind = moonlet_cuda_classify((const void *)(uintptr_t)ptr, (size_t)size, &r);
    Py_END_ALLOW_THREADS
    if (kind < 0)
        return ml_raise(kind, "device_memory: the range runs past its device allocation", NULL);
    return PyLong_FromLong(kind ? r.device : -1);
}

static PyObject *mod_copy_into(PyObject *mod, PyObject *args)
{
    unsigned long long dst;
    Py_buffer src;
    Py_ssize_t off, n;
    if (!PyArg_ParseTuple(args, "Ky*nn:copy_into", &dst, &src, &off, &n))
        return NULL;
    if (off < 0 || n < 0 || off > src.len || n > src.len - off) {
        PyBuffer_Release(&src);
        PyErr_SetString(PyExc_ValueError, "copy_into: the range is outside the source");
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = moonlet_cuda_copy_to((void *)(uintptr_t)dst, (const char *)src.buf + off, (size_t)n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    if (rc)
        return ml_raise(rc, "copy_into", NULL);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"copy_into", mod_copy_into, METH_VARARGS,
     "copy_into(dst_ptr, src, offset, n)\n--\n\nCopies src[offset:offset + n] (a bytes-like "
     "object) to the address dst_ptr: host memory, or CUDA device memory (a driver copy).  "
     "The caller vouches for dst_ptr (registered memory)."},
    {"device_memory", mod_device_memory, METH_VARARGS,
     "device_memory(ptr, size) -> int\n--\n\nThe CUDA device ordinal holding [ptr, ptr + size), "
     "or -1 when it is not device memory (host memory, or no CUDA driver: libcuda.so.1 or "
     "$MOONLET_CUDA_DRIVER).  StoreError INVALID_PARAMS when the range starts in a device "
     "allocation and runs past its end."},
    {"strerror", mod_strerror, METH_O,
     "strerror(code) -> str\n--\n\nName of a moonlet / Mooncake error code "
     "('OBJECT_NOT_FOUND'); 'UNKNOWN_ERROR' for others."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(module_doc,
"moonlet._moonlet - the C part of the moonlet Python binding.\n\n"
"Holds the Client type (the C client library) and strerror(); import the\n"
"`moonlet` package instead of this module.");

static struct PyModuleDef moonlet_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "moonlet._moonlet",
    .m_doc = module_doc,
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__moonlet(void);

PyMODINIT_FUNC PyInit__moonlet(void)
{
    PyObject *errors = PyImport_ImportModule("moonlet.errors");
    if (!errors)
        return NULL;
    g_store_error = PyObject_GetAttrString(errors, "StoreError");
    Py_DECREF(errors);
    if (!g_store_error)
        return NULL;
    if (PyType_Ready(&ClientType) < 0 || PyType_Ready(&ml_SharedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moonlet_module);
    if (!m)
        return NULL;
    Py_INCREF(&ClientType);
    if (PyModule_AddObject(m, "Client", (PyObject *)&ClientType) < 0) {
        Py_DECREF(&ClientType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ml_SharedType);
    if (PyModule_AddObject(m, "SharedBuffer", (PyObject *)&ml_SharedType) < 0) {
        Py_DECREF(&ml_SharedType);
        Py_DECREF(m);
        return NULL;
    }
    static const struct { const char *name; int code; } codes[] = {
        {"OK", MOONLET_OK},
        {"INTERNAL_ERROR", MOONLET_ERR_INTERNAL_ERROR},
        {"BUFFER_OVERFLOW", MOONLET_ERR_BUFFER_OVERFLOW},
        {"SEGMENT_NOT_FOUND", MOONLET_ERR_SEGMENT_NOT_FOUND},
        {"NO_AVAILABLE_HANDLE", MOONLET_ERR_NO_AVAILABLE_HANDLE},
        {"INVALID_KEY", MOONLET_ERR_INVALID_KEY},
        {"INVALID_PARAMS", MOONLET_ERR_INVALID_PARAMS},
        {"ILLEGAL_CLIENT", MOONLET_ERR_ILLEGAL_CLIENT},
        {"REPLICA_IS_NOT_READY", MOONLET_ERR_REPLICA_IS_NOT_READY},
        {"OBJECT_NOT_FOUND", MOONLET_ERR_OBJECT_NOT_FOUND},
        {"OBJECT_ALREADY_EXISTS", MOONLET_ERR_OBJECT_ALREADY_EXISTS},
        {"OBJECT_HAS_LEASE", MOONLET_ERR_OBJECT_HAS_LEASE},
        {"LEASE_EXPIRED", MOONLET_ERR_LEASE_EXPIRED},
        {"TRANSFER_FAIL", MOONLET_ERR_TRANSFER_FAIL},
        {"RPC_FAIL", MOONLET_ERR_RPC_FAIL},
        {"RPC_TIMEOUT", MOONLET_ERR_RPC_TIMEOUT},
        {"UNAVAILABLE_IN_CURRENT_STATUS", MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS},
        {"NOT_LEADER", MOONLET_ERR_NOT_LEADER},
        {"PERMISSION_DENIED", MOONLET_ERR_PERMISSION_DENIED},
    };
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        if (PyModule_AddIntConstant(m, codes[i].name, codes[i].code) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
