/* chm._robuf: a read-only buffer exporter over memory another object exports.
 *
 * Why it exists: cffi's ffi.buffer() is always writable, and a memoryview's
 * .obj is the object it was made from, so memoryview(ffi.buffer(p))
 * .toreadonly() still hands out the writable cffi buffer as its .obj (and as
 * the base of every numpy array made from it). ReadOnlyBuffer(source, owner)
 * holds the source's buffer privately and exports the same bytes read-only:
 * a writable request fails in the exporter itself (BufferError), whoever asks.
 *
 * Lifetime: it counts the exports it has handed out. release() refuses with
 * BufferError while any is alive; afterwards it drops the source and the
 * owner, and every new export raises ValueError, so an object kept past
 * release gives no access to memory that may be reused. ``owner`` is kept
 * alive for as long as this object is (chm.Handle passes itself, so a view
 * keeps its handle, and through it the device, alive) and is never exposed.
 *
 * Thread-safety: every method runs with the GIL held, which serialises them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

typedef struct {
	PyObject ob_base; /* PyObject_HEAD, spelled out for clang-format */
	Py_buffer src;    /* src.obj == NULL once released */
	PyObject *owner;  /* kept alive, never exposed */
	Py_ssize_t nbytes;
	Py_ssize_t exports;
	PyObject *weakreflist;
} RoBuf;

static PyObject *robuf_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"source", "owner", NULL};
	PyObject *source, *owner = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:ReadOnlyBuffer", kwlist, &source, &owner))
		return NULL;
	RoBuf *self = (RoBuf *)type->tp_alloc(type, 0);
	if (!self)
		return NULL;
	if (PyObject_GetBuffer(source, &self->src, PyBUF_SIMPLE) < 0) {
		self->src.obj = NULL;
		Py_DECREF(self);
		return NULL;
	}
	self->nbytes = self->src.len;
	Py_INCREF(owner);
	self->owner = owner;
	return (PyObject *)self;
}

static int robuf_traverse(RoBuf *self, visitproc visit, void *arg)
{
	/* Only the owner: the source is a plain buffer that never refers back. */
	Py_VISIT(self->owner);
	return 0;
}

static int robuf_clear(RoBuf *self)
{
	Py_CLEAR(self->owner);
	return 0;
}

static void robuf_dealloc(RoBuf *self)
{
	PyObject_GC_UnTrack(self);
	if (self->weakreflist)
		PyObject_ClearWeakRefs((PyObject *)self);
	if (self->src.obj)
		PyBuffer_Release(&self->src);
	Py_CLEAR(self->owner);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int robuf_getbuffer(RoBuf *self, Py_buffer *view, int flags)
{
	if (!self->src.obj) {
		view->obj = NULL;
		PyErr_SetString(PyExc_ValueError, "operation forbidden on a released device view");
		return -1;
	}
	/* readonly=1: a PyBUF_WRITABLE request fails here with BufferError. */
	if (PyBuffer_FillInfo(view, (PyObject *)self, self->src.buf, self->src.len, 1, flags) < 0)
		return -1;
	self->exports++;
	return 0;
}

static void robuf_releasebuffer(RoBuf *self, Py_buffer *view)
{
	(void)view;
	self->exports--;
}

static PyObject *robuf_release(RoBuf *self, PyObject *noargs)
{
	(void)noargs;
	if (self->exports > 0) {
		PyErr_Format(PyExc_BufferError, "device view has %zd live export%s", self->exports,
		             self->exports == 1 ? "" : "s");
		return NULL;
	}
	if (self->src.obj)
		PyBuffer_Release(&self->src); /* sets src.obj to NULL */
	Py_CLEAR(self->owner);
	Py_RETURN_NONE;
}

static PyObject *robuf_get_exports(RoBuf *self, void *closure)
{
	(void)closure;
	return PyLong_FromSsize_t(self->exports);
}

static PyObject *robuf_get_released(RoBuf *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->src.obj == NULL);
}

static PyObject *robuf_get_nbytes(RoBuf *self, void *closure)
{
	(void)closure;
	return PyLong_FromSsize_t(self->nbytes);
}

static PyObject *robuf_get_readonly(RoBuf *self, void *closure)
{
	(void)self;
	(void)closure;
	Py_RETURN_TRUE;
}

static PyObject *robuf_repr(RoBuf *self)
{
	if (!self->src.obj)
		return PyUnicode_FromFormat("<chm read-only buffer, released>");
	return PyUnicode_FromFormat("<chm read-only buffer of %zd bytes, %zd export%s>",
	                            self->nbytes, self->exports, self->exports == 1 ? "" : "s");
}

static PyMethodDef robuf_methods[] = {
        {"release", (PyCFunction)robuf_release, METH_NOARGS,
         "Ends the buffer: BufferError while exports are alive; new exports then raise "
         "ValueError. A second call is a no-op."},
        {NULL, NULL, 0, NULL},
};

static PyGetSetDef robuf_getset[] = {
        {"exports", (getter)robuf_get_exports, NULL, "exports alive (memoryviews, arrays)", NULL},
        {"released", (getter)robuf_get_released, NULL, "True once release() succeeded", NULL},
        {"nbytes", (getter)robuf_get_nbytes, NULL, "length in bytes", NULL},
        {"readonly", (getter)robuf_get_readonly, NULL, "always True", NULL},
        {NULL, NULL, NULL, NULL, NULL},
};

static PyBufferProcs robuf_as_buffer = {
        (getbufferproc)robuf_getbuffer,
        (releasebufferproc)robuf_releasebuffer,
};

/* PyVarObject_HEAD_INIT ends in a comma that clang-format cannot see. */
/* clang-format off */
static PyTypeObject RoBuf_Type = {
        PyVarObject_HEAD_INIT(NULL, 0)
        .tp_name = "chm._robuf.ReadOnlyBuffer",
        .tp_basicsize = sizeof(RoBuf),
        .tp_dealloc = (destructor)robuf_dealloc,
        .tp_repr = (reprfunc)robuf_repr,
        .tp_as_buffer = &robuf_as_buffer,
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
        .tp_doc = "ReadOnlyBuffer(source, owner=None): the bytes of source, exported read-only.",
        .tp_traverse = (traverseproc)robuf_traverse,
        .tp_clear = (inquiry)robuf_clear,
        .tp_weaklistoffset = offsetof(RoBuf, weakreflist),
        .tp_methods = robuf_methods,
        .tp_getset = robuf_getset,
        .tp_new = robuf_new,
};
/* clang-format on */

static struct PyModuleDef robuf_module = {
        PyModuleDef_HEAD_INIT,
        .m_name = "chm._robuf",
        .m_doc = "A read-only buffer exporter for views into device DRAM.",
        .m_size = -1,
};

PyMODINIT_FUNC PyInit__robuf(void)
{
	if (PyType_Ready(&RoBuf_Type) < 0)
		return NULL;
	PyObject *m = PyModule_Create(&robuf_module);
	if (!m)
		return NULL;
	Py_INCREF(&RoBuf_Type);
	if (PyModule_AddObject(m, "ReadOnlyBuffer", (PyObject *)&RoBuf_Type) < 0) {
		Py_DECREF(&RoBuf_Type);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
