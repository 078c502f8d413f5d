/* The watcher's feed in shared memory (ring.py), on the C side: the mapping itself, and the append the
 * C hook makes for each of its lines, byte for byte as ring.Ring.put.
 *
 * Included once by _speedups.c: one translation unit, so everything here stays static. */

#include <stdint.h>
#include <sys/mman.h>

#define RING_HEADER 64 /* ring.HEADER: HEAD, a uint64 of the bytes ever appended, then the lines */
#define FEED_LONGEST 65536 /* ring._LONGEST: a longer line is cut by Feed.send (the Python path) */

/* shared_memory(fd, size): SIZE bytes of FD mapped shared and writable, as a buffer; unmapped when the
   last reference (and memoryview) goes. ring.create uses it in place of mmap.mmap, whose import would
   cost the program's start-up half a millisecond. */
typedef struct {
    PyObject_HEAD
    char *base;
    Py_ssize_t size;
} SharedMemory;

static int shared_getbuffer(SharedMemory *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->base, self->size, 0, flags);
}

static PyBufferProcs shared_as_buffer = {
    .bf_getbuffer = (getbufferproc)shared_getbuffer,
};

static void shared_dealloc(SharedMemory *self) {
    if (self->base != NULL) {
        munmap(self->base, (size_t)self->size);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject SharedMemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "importwatch.tracing._speedups.SharedMemory",
    .tp_basicsize = sizeof(SharedMemory),
    .tp_dealloc = (destructor)shared_dealloc,
    .tp_as_buffer = &shared_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A shared, writable mapping of a file: the watcher's feed (ring.py).",
};

static PyObject *shared_memory(PyObject *module, PyObject *args) {
    (void)module;
    int fd;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "in:shared_memory", &fd, &size)) {
        return NULL;
    }
    if (size < RING_HEADER + 1) {
        PyErr_SetString(PyExc_ValueError, "shared_memory: too small for a ring");
        return NULL;
    }
    void *base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    SharedMemory *self = PyObject_New(SharedMemory, &SharedMemoryType);
    if (self == NULL) {
        munmap(base, (size_t)size);
        return NULL;
    }
    self->base = base;
    self->size = size;
    return (PyObject *)self;
}

/* ring.Ring.put(TEXT) for FEED's ring (feed.ring.mapping): the bytes, then HEAD. 0, or -1 with an
   exception. The GIL is held throughout: it is what keeps the program's threads to one writer. */
static int ring_put(PyObject *feed, const char *text, size_t size) {
    PyObject *ring = slot_get(feed, s_ring);
    PyObject *mapping = ring == NULL ? NULL : slot_get(ring, s_mapping);
    Py_XDECREF(ring);
    if (mapping == NULL) {
        return -1;
    }
    Py_buffer view;
    int result = PyObject_GetBuffer(mapping, &view, PyBUF_WRITABLE);
    Py_DECREF(mapping);
    if (result < 0) {
        return -1;
    }
    if (view.len <= RING_HEADER) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the feed's ring is too small");
        return -1;
    }
    char *base = view.buf;
    uint64_t room = (uint64_t)(view.len - RING_HEADER);
    uint64_t head = __atomic_load_n((uint64_t *)base, __ATOMIC_RELAXED);
    uint64_t at = head % room;
    size_t first = room - at < size ? (size_t)(room - at) : size;
    memcpy(base + RING_HEADER + at, text, first);
    memcpy(base + RING_HEADER, text + first, size - first);
    __atomic_store_n((uint64_t *)base, head + size, __ATOMIC_RELEASE);
    PyBuffer_Release(&view);
    return 0;
}
