/* Part of _speedups.c: a door of doors.py with no Python frame of its own while the function it wraps runs.
 *
 * doors.py wraps a loader class's exec_module (and LazyLoader's), importlib.reload,
 * runpy.run_path and run_module, and importlib's wait for a module lock, so that what each
 * runs is an event. A Python wrapper is one more frame below what the function runs, a module
 * body: its tracebacks, inspect.stack() and recursion room then differ from plain python's,
 * and for exec_module on every import once a loader class is wrapped. This object calls ENTER
 * (which decides, puts the event in flight and writes its start line) before the function and
 * LEAVE (which ends the event and writes its end line) after it, and neither is on the stack
 * while the function runs. ENTER returning None means no event: the function is called as is.
 *
 * With STACKS (a loader's exec_module), the call that an import statement makes for the module
 * on top of this thread's chain is read here and passes straight through: no call of ENTER.
 *
 * Included once by _speedups.c, after its helpers: one translation unit. Not compiled on its own. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original, *enter, *leave;
    PyObject *stacks; /* the tracer's, for exec_module's pass; else NULL */
    PyObject *dict;   /* __dict__: the original's names, docstring, globals and __wrapped__ (doors.py) */
} Door;

/* Whether the exec_module call (LOADER, MODULE) is the one the import of the module on top of this
   thread's chain makes: 1, 0 (ENTER decides), or -1 with an exception (MODULE's __name__ raised
   something other than AttributeError, as it would from the wrapper). */
static int door_passes(Door *self, PyObject *const *args, Py_ssize_t nargs) {
    if (self->stacks == NULL || nargs != 2) {
        return 0;
    }
    PyObject *name = PyObject_GetAttr(args[1], s_dunder_name);
    if (name == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear(); /* not a module: ENTER lets the loader's own error come */
        return 0;
    }
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    PyObject *stack = ident == NULL ? NULL : PyDict_GetItemWithError(self->stacks, ident); /* borrowed */
    Py_XDECREF(ident);
    int passes = -1;
    if (stack != NULL && PyList_Check(stack) && PyList_GET_SIZE(stack) > 0) {
        PyObject *top = PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
        Py_INCREF(top);
        PyObject *top_name = PyObject_GetAttr(top, s_name);
        Py_DECREF(top);
        passes = top_name == NULL ? -1 : PyObject_RichCompareBool(top_name, name, Py_EQ);
        Py_XDECREF(top_name);
    } else if (!PyErr_Occurred()) {
        passes = 0;
    }
    Py_DECREF(name);
    return passes;
}

