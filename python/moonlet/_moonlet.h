/*
 * _moonlet.h - what the files of the moonlet._moonlet extension share: the
 * Store object (ClientObject) and the SharedBuffer object (SharedObject,
 * shared.c), how a call runs with the GIL released (ML_CALL), and the error
 * and argument helpers of _moonlet.c that shared.c uses.  Internal to the
 * extension.
 */
#ifndef MOONLET_PY_MOONLET_H
#define MOONLET_PY_MOONLET_H

#include <Python.h>

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "moonlet/client.h"

/* rc of a call made on a closed client (never a moonlet code). */
#define ML_CLOSED INT_MIN

typedef enum { ML_KIND_NONE = 0, ML_KIND_DIRECT = 1, ML_KIND_DUMMY = 2 } ml_kind;

struct SharedObject;

typedef struct {
    PyObject_HEAD
    moonlet_client *client;  /* NULL before connect and after close */
    pthread_rwlock_t lock;   /* calls: shared; close: exclusive */
    ml_kind kind;
    PyObject *target;        /* str: master address or RealClient socket; or None */
    PyObject *tenant;        /* str: default tenant of the connection; or None */
    PyObject *weakrefs;
    struct SharedObject *shared; /* live alloc_buffer() memory (each holds a reference to us) */
} ClientObject;

/* moonlet._moonlet.SharedBuffer: memory of moonlet_client_alloc_shared(),
 * exported through the buffer protocol.  It keeps its Store alive; its
 * memory goes with free() or the Store's close(), both of which refuse
 * while a memoryview (or numpy array, ctypes object, ...) of it exists, so
 * Python code can never reach freed memory through it. */
typedef struct SharedObject {
    PyObject_HEAD
    ClientObject *owner;          /* strong reference */
    void *ptr;                    /* NULL once freed */
    size_t len;
    Py_ssize_t exports;           /* buffer views handed out and not released */
    struct SharedObject *next, **pprev; /* in owner->shared while not freed */
} SharedObject;

/* ---- calls with the GIL released ------------------------------------------------------- */

/* Runs `expr` (which may use the local `c`, the client) with the GIL released
 * and the object's lock held shared; rc gets its result, or ML_CLOSED. */
#define ML_CALL(self, rc, expr)                                    \
    do {                                                           \
        Py_BEGIN_ALLOW_THREADS                                     \
        pthread_rwlock_rdlock(&(self)->lock);                      \
        moonlet_client *c = (self)->client;                        \
        (rc) = c ? (expr) : ML_CLOSED;                             \
        pthread_rwlock_unlock(&(self)->lock);                      \
        Py_END_ALLOW_THREADS                                       \
    } while (0)

/* Raises StoreError(code, "<what>: NAME (code)", results=results); returns NULL. */
PyObject *ml_raise(int code, const char *what, PyObject *results);

/* O& converter: a non-negative int that fits a size_t. */
int conv_size(PyObject *o, void *out);

/* shared.c: the SharedBuffer type, Store.alloc_buffer(), and detaching a
 * buffer from its store (its memory is then gone: freed or closed). */
extern PyTypeObject ml_SharedType;
PyObject *ml_alloc_buffer(ClientObject *self, PyObject *args, PyObject *kw);
void ml_shared_unlink(SharedObject *b);

#endif
