/* Part of _speedups.c: sys.stderr's write and flush with the sink's note of a line the program left
 * unended (Sink.follow_partial_lines), in C.
 *
 * The sink puts these in the stream's place so that its next line on stderr starts on a line of its
 * own. A Python wrapper was a frame of ours below every write: a failing one (bytes, a broken pipe)
 * showed importwatch's sink.py in the program's traceback, and the wrapper read as a function of
 * ours, not the stream's method. A Follower calls the stream's own method with nothing of ours on the
 * stack, takes the note after it returns, and shows what a program reads of that method
 * (_speedups_stand_in.h: its __self__, names, pickling, copy). The sink's pure-Python twin takes the
 * same note in Python.
 *
 * Included once by _speedups.c, after _speedups_stand_in.h: one translation unit. */

typedef struct Follower {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;       /* the stream's own bound write or flush */
    PyObject *sink;           /* whose `partial` is set where the note changes */
    struct Follower *writer;  /* for a flush, the write's Follower, whose `held` it makes the note; else NULL */
    int held;                 /* a write's: whether what the stream holds, once out, leaves a line unended */
    int through, by_line;     /* a write's: the stream's write_through and line_buffering */
    PyObject *weakrefs;
} Follower;

/* sink.partial = UNENDED, where it differs: each set of a sink attribute makes the hook read the sink
   again (_speedups_route.h). 0, or -1 with an exception. */
static int note_partial(PyObject *sink, int unended) {
    PyObject *now = PyObject_GetAttr(sink, s_partial);
    if (now == NULL) {
        return -1;
    }
    int same = now == (unended ? Py_True : Py_False);
    Py_DECREF(now);
    return same ? 0 : PyObject_SetAttr(sink, s_partial, unended ? Py_True : Py_False);
}

static PyObject *follower_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Follower *self = (Follower *)callable;
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (result == NULL) {
        return NULL; /* nothing reached the stream that the note should know of */
    }
    int note = -1; /* the line's state to tell the sink, or -1: none */
    if (self->writer != NULL) {
        note = self->writer->held; /* a flush: what the stream held is out */
    } else if (PyVectorcall_NARGS(nargsf) == 1 && kwnames == NULL && PyUnicode_Check(args[0])) {
        PyObject *text = args[0];
        Py_ssize_t size = PyUnicode_GET_LENGTH(text);
        if (size > 0) {
            self->held = PyUnicode_READ_CHAR(text, size - 1) != '\n';
            if (self->through || (self->by_line && (PyUnicode_FindChar(text, '\n', 0, size, 1) >= 0 ||
                                                    PyUnicode_FindChar(text, '\r', 0, size, 1) >= 0))) {
                note = self->held;
            }
        }
    }
    if (note >= 0 && note_partial(self->sink, note) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static int follower_traverse(Follower *self, visitproc visit, void *arg) {
    Py_VISIT(self->original);
    Py_VISIT(self->sink);
    Py_VISIT((PyObject *)self->writer);
    return 0;
}

static int follower_clear(Follower *self) {
    Py_CLEAR(self->original);
    Py_CLEAR(self->sink);
    Py_CLEAR(self->writer);
    return 0;
}

static void follower_dealloc(Follower *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    follower_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *follower_repr(Follower *self) {
    return PyUnicode_FromFormat("<importwatch's note of unended lines around %R>", self->original);
}

static PyTypeObject FollowerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "importwatch.tracing._speedups.Follower",
    .tp_basicsize = sizeof(Follower),
    .tp_dealloc = (destructor)follower_dealloc,
    .tp_vectorcall_offset = offsetof(Follower, vectorcall),
    .tp_repr = (reprfunc)follower_repr,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = stand_in_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = (traverseproc)follower_traverse,
    .tp_clear = (inquiry)follower_clear,
    .tp_weaklistoffset = offsetof(Follower, weakrefs),
    .tp_getset = stand_in_getset, /* _speedups_stand_in.h */
    .tp_methods = stand_in_methods,
};

static Follower *new_follower(PyObject *original, PyObject *sink, Follower *writer, int through, int by_line) {
    Follower *self = PyObject_GC_New(Follower, &FollowerType);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = follower_call;
    Py_INCREF(original);
    self->original = original;
    Py_INCREF(sink);
    self->sink = sink;
    Py_XINCREF((PyObject *)writer);
    self->writer = writer;
    self->held = 0;
    self->through = through;
    self->by_line = by_line;
    self->weakrefs = NULL;
    PyObject_GC_Track(self);
    return self;
}

/* follow(write, flush, sink, through, by_line): (write, flush) with the sink's note after each. */
static PyObject *make_followers(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *write, *flush, *sink;
    int through, by_line;
    if (!PyArg_ParseTuple(args, "OOOpp:follow", &write, &flush, &sink, &through, &by_line)) {
        return NULL;
    }
    Follower *writer = new_follower(write, sink, NULL, through, by_line);
    Follower *flusher = writer == NULL ? NULL : new_follower(flush, sink, writer, 0, 0);
    PyObject *pair = flusher == NULL ? NULL : PyTuple_Pack(2, (PyObject *)writer, (PyObject *)flusher);
    Py_XDECREF((PyObject *)writer);
    Py_XDECREF((PyObject *)flusher);
    return pair;
}