static PyObject *door_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Door *self = (Door *)callable;
    int passes = door_passes(self, args, PyVectorcall_NARGS(nargsf));
    if (passes != 0) {
        return passes < 0 ? NULL : PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    PyObject *token = PyObject_Vectorcall(self->enter, args, nargsf, kwnames);
    if (token == NULL) {
        return NULL;
    }
    if (token == Py_None) {
        Py_DECREF(token);
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    Saved error = {NULL, NULL, NULL};
    if (result == NULL) {
        save_error(&error);
    }
    PyObject *left = PyObject_CallFunctionObjArgs(self->leave, token, error.value ? error.value : Py_None, NULL);
    Py_DECREF(token);
    if (left == NULL) { /* ours propagates, as from a finally clause, the function's error its context */
        Py_XDECREF(result);
        chain(&error);
        return NULL;
    }
    Py_DECREF(left);
    if (result == NULL) {
        restore_error(&error);
    }
    return result;
}

/* As a function is: bound to an instance when read from a class (a loader's exec_module). */
static PyObject *door_get(PyObject *self, PyObject *instance, PyObject *owner) {
    (void)owner;
    if (instance == NULL || instance == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, instance);
}

/* What the door lacks, read from the function it stands for: its __code__, __defaults__, __kwdefaults__,
   __annotations__, __closure__, __builtins__ and any attribute of its own, as a program reading the
   attribute finds them under plain python (typing.get_type_hints, dis, a tool's look at the code). What
   neither has fails with the function's own AttributeError. */
static PyObject *door_getattro(PyObject *self, PyObject *name) {
    PyObject *value = PyObject_GenericGetAttr(self, name);
    PyObject *original = ((Door *)self)->original;
    if (value != NULL || original == NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return value;
    }
    PyErr_Clear();
    return PyObject_GetAttr(original, name);
}

/* Where the door's __module__ and __qualname__ lead in sys.modules (an attribute per dotted part): a new
   reference, or NULL, with no exception, where they lead nowhere. No module is imported for it. */
static PyObject *door_home(PyObject *self, PyObject *qualname) {
    PyObject *module_name = PyObject_GetAttrString(self, "__module__");
    PyObject *home = module_name != NULL && PyUnicode_Check(module_name) ? PyImport_GetModule(module_name) : NULL;
    PyObject *parts = home != NULL && PyUnicode_Check(qualname) ? PyUnicode_Split(qualname, s_dot, -1) : NULL;
    for (Py_ssize_t i = 0; parts != NULL && home != NULL && i < PyList_GET_SIZE(parts); i++) {
        Py_SETREF(home, PyObject_GetAttr(home, PyList_GET_ITEM(parts, i)));
    }
    Py_XDECREF(parts);
    Py_XDECREF(module_name);
    PyErr_Clear();
    return home;
}

/* pickle's way with a door, as with a function: by reference. Where its module and qualified name lead
   to the door itself (runpy.run_path, importlib.reload), the name: pickle writes the reference a
   function gets, byte for byte. Elsewhere (a door put on a subclass, or in importlib.util while its
   __module__ names importlib._bootstrap) pickle would refuse a name that leads to another object, so
   the door stands for the function: min() of a one-item tuple is that item, the function, pickled
   by reference, as under plain python, and unpickled as the function itself. */
static PyObject *door_reduce_ex(PyObject *self, PyObject *protocol) {
    (void)protocol;
    PyObject *qualname = PyObject_GetAttrString(self, "__qualname__");
    if (qualname == NULL) {
        return NULL;
    }
    PyObject *home = door_home(self, qualname);
    Py_XDECREF(home);
    if (home == self) {
        return qualname;
    }
    Py_DECREF(qualname);
    PyObject *least = PyDict_GetItemString(PyEval_GetBuiltins(), "min"); /* borrowed */
    if (least == NULL) {
        PyErr_SetString(PyExc_TypeError, "cannot pickle a door without builtins.min");
        return NULL;
    }
    return Py_BuildValue("(O((O)))", least, ((Door *)self)->original);
}

/* copy.copy and copy.deepcopy give a function itself: so for its door. */
static PyObject *door_itself(PyObject *self, PyObject *unused) {
    (void)unused;
    Py_INCREF(self);
    return self;
}

static PyMethodDef door_methods[] = {
    {"__reduce_ex__", door_reduce_ex, METH_O, NULL},
    {"__copy__", door_itself, METH_NOARGS, NULL},
    {"__deepcopy__", door_itself, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static int door_traverse(Door *self, visitproc visit, void *arg) {
    Py_VISIT(self->original);
    Py_VISIT(self->enter);
    Py_VISIT(self->leave);
    Py_VISIT(self->stacks);
    Py_VISIT(self->dict);
    return 0;
}

static int door_clear(Door *self) {
    Py_CLEAR(self->original);
    Py_CLEAR(self->enter);
    Py_CLEAR(self->leave);
    Py_CLEAR(self->stacks);
    Py_CLEAR(self->dict);
    return 0;
}

static void door_dealloc(Door *self) {
    PyObject_GC_UnTrack(self);
    door_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyGetSetDef door_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *door_repr(Door *self) {
    return PyUnicode_FromFormat("<importwatch's door around %R>", self->original);
}

static PyTypeObject DoorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "importwatch.tracing._speedups.Door",
    .tp_basicsize = sizeof(Door),
    .tp_dealloc = (destructor)door_dealloc,
    .tp_vectorcall_offset = offsetof(Door, vectorcall),
    .tp_repr = (reprfunc)door_repr,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = door_getattro,
    .tp_setattro = PyObject_GenericSetAttr,
    /* A method descriptor, as a function is: a call through an instance (loader.exec_module(module))
       passes the instance first, with no bound method made. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A function of importlib's or a loader's with importwatch's event around it (see doors.py).",
    .tp_traverse = (traverseproc)door_traverse,
    .tp_clear = (inquiry)door_clear,
    .tp_descr_get = door_get,
    .tp_getset = door_getset,
    .tp_methods = door_methods,
    .tp_dictoffset = offsetof(Door, dict),
};

/* door(original, enter, leave, stacks): ORIGINAL with ENTER and LEAVE around it, no frame of its own. */
static PyObject *make_door(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *original, *enter, *leave, *stacks;
    if (!PyArg_ParseTuple(args, "OOOO:door", &original, &enter, &leave, &stacks)) {
        return NULL;
    }
    if (stacks != Py_None && !PyDict_CheckExact(stacks)) {
        PyErr_SetString(PyExc_TypeError, "door: stacks must be a dict or None");
        return NULL;
    }
    Door *self = PyObject_GC_New(Door, &DoorType);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = door_call;
    Py_INCREF(original);
    self->original = original;
    Py_INCREF(enter);
    self->enter = enter;
    Py_INCREF(leave);
    self->leave = leave;
    self->stacks = stacks == Py_None ? NULL : stacks;
    Py_XINCREF(self->stacks);
    self->dict = NULL;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}
