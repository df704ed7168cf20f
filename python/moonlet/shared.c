/*
 * shared.c - moonlet.SharedBuffer (Store.alloc_buffer()): memory of
 * moonlet_client_alloc_shared() exported through the buffer protocol, so
 * put_from / get_into and their batches use it with no copy on either
 * backend.  A buffer keeps its Store alive and sits in the Store's list
 * (ClientObject.shared) until freed; free(), leaving a with block and the
 * Store's close() all refuse while a view of it (memoryview, numpy array)
 * is alive, so Python code never reaches freed memory through it.
 *
 * Locks: the Store's rwlock, through ML_CALL, around the C calls; the list
 * is changed with the GIL held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_moonlet.h"

void ml_shared_unlink(SharedObject *b)
{
    if (b->pprev) {
        *b->pprev = b->next;
        if (b->next)
            b->next->pprev = b->pprev;
    }
    b->next = NULL;
    b->pprev = NULL;
    b->ptr = NULL;
}

PyObject *ml_alloc_buffer(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"size", NULL};
    size_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:alloc_buffer", kwl, conv_size, &size))
        return NULL;
    void *p = NULL;
    int rc;
    ML_CALL(self, rc, moonlet_client_alloc_shared(c, size, &p));
    if (rc)
        return ml_raise(rc, "alloc_buffer", NULL);
    SharedObject *b = PyObject_New(SharedObject, &ml_SharedType);
    if (!b) {
        ML_CALL(self, rc, moonlet_client_free_shared(c, p));
        return NULL;
    }
    Py_INCREF(self);
    b->owner = self;
    b->ptr = p;
    b->len = size;
    b->exports = 0;
    b->next = self->shared;
    b->pprev = &self->shared;
    if (self->shared)
        self->shared->pprev = &b->next;
    self->shared = b;
    return (PyObject *)b;
}

/* Frees the memory unless views of it are alive; idempotent. */
static int shared_free(SharedObject *b)
{
    if (!b->ptr)
        return 0;
    if (b->exports > 0) {
        PyErr_SetString(PyExc_BufferError,
                        "SharedBuffer.free: a view of it is still alive (release it first)");
        return -1;
    }
    void *p = b->ptr;
    ml_shared_unlink(b);
    int rc;
    ML_CALL(b->owner, rc, moonlet_client_free_shared(c, p));
    if (rc && rc != ML_CLOSED) {
        ml_raise(rc, "SharedBuffer.free", NULL);
        return -1;
    }
    return 0;
}

static PyObject *Shared_free(SharedObject *b, PyObject *unused)
{
    if (shared_free(b))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Shared_enter(SharedObject *b, PyObject *unused)
{
    Py_INCREF(b);
    return (PyObject *)b;
}

static PyObject *Shared_exit(SharedObject *b, PyObject *args)
{
    if (shared_free(b))
        return NULL;
    Py_RETURN_FALSE;
}

static void Shared_dealloc(SharedObject *b)
{
    if (b->ptr && shared_free(b))
        PyErr_WriteUnraisable((PyObject *)b);
    Py_CLEAR(b->owner);
    PyObject_Free(b);
}

static int Shared_getbuffer(SharedObject *b, Py_buffer *view, int flags)
{
    if (!b->ptr) {
        PyErr_SetString(PyExc_ValueError, "SharedBuffer is freed");
        view->obj = NULL;
        return -1;
    }
    if (b->len > PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "SharedBuffer too large for a buffer view");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)b, b->ptr, (Py_ssize_t)b->len, 0, flags) < 0)
        return -1;
    b->exports++;
    return 0;
}

static void Shared_releasebuffer(SharedObject *b, Py_buffer *view)
{
    b->exports--;
}

static Py_ssize_t Shared_len(SharedObject *b)
{
    return b->ptr ? (Py_ssize_t)b->len : 0;
}

static PyObject *Shared_get_address(SharedObject *b, void *closure)
{
    if (!b->ptr) {
        PyErr_SetString(PyExc_ValueError, "SharedBuffer is freed");
        return NULL;
    }
    return PyLong_FromVoidPtr(b->ptr);
}

static PyObject *Shared_get_size(SharedObject *b, void *closure)
{
    return PyLong_FromSize_t(b->ptr ? b->len : 0);
}

static PyObject *Shared_get_freed(SharedObject *b, void *closure)
{
    return PyBool_FromLong(b->ptr == NULL);
}

static PyObject *Shared_repr(SharedObject *b)
{
    if (!b->ptr)
        return PyUnicode_FromString("<moonlet.SharedBuffer freed>");
    return PyUnicode_FromFormat("<moonlet.SharedBuffer address=%p size=%zu>", b->ptr, b->len);
}

static PyMethodDef Shared_methods[] = {
    {"free", (PyCFunction)Shared_free, METH_NOARGS,
     "free()\n--\n\nReturns the memory to the store (BufferError while a view of it is "
     "alive).  Calling it again does nothing."},
    {"__enter__", (PyCFunction)Shared_enter, METH_NOARGS, "Returns itself."},
    {"__exit__", (PyCFunction)Shared_exit, METH_VARARGS, "Frees the memory."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Shared_getset[] = {
    {"address", (getter)Shared_get_address, NULL,
     "The memory's address, for put_from / get_into and their batches.", NULL},
    {"size", (getter)Shared_get_size, NULL, "Its size in bytes (0 once freed).", NULL},
    {"freed", (getter)Shared_get_freed, NULL, "True once freed (or its store closed).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyBufferProcs Shared_as_buffer = {
    .bf_getbuffer = (getbufferproc)Shared_getbuffer,
    .bf_releasebuffer = (releasebufferproc)Shared_releasebuffer,
};

static PySequenceMethods Shared_as_sequence = {
    .sq_length = (lenfunc)Shared_len,
};

PyDoc_STRVAR(Shared_doc,
"Memory that put_from / get_into use with no copy on either backend\n"
"(Store.alloc_buffer()): shared memory the RealClient maps for a DummyClient,\n"
"registered memory for a direct Store.  A writable buffer object\n"
"(memoryview(buf), numpy.frombuffer(buf, ...)); .address is its address.\n"
"Freed by free(), leaving a with block, or its Store's close(); none of them\n"
"runs while a view of it is alive (BufferError).");

PyTypeObject ml_SharedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "moonlet.SharedBuffer",
    .tp_basicsize = sizeof(SharedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Shared_doc,
    .tp_dealloc = (destructor)Shared_dealloc,
    .tp_repr = (reprfunc)Shared_repr,
    .tp_as_buffer = &Shared_as_buffer,
    .tp_as_sequence = &Shared_as_sequence,
    .tp_methods = Shared_methods,
    .tp_getset = Shared_getset,
};
