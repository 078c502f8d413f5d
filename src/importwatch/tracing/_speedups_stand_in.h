/* Part of _speedups.c: what a C object put in the place of a Python function (the import hook, a Door)
 * shows a program that looks at that function rather than calls it.
 *
 * importlib's _find_and_load, runpy.run_path and the like are functions; a program, a tool or pickle
 * may read their attributes, pickle them by reference (a multiprocessing or Ray target) or copy them
 * (copy and deepcopy keep a function as it is). The object in their place reads what it lacks from
 * the function it stands for, pickles as a reference to where it is found, and is itself under copy.
 *
 * Each such type (the Hook, Door, Follower) begins as a StandIn does, the function it stands for at
 * the same place, so that one getattro, one set of methods and one getset serve them all; make_module
 * checks the places.
 *
 * Included once by _speedups.c, after its Hook, before the Hook's type and _speedups_door.h: one
 * translation unit. */

/* How each object here begins: a vectorcall object, then the function it stands for. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;
} StandIn;

/* SELF's attribute NAME where it has one, else the original's: __code__, __defaults__, __annotations__,
   and the rest of a function's; what neither has fails with the function's own AttributeError. */
static PyObject *stand_in_getattro(PyObject *self, PyObject *name) {
    PyObject *original = ((StandIn *)self)->original;
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
   for the original: min() of a one-item tuple is that item, the function, pickled by reference as
   under plain python and unpickled as the function itself. */
static PyObject *stand_in_reduce_ex(PyObject *self, PyObject *protocol) {
    (void)protocol;
    PyObject *original = ((StandIn *)self)->original;
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

static PyMethodDef stand_in_methods[] = {
    {"__reduce_ex__", stand_in_reduce_ex, METH_O, NULL},
    {"__copy__", stand_in_itself, METH_NOARGS, NULL},
    {"__deepcopy__", stand_in_itself, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

/* The original's docstring (the type's own would come first) and __wrapped__, inspect.signature's way
   to the original's signature: for the types with no __dict__ of their own (a Door keeps both there). */
static PyObject *stand_in_doc(PyObject *self, void *unused) {
    (void)unused;
    return PyObject_GetAttrString(((StandIn *)self)->original, "__doc__");
}

static PyObject *stand_in_wrapped(PyObject *self, void *unused) {
    (void)unused;
    Py_INCREF(((StandIn *)self)->original);
    return ((StandIn *)self)->original;
}

static PyGetSetDef stand_in_getset[] = {
    {"__doc__", stand_in_doc, NULL, NULL, NULL},
    {"__wrapped__", stand_in_wrapped, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
