/* Part of _speedups.c: the attributes the hook reads per import, read the short way, with what
 * getattr would give.
 *
 * A generic getattr finds a name on the type (its MRO, cached) and then in the instance; for our
 * objects that is about 150 to 250 instructions a read, and an import's two lines read some thirty.
 * Two shorter ways, each taken only where it gives what getattr gives, and getattr otherwise:
 * - a slot (__slots__: TracedStep, Channel, Feed, Ring): the type lookup, then the value at the
 *   slot's offset, as member_get reads an object member;
 * - the sink's and the tracer's own attributes: their __dict__, held by the hook, when neither type
 *   has a data descriptor (a property) of that name, which getattr would prefer (held_dict checks
 *   that once, when the hook is made).
 *
 * Included once by _speedups.c, after its Hook: one translation unit. Not compiled on its own. */

#include <structmember.h> /* T_OBJECT_EX */

/* Whether TYPE's setattr is object's, or the sink's count of it before object's (_speedups_route.h). */
static int plain_setattr(PyTypeObject *type) {
    return type->tp_setattro == PyObject_GenericSetAttr || type->tp_setattro == counted_setattro;
}

/* Where NAME is an object slot of OBJECT's type (a member descriptor of a class in its MRO, no flags),
   the address of its value in OBJECT; NULL for anything else. */
static PyObject **slot_address(PyObject *object, PyObject *name) {
    PyTypeObject *type = Py_TYPE(object);
    if (type->tp_getattro != PyObject_GenericGetAttr || !plain_setattr(type)) {
        return NULL;
    }
    PyObject *descr = _PyType_Lookup(type, name); /* borrowed; the type's cache */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        return NULL;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    PyTypeObject *owner = PyDescr_TYPE(descr);
    if (member->type != T_OBJECT_EX || member->flags != 0 || (owner != type && !PyType_IsSubtype(type, owner))) {
        return NULL;
    }
    return (PyObject **)((char *)object + member->offset);
}

/* OBJECT.NAME, a new reference, or NULL with an exception (an unset slot: getattr's AttributeError). */
static PyObject *slot_get(PyObject *object, PyObject *name) {
    PyObject **address = slot_address(object, name);
    if (address != NULL && *address != NULL) {
        Py_INCREF(*address);
        return *address;
    }
    return PyObject_GetAttr(object, name);
}

/* OBJECT.NAME = VALUE: 0, or -1 with an exception. */
static int slot_set(PyObject *object, PyObject *name, PyObject *value) {
    PyObject **address = slot_address(object, name);
    if (address == NULL) {
        return PyObject_SetAttr(object, name, value);
    }
    PyObject *old = *address;
    Py_INCREF(value);
    *address = value;
    Py_XDECREF(old);
    return 0;
}

/* OBJECT's __dict__ when reading and storing NAMES there gives what getattr and setattr give (both plain,
   and no data descriptor of those names on the type), else NULL; a new reference. NULL with an exception on
   failure. */
static PyObject *held_dict(PyObject *object, PyObject **const names[], size_t count) {
    PyTypeObject *type = Py_TYPE(object);
    if (type->tp_getattro != PyObject_GenericGetAttr || !plain_setattr(type)) {
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        PyObject *descr = _PyType_Lookup(type, *names[i]);
        if (descr != NULL && Py_TYPE(descr)->tp_descr_set != NULL) {
            return NULL;
        }
    }
    PyObject *dict = PyObject_GenericGetDict(object, NULL);
    if (dict != NULL && !PyDict_CheckExact(dict)) {
        Py_CLEAR(dict);
    }
    if (dict == NULL) {
        PyErr_Clear(); /* no __dict__: getattr reads every name */
    }
    return dict;
}

/* OBJECT.NAME, read from DICT (OBJECT's, from held_dict) when it holds NAME; else as getattr reads it. */
static PyObject *dict_get(PyObject *dict, PyObject *object, PyObject *name) {
    if (dict != NULL) {
        PyObject *value = PyDict_GetItemWithError(dict, name);
        if (value != NULL) {
            Py_INCREF(value);
            return value;
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    return PyObject_GetAttr(object, name);
}

/* sys.modules, from the module's dictionary as the module's getattr finds it. */
static PyObject *sys_modules(PyObject *sys) {
    PyObject *modules = PyDict_GetItemWithError(PyModule_GetDict(sys), s_modules);
    if (modules != NULL) {
        Py_INCREF(modules);
        return modules;
    }
    return PyErr_Occurred() ? NULL : PyObject_GetAttr(sys, s_modules);
}

/* A truth value or a C long, read as above: -1 with an exception on failure. */
static int as_truth(PyObject *value) {
    if (value == NULL) {
        return -1;
    }
    int result = PyObject_IsTrue(value);
    Py_DECREF(value);
    return result;
}

static long as_long(PyObject *value) {
    if (value == NULL) {
        return -1;
    }
    long result = PyLong_AsLong(value);
    Py_DECREF(value);
    return result;
}

/* An int as a long long; -1 with an exception when it is none or too large. A 64-bit long's conversion
   where there is one: PyLong_AsLongLong takes a slower road for a number of more than one digit. */
static long long as_wide(PyObject *value) {
#if LONG_MAX >= 0x7fffffffffffffffL
    return PyLong_AsLong(value);
#else
    return PyLong_AsLongLong(value);
#endif
}

/* The sink's and the tracer's attributes, through their held dictionaries. */
static PyObject *sink_get(Hook *self, PyObject *name) {
    return dict_get(self->sink_dict, self->sink, name);
}

static PyObject *tracer_get(Hook *self, PyObject *name) {
    return dict_get(self->tracer_dict, self->tracer, name);
}
