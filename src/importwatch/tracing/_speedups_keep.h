/* Part of _speedups.c: our functions left out of the collector's passes as the interpreter ends.
 *
 * As the interpreter finalises, the collector passes over every object it tracks, more than once,
 * and frees the cycles it finds: for a short program, importwatch's few hundred functions (each in
 * a cycle with its module's globals) are about 0.4 ms of that, on top of plain python's own exit.
 * At our last exit handler, keep_to_the_end takes each function defined in our modules out of the
 * collector's lists and holds one reference to it for the rest of the process. Nothing of the
 * program's changes: a function works the same untracked (a finaliser that imports at exit still
 * runs our hook), our modules' globals are cleared as the interpreter clears every module's, and
 * what a function holds (its code, its defaults, its module's globals) is ours. The reference is
 * never given back, on purpose: an untracked function must never be freed, since the interpreter's
 * deallocator takes it off the collector's list without looking whether it is on one.
 *
 * The pure-Python twin has no way to do this and does nothing (session._at_exit).
 *
 * Included once by _speedups.c, after its helpers: one translation unit. Not compiled on its own. */

/* FUNCTION, if it is a function of module NAME still tracked: kept and untracked; its count (0 or 1). */
static Py_ssize_t keep_function(PyObject *function, PyObject *name) {
    if (function == NULL || !PyFunction_Check(function) || !PyObject_GC_IsTracked(function)) {
        return 0;
    }
    PyObject *module = ((PyFunctionObject *)function)->func_module;
    if (module == NULL || !PyUnicode_CheckExact(module) || PyUnicode_Compare(module, name) != 0) {
        return 0;
    }
    Py_INCREF(function); /* never given back: see above */
    PyObject_GC_UnTrack(function);
    return 1;
}

/* The function inside a class's VALUE: a staticmethod's or classmethod's, a property's getter. */
static Py_ssize_t keep_wrapped(PyObject *value, PyObject *name) {
    static const char *const inside[] = {"__func__", "fget", "fset", "fdel"};
    if (!PyObject_TypeCheck(value, &PyStaticMethod_Type) && !PyObject_TypeCheck(value, &PyClassMethod_Type) &&
        !PyObject_TypeCheck(value, &PyProperty_Type)) {
        return 0;
    }
    Py_ssize_t kept = 0;
    for (size_t at = 0; at < sizeof(inside) / sizeof(inside[0]); at++) {
        PyObject *function = PyObject_GetAttrString(value, inside[at]);
        if (function == NULL) {
            PyErr_Clear(); /* a staticmethod has no fget */
            continue;
        }
        kept += keep_function(function, name);
        Py_DECREF(function);
    }
    return kept;
}

/* Each function module NAME defines (DICT, its globals): at its top level and in its classes. */
static Py_ssize_t keep_module(PyObject *dict, PyObject *name) {
    Py_ssize_t kept = 0, at = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &at, &key, &value)) {
        if (PyFunction_Check(value)) {
            kept += keep_function(value, name);
            continue;
        }
        if (!PyType_Check(value) || !PyType_HasFeature((PyTypeObject *)value, Py_TPFLAGS_HEAPTYPE)) {
            continue;
        }
        PyObject *attributes = ((PyTypeObject *)value)->tp_dict;
        PyObject *owner = attributes == NULL ? NULL : PyDict_GetItemString(attributes, "__module__");
        if (owner == NULL || !PyUnicode_CheckExact(owner) || PyUnicode_Compare(owner, name) != 0) {
            continue; /* a class imported from elsewhere */
        }
        Py_ssize_t inner = 0;
        PyObject *attribute, *member;
        while (PyDict_Next(attributes, &inner, &attribute, &member)) {
            kept += PyFunction_Check(member) ? keep_function(member, name) : keep_wrapped(member, name);
        }
    }
    return kept;
}

/* keep_to_the_end(modules, package): see above, for each module of MODULES (sys.modules) named
   PACKAGE or below it. Returns how many functions it kept. */
static PyObject *keep_to_the_end(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *modules, *package;
    if (!PyArg_ParseTuple(args, "O!U:keep_to_the_end", &PyDict_Type, &modules, &package)) {
        return NULL;
    }
    Py_ssize_t prefix = PyUnicode_GET_LENGTH(package), kept = 0, at = 0;
    PyObject *name, *value;
    while (PyDict_Next(modules, &at, &name, &value)) {
        if (!PyUnicode_CheckExact(name) || !PyModule_Check(value) ||
            PyUnicode_Tailmatch(name, package, 0, prefix, -1) != 1 ||
            (PyUnicode_GET_LENGTH(name) > prefix && PyUnicode_ReadChar(name, prefix) != '.')) {
            continue;
        }
        PyObject *dict = PyModule_GetDict(value); /* borrowed */
        if (dict != NULL) {
            kept += keep_module(dict, name);
        }
    }
    return PyLong_FromSsize_t(kept);
}

#define KEEP_METHODS                                                                                             \
    {"keep_to_the_end", keep_to_the_end, METH_VARARGS,                                                         \
     "keep_to_the_end(modules, package): PACKAGE's functions out of the collector's exit passes, kept."},
