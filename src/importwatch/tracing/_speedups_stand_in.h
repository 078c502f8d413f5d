/* Part of _speedups.c: what a C object put in the place of a Python function (the import hook, a Door)
 * shows a program that looks at that function rather than calls it.
 *
 * importlib's _find_and_load, runpy.run_path and the like are functions; a program, a tool or pickle
 * may read their attributes, pickle them by reference (a multiprocessing or Ray target) or copy them
 * (copy and deepcopy keep a function as it is). The object in their place reads what it lacks from
 * the function it stands for, pickles as a reference to where it is found, and is itself under copy.
 *
 * Included once by _speedups.c, after its Hook, before the Hook's type and _speedups_door.h: one
 * translation unit. The hook's attributes and methods are here; the Door's are with its type. */

/* SELF's attribute NAME where it has one, else ORIGINAL's: __code__, __defaults__, __annotations__, and
   the rest of a function's; what neither has fails with the function's own AttributeError. */
static PyObject *stand_in_getattr(PyObject *self, PyObject *name, PyObject *original) {
    PyObject *value = PyObject_GenericGetAttr(self, name);
    if (value != NULL || original == NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return value;
    }
    PyErr_Clear();
    return PyObject_GetAttr(original, name);
}

/* Where SELF's __module__ and QUALNAME lead in sys.modules (an attribute per dotted part): a new
   reference, or NULL, with no exception, where they lead nowhere. No module is imported for it. */
static PyObject *stand_in_home(PyObject *self, PyObject *qualname) {
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

/* pickle's way with SELF, as with a function: by reference. Where its module and qualified name lead to
   SELF (runpy.run_path, importlib's _find_and_load), the name: pickle writes the reference a function
   gets, byte for byte. Elsewhere (a door put on a subclass, or in importlib.util while its __module__
   names importlib._bootstrap) pickle would refuse a name that leads to another object, so SELF stands
   for ORIGINAL: min() of a one-item tuple is that item, the function, pickled by reference as under
   plain python and unpickled as the function itself. */
static PyObject *stand_in_reduce(PyObject *self, PyObject *original) {
    PyObject *qualname = PyObject_GetAttrString(self, "__qualname__");
    if (qualname == NULL) {
        return NULL;
    }
    PyObject *home = stand_in_home(self, qualname);
    Py_XDECREF(home);
    if (home == self) {
        return qualname;
    }
    Py_DECREF(qualname);
    PyObject *least = PyDict_GetItemString(PyEval_GetBuiltins(), "min"); /* borrowed */
    if (least == NULL) {
        PyErr_SetString(PyExc_TypeError, "cannot pickle importwatch's stand-in without builtins.min");
        return NULL;
    }
    return Py_BuildValue("(O((O)))", least, original);
}

/* As a function is: bound to an instance when read from a class (a loader's exec_module). */
static PyObject *stand_in_get(PyObject *self, PyObject *instance, PyObject *owner) {
    (void)owner;
    if (instance == NULL || instance == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, instance);
}

/* copy.copy and copy.deepcopy give a function itself: so for what stands in its place. */
static PyObject *stand_in_itself(PyObject *self, PyObject *unused) {
    (void)unused;
    Py_INCREF(self);
    return self;
}

/* -- the hook, in _find_and_load's place ------------------------------------------------------ */
/* Read, pickled and copied as importlib's _find_and_load is (above): its names, module,
   globals and code, and __wrapped__, inspect.signature's way to its signature. */
static PyObject *hook_getattro(PyObject *self, PyObject *name) {
    return stand_in_getattr(self, name, ((Hook *)self)->original);
}

static PyObject *hook_reduce_ex(PyObject *self, PyObject *protocol) {
    (void)protocol;
    return stand_in_reduce(self, ((Hook *)self)->original);
}

static PyObject *hook_original_doc(PyObject *self, void *unused) {
    (void)unused;
    return PyObject_GetAttrString(((Hook *)self)->original, "__doc__");
}

static PyObject *hook_wrapped(PyObject *self, void *unused) {
    (void)unused;
    Py_INCREF(((Hook *)self)->original);
    return ((Hook *)self)->original;
}

static PyGetSetDef hook_getset[] = {
    {"__doc__", hook_original_doc, NULL, NULL, NULL},
    {"__wrapped__", hook_wrapped, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef hook_methods[] = {
    {"__reduce_ex__", hook_reduce_ex, METH_O, NULL},
    {"__copy__", stand_in_itself, METH_NOARGS, NULL},
    {"__deepcopy__", stand_in_itself, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};
