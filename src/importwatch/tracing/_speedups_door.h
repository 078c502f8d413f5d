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
 * ENTER and LEAVE are ours, unseen by the program's trace and profile functions; the function is
 * the program's, seen by them as under plain python. A door with no ENTER (hook.hidden) stands
 * for a function of ours, all of it unseen.
 *
 * With STACKS (a loader's exec_module), the call that an import statement makes for the module
 * on top of this thread's chain is read here and passes straight through: no call of ENTER.
 *
 * A door that CHOOSES lets ENTER name what is called in the function's place: ENTER returns None or
 * (token, function), and FUNCTION, ours, is called with the arguments, unseen by the program's trace
 * functions as ENTER is (it calls the program's part through ACCELERATOR.traced); LEAVE gets the pair.
 * Its frame's entry is taken out of the traceback of an error it passes on (drop_chosen_entry).
 * A native load's door (native.py) calls a function named after the file, so that faulthandler's dump
 * of a hung dlopen names it: the one frame of ours below what the load runs.
 *
 * Included once by _speedups.c, after its helpers: one translation unit. Not compiled on its own. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original, *enter, *leave;
    PyObject *stacks; /* the tracer's, for exec_module's pass; else NULL */
    int chooses;      /* ENTER returns (token, a function of ours to call in ORIGINAL's place) */
    PyObject *dict;   /* __dict__: the original's names, docstring and __wrapped__ (hook.door) */
    PyObject *weakrefs; /* a function can be referred to weakly: so can its door */
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

/* ENTER or LEAVE: ours, unseen by the program's trace and profile functions (_speedups_untraced.h). */
static PyObject *door_ours(PyThreadState *tstate, PyObject *callable, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    untraced_enter(tstate);
    PyObject *result = PyObject_Vectorcall(callable, args, nargsf, kwnames);
    untraced_leave(tstate);
    return result;
}

/* The chosen function's own frame, CHOSEN's, out of the head of the error's traceback: the error reads as if
   the function the door stands for had raised it, as a door with no frame of its own leaves it (a failed
   ctypes load's OSError; a failed import's traceback drops importlib's frames anyway). Anything else is
   left as it is. Rare: only where a chosen call fails. */
RARE static void drop_chosen_entry(Saved *error, PyObject *chosen) {
    if (error->value == NULL || !PyFunction_Check(chosen)) {
        return;
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *head = PyException_GetTraceback(error->value);
#else
    PyObject *head = error->traceback;
    Py_XINCREF(head);
#endif
    if (head == NULL) {
        return;
    }
    PyObject *frame = PyObject_GetAttrString(head, "tb_frame");
    PyObject *code = frame == NULL ? NULL : PyObject_GetAttrString(frame, "f_code");
    PyObject *next = code == PyFunction_GET_CODE(chosen) ? PyObject_GetAttrString(head, "tb_next") : NULL;
    Py_XDECREF(frame);
    Py_XDECREF(code);
    Py_DECREF(head);
    if (next == NULL) {
        PyErr_Clear(); /* not the chosen function's entry, or unreadable: left */
        return;
    }
    if (PyException_SetTraceback(error->value, next) < 0) {
        PyErr_Clear();
        Py_DECREF(next);
        return;
    }
#if PY_VERSION_HEX >= 0x030C0000
    Py_DECREF(next);
#else
    Py_XDECREF(error->traceback);
    if (next == Py_None) {
        Py_DECREF(next);
        next = NULL;
    }
    error->traceback = next;
#endif
}

static PyObject *door_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Door *self = (Door *)callable;
    if (self->enter == Py_None) { /* a function of ours in the place of another (hook.hidden): ours, all of it */
        return door_ours(PyThreadState_Get(), self->original, args, nargsf, kwnames);
    }
    int passes = door_passes(self, args, PyVectorcall_NARGS(nargsf));
    if (passes != 0) {
        return passes < 0 ? NULL : PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    PyThreadState *tstate = PyThreadState_Get();
    PyObject *token = door_ours(tstate, self->enter, args, nargsf, kwnames);
    if (token == NULL) {
        return NULL;
    }
    if (token == Py_None) {
        Py_DECREF(token);
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    PyObject *result;
    if (self->chooses) {
        if (!PyTuple_CheckExact(token) || PyTuple_GET_SIZE(token) != 2) {
            Py_DECREF(token);
            PyErr_SetString(PyExc_TypeError, "a choosing door's enter returns None or (token, function)");
            return NULL;
        }
        /* ours, held by the token to the end */
        result = door_ours(tstate, PyTuple_GET_ITEM(token, 1), args, nargsf, kwnames);
    } else {
        result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    Saved error = {NULL, NULL, NULL};
    if (result == NULL) {
        save_error(&error);
        if (self->chooses) {
            drop_chosen_entry(&error, PyTuple_GET_ITEM(token, 1));
        }
    }
    PyObject *pair[2] = {token, error.value ? error.value : Py_None};
    PyObject *left = door_ours(tstate, self->leave, pair, 2, NULL);
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
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
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

/* What the two kinds of door share: all but whether an instance binds it. */
#define DOOR_TYPE_SLOTS                                                                                          \
    .tp_basicsize = sizeof(Door), .tp_dealloc = (destructor)door_dealloc,                                      \
    .tp_vectorcall_offset = offsetof(Door, vectorcall), .tp_repr = (reprfunc)door_repr,                        \
    .tp_call = PyVectorcall_Call, .tp_getattro = stand_in_getattro, .tp_setattro = PyObject_GenericSetAttr,     \
    .tp_traverse = (traverseproc)door_traverse, .tp_clear = (inquiry)door_clear, .tp_getset = door_getset,     \
    .tp_methods = stand_in_methods /* _speedups_stand_in.h */, .tp_dictoffset = offsetof(Door, dict),          \
    .tp_weaklistoffset = offsetof(Door, weakrefs)

static PyTypeObject DoorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "importwatch.tracing._speedups.Door",
    DOOR_TYPE_SLOTS,
    /* A method descriptor, as a function is: a call through an instance (loader.exec_module(module))
       passes the instance first, with no bound method made. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_descr_get = stand_in_get,
    .tp_doc = "A function of importlib's or a loader's with importwatch's event around it (see doors.py).",
};

/* A door around what an instance does not bind (a builtin: exec, faulthandler's functions), bound by none
   either: a class attribute that holds it is called with the caller's arguments alone, as the builtin is. */
static PyTypeObject BuiltinDoorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "importwatch.tracing._speedups.BuiltinDoor",
    DOOR_TYPE_SLOTS,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A builtin with importwatch's part around it (see hook.door).",
};

/* door(original, enter, leave, stacks, binds=True, chooses=False): ORIGINAL with ENTER and LEAVE around it, no
   frame of its own; bound by an instance, as a function is, only where BINDS; where CHOOSES, ENTER names the
   function of ours called in ORIGINAL's place. ENTER and LEAVE None: ORIGINAL is ours. */
static PyObject *make_door(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *original, *enter, *leave, *stacks;
    int binds = 1, chooses = 0;
    if (!PyArg_ParseTuple(args, "OOOO|pp:door", &original, &enter, &leave, &stacks, &binds, &chooses)) {
        return NULL;
    }
    if (stacks != Py_None && !PyDict_CheckExact(stacks)) {
        PyErr_SetString(PyExc_TypeError, "door: stacks must be a dict or None");
        return NULL;
    }
    Door *self = PyObject_GC_New(Door, binds ? &DoorType : &BuiltinDoorType);
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
    self->chooses = chooses;
    self->dict = NULL;
    self->weakrefs = NULL;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}
