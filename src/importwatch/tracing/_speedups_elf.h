/* Part of _speedups.c: a native load's facts read in C, facts/elf.py's read_dynamic and facts/loaded.py's
   look at the dynamic loader's own list.

   Each native load reads what the file links before dlopen is called (tracing/native.py). In Python that
   was 45-65 us a load, and the first load of a process imported elf.py (0.3-0.5 ms), in nearly every
   program: math, _json, _struct and _socket are such loads. The answer is elf.py's, value for value, and
   elf.py stays the pure-Python twin (tests/test_elf.py reads every file with both). Every system call is
   made with the GIL released, as os.open and os.pread make them: a file system that blocks stops the
   loading thread alone, and the watchdog names the load it is in. */

#include <fcntl.h>
#include <stdint.h>
#if defined(__linux__)
#include <link.h>
#endif

/* elf.py's bounds: what is read first, the largest table believed, the longest string looked for. */
enum { ELF_HEAD = 4096, ELF_MAX_TABLE = 1 << 20, ELF_MAX_STRING = 1 << 16 };
enum { ELF_PT_LOAD = 1, ELF_PT_DYNAMIC = 2, ELF_PN_XNUM = 0xFFFF };
enum { ELF_DT_NULL = 0, ELF_DT_NEEDED = 1, ELF_DT_STRTAB = 5, ELF_DT_STRSZ = 10 };
/* The three strings read besides DT_NEEDED's, in DynamicInfo's order after needed. */
static const uint64_t elf_named_tags[3] = {15 /* DT_RPATH */, 29 /* DT_RUNPATH */, 14 /* DT_SONAME */};
/* os.pread's offset is an off_t: beyond it, elf.py meets OverflowError, and answers None. */
#define ELF_OFF_MAX (sizeof(off_t) == 8 ? (uint64_t)INT64_MAX : (uint64_t)INT32_MAX)

typedef struct {
    int fd, big;      /* the file, and its byte order */
    Py_ssize_t count; /* DT_NEEDED entries */
    char **strings;   /* count names, then rpath, runpath, soname (NULL: absent); each PyMem_Raw'd */
} ElfRead;

/* An unsigned SIZE-byte number at AT, in the file's byte order. */
static uint64_t elf_number(const ElfRead *elf, const unsigned char *at, int size) {
    uint64_t value = 0;
    for (int i = 0; i < size; i++) {
        value = (value << 8) | at[elf->big ? i : size - 1 - i];
    }
    return value;
}

/* os.pread's answer: up to SIZE bytes at OFFSET into BUFFER; -1 where it fails. */
static Py_ssize_t elf_pread(const ElfRead *elf, unsigned char *buffer, uint64_t size, uint64_t offset) {
    if (offset > ELF_OFF_MAX) {
        return -1;
    }
    ssize_t got;
    do {
        got = pread(elf->fd, buffer, (size_t)size, (off_t)offset);
    } while (got < 0 && errno == EINTR);
    return got;
}

/* elf.py's _pread: exactly SIZE bytes at OFFSET, in a buffer the caller frees; NULL where short or failing. */
static unsigned char *elf_exactly(const ElfRead *elf, uint64_t size, uint64_t offset) {
    unsigned char *buffer = PyMem_RawMalloc(size ? (size_t)size : 1);
    if (buffer != NULL && elf_pread(elf, buffer, size, offset) != (Py_ssize_t)size) {
        PyMem_RawFree(buffer);
        buffer = NULL;
    }
    return buffer;
}

static char *elf_copy(const unsigned char *text, size_t size) {
    char *copy = PyMem_RawMalloc(size + 1);
    if (copy != NULL) {
        memcpy(copy, text, size);
        copy[size] = '\0';
    }
    return copy;
}

/* The string at OFFSET of the string table at BASE (SIZE bytes), from BLOCK (GOT bytes read from the table's
   offset LOW) when it lies there, else read: elf.py's _Strings.get. NULL where it cannot be had. */
static char *elf_string(const ElfRead *elf, const unsigned char *block, Py_ssize_t got, uint64_t low,
                        uint64_t base, uint64_t size, uint64_t offset) {
    uint64_t start = offset - low;
    if (start < (uint64_t)got) {
        const unsigned char *end = memchr(block + start, 0, (size_t)(got - (Py_ssize_t)start));
        if (end != NULL) {
            return elf_copy(block + start, (size_t)(end - (block + start)));
        }
    }
    static const uint64_t tries[2] = {256, ELF_MAX_STRING}; /* a name is short; a search path may be long */
    if (base > ELF_OFF_MAX || offset > ELF_OFF_MAX - base) {
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        uint64_t want = tries[i] < size - offset ? tries[i] : size - offset;
        unsigned char *data = PyMem_RawMalloc((size_t)want + 1);
        Py_ssize_t read = data ? elf_pread(elf, data, want, base + offset) : -1;
        const unsigned char *end = read > 0 ? memchr(data, 0, (size_t)read) : NULL;
        char *copy = end != NULL ? elf_copy(data, (size_t)(end - data)) : NULL;
        PyMem_RawFree(data);
        if (copy != NULL || read < 0) {
            return copy;
        }
    }
    return NULL;
}

/* elf.py's _read, with no Python object: 1 with what it found in elf->strings (nothing: a file that asks
   nothing of the dynamic linker), 0 where elf.py answers None. Runs with the GIL released. */
static int elf_read(ElfRead *elf) {
    unsigned char head[ELF_HEAD];
    Py_ssize_t got = elf_pread(elf, head, ELF_HEAD, 0);
    if (got < 52 || memcmp(head, "\x7f" "ELF", 4) != 0 || head[4] < 1 || head[4] > 2 || head[5] < 1 ||
        head[5] > 2) {
        return 0;
    }
    int wide = head[4] == 2, word = wide ? 8 : 4;
    elf->big = head[5] == 2;
    if ((wide ? 60 : 48) > got) { /* the fields read below: past a short head, elf.py's _Corrupt */
        return 0;
    }
    uint64_t phoff = elf_number(elf, head + (wide ? 32 : 28), word);
    uint64_t shoff = elf_number(elf, head + (wide ? 40 : 32), word);
    uint64_t phentsize = elf_number(elf, head + (wide ? 54 : 42), 2);
    uint64_t phnum = elf_number(elf, head + (wide ? 56 : 44), 2);
    uint64_t shentsize = elf_number(elf, head + (wide ? 58 : 46), 2);
    if (phnum == ELF_PN_XNUM) { /* the real count is section header 0's sh_info */
        unsigned char *section = elf_exactly(elf, shentsize, shoff);
        int whole = section != NULL && shentsize >= (uint64_t)(wide ? 48 : 32);
        phnum = whole ? elf_number(elf, section + (wide ? 44 : 28), 4) : 0; /* 0: None, below */
        PyMem_RawFree(section);
    }
    if (phnum == 0 || phentsize < (uint64_t)(wide ? 56 : 32) || phentsize % word ||
        phentsize * phnum > ELF_MAX_TABLE) {
        return 0;
    }
    uint64_t table_size = phentsize * phnum, stride = phentsize;
    int in_head = phoff <= (uint64_t)got && table_size <= (uint64_t)got - phoff;
    unsigned char *owned = in_head ? NULL : elf_exactly(elf, table_size, phoff); /* freed at done */
    const unsigned char *table = in_head ? head + phoff : owned;
    if (table == NULL) {
        return 0;
    }
    /* Each entry's p_type (the low half of ELF64's first word), p_offset, p_vaddr and p_filesz words. */
#define ENTRY_WORD(entry, index) elf_number(elf, table + (entry) * stride + (index) * word, word)
#define ENTRY_TYPE(entry) ((ENTRY_WORD(entry, 0) >> (wide && elf->big ? 32 : 0)) & 0xFFFFFFFFu)
    unsigned char *pairs = NULL; /* the dynamic entries, freed at done */
    uint64_t *needed = NULL;     /* DT_NEEDED's string offsets, freed at done */
    int found = 0;
    uint64_t dynamic = phnum;
    for (uint64_t entry = 0; entry < phnum && dynamic == phnum; entry++) {
        dynamic = ENTRY_TYPE(entry) == ELF_PT_DYNAMIC ? entry : phnum;
    }
    if (dynamic == phnum) {
        found = 1; /* statically linked: it asks nothing of the dynamic linker */
        goto done;
    }
    uint64_t offset = ENTRY_WORD(dynamic, 1), size = ENTRY_WORD(dynamic, 4);
    if (size > ELF_MAX_TABLE || size < (uint64_t)(2 * word)) {
        goto done;
    }
    /* The dynamic entries, up to DT_NULL: DT_NEEDED's in order, and the last of each other tag. */
    uint64_t pair = 2 * (uint64_t)word, entries = size / pair;
    pairs = elf_exactly(elf, entries * pair, offset);
    needed = pairs ? PyMem_RawMalloc((size_t)entries * sizeof(uint64_t) + 1) : NULL;
    uint64_t strtab = 0, strsz = 0, named[3] = {0, 0, 0};
    int has_strtab = 0, has_strsz = 0, has_named[3] = {0, 0, 0}, ended = 0;
    Py_ssize_t count = 0;
    for (uint64_t i = 0; needed != NULL && i < entries && !ended; i++) {
        uint64_t tag = elf_number(elf, pairs + i * pair, word), value = elf_number(elf, pairs + i * pair + word, word);
        ended = tag == ELF_DT_NULL;
        if (ended) {
            break;
        }
        if (tag == ELF_DT_NEEDED) {
            needed[count++] = value;
        } else if (tag == ELF_DT_STRTAB) {
            strtab = value, has_strtab = 1;
        } else if (tag == ELF_DT_STRSZ) {
            strsz = value, has_strsz = 1;
        }
        for (int n = 0; n < 3; n++) {
            if (tag == elf_named_tags[n]) {
                named[n] = value, has_named[n] = 1;
            }
        }
    }
    if (needed == NULL || !ended) {
        goto done;
    }
    if (count == 0 && !has_named[0] && !has_named[1] && !has_named[2]) {
        found = 1; /* nothing to read: an empty DynamicInfo */
        goto done;
    }
    if (!has_strtab || !has_strsz) {
        goto done;
    }
    /* Where DT_STRTAB's address lies in the file: the PT_LOAD segment holding it says. */
    uint64_t base = 0;
    int located = 0;
    for (uint64_t entry = 0; entry < phnum && !located; entry++) {
        uint64_t vaddr = ENTRY_WORD(entry, 2), filesz = ENTRY_WORD(entry, 4);
        if (ENTRY_TYPE(entry) == ELF_PT_LOAD && vaddr <= strtab && strtab - vaddr < filesz) {
            uint64_t start = ENTRY_WORD(entry, 1);
            if (strtab - vaddr > UINT64_MAX - start) {
                goto done; /* beyond 64 bits: elf.py's pread overflows, None here too */
            }
            base = strtab - vaddr + start;
            located = 1;
        }
    }
#undef ENTRY_TYPE
#undef ENTRY_WORD
    if (!located) {
        goto done;
    }
    /* The strings: one read of the span they lie in when it is short, else one read each. */
    uint64_t low = UINT64_MAX, high = 0;
    for (Py_ssize_t i = 0; i < count + 3; i++) {
        int present = i < count || has_named[i - count];
        uint64_t at = i < count ? needed[i] : named[i - count];
        if (present) {
            low = at < low ? at : low;
            high = at > high ? at : high;
        }
    }
    if (high >= strsz || base > ELF_OFF_MAX || low > ELF_OFF_MAX - base) {
        goto done;
    }
    uint64_t span = high - low < ELF_MAX_STRING ? high - low + 256 : 256;
    span = span < strsz - low ? span : strsz - low;
    unsigned char *block = PyMem_RawMalloc((size_t)span);
    Py_ssize_t block_got = block ? elf_pread(elf, block, span, base + low) : -1;
    elf->strings = block_got >= 0 ? PyMem_RawCalloc((size_t)count + 3, sizeof(char *)) : NULL;
    found = elf->strings != NULL;
    elf->count = found ? count : 0;
    for (Py_ssize_t i = 0; found && i < count + 3; i++) {
        if (i < count || has_named[i - count]) {
            uint64_t at = i < count ? needed[i] : named[i - count];
            elf->strings[i] = elf_string(elf, block, block_got, low, base, strsz, at);
            found = elf->strings[i] != NULL;
        }
    }
    PyMem_RawFree(block);
done:
    PyMem_RawFree(owned);
    PyMem_RawFree(pairs);
    PyMem_RawFree(needed);
    return found;
}

static void elf_clear(ElfRead *elf) {
    for (Py_ssize_t i = 0; elf->strings != NULL && i < elf->count + 3; i++) {
        PyMem_RawFree(elf->strings[i]);
    }
    PyMem_RawFree(elf->strings);
    elf->strings = NULL;
}

/* read_dynamic(path): elf.read_dynamic's values as (needed, rpath, runpath, soname), or None. */
static PyObject *read_dynamic(PyObject *module, PyObject *path) {
    (void)module;
    PyObject *encoded = NULL;
    if (!PyUnicode_FSConverter(path, &encoded)) { /* what os.open refuses: elf.py answers None */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    ElfRead elf = {-1, 0, 0, NULL};
    int found = 0;
    Py_BEGIN_ALLOW_THREADS
    do {
        elf.fd = open(PyBytes_AS_STRING(encoded), O_RDONLY | O_CLOEXEC);
    } while (elf.fd < 0 && errno == EINTR);
    if (elf.fd >= 0) {
        found = elf_read(&elf);
        close(elf.fd);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(encoded);
    PyObject *result = NULL, *needed = found ? PyTuple_New(elf.count) : NULL;
    for (Py_ssize_t i = 0; needed != NULL && i < elf.count; i++) {
        PyObject *name = PyUnicode_DecodeFSDefault(elf.strings[i]);
        if (name == NULL) {
            Py_CLEAR(needed);
            break;
        }
        PyTuple_SET_ITEM(needed, i, name);
    }
    if (needed != NULL) {
        PyObject *named[3] = {NULL, NULL, NULL};
        int ok = 1;
        for (int n = 0; n < 3 && ok; n++) {
            char *text = elf.strings ? elf.strings[elf.count + n] : NULL;
            named[n] = text ? PyUnicode_DecodeFSDefault(text) : (Py_INCREF(Py_None), Py_None);
            ok = named[n] != NULL;
        }
        result = ok ? PyTuple_Pack(4, needed, named[0], named[1], named[2]) : NULL;
        for (int n = 0; n < 3; n++) {
            Py_XDECREF(named[n]);
        }
        Py_DECREF(needed);
    }
    elf_clear(&elf);
    if (result == NULL) { /* not ELF, corrupt, unreadable, or a name the file system codec refuses */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return result;
}

#if defined(__linux__)
/* The loader's counters of objects ever added and removed, the same in every entry: the first one says. */
static int look_counters(struct dl_phdr_info *info, size_t size, void *counters) {
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        ((unsigned long long *)counters)[0] = info->dlpi_adds;
        ((unsigned long long *)counters)[1] = info->dlpi_subs;
        ((unsigned long long *)counters)[2] = 1;
    }
    return 1;
}

/* loaded_counters(): (adds, subs) from dl_iterate_phdr, () where the loader gives none (loaded.py). */
static PyObject *loaded_counters(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    unsigned long long counters[3] = {0, 0, 0};
    dl_iterate_phdr(look_counters, counters);
    return counters[2] ? Py_BuildValue("(KK)", counters[0], counters[1]) : PyTuple_New(0);
}

static int look_name(struct dl_phdr_info *info, size_t size, void *names) {
    (void)size; /* dlpi_name is in every version of the struct */
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0') {
        return 0;
    }
    PyObject *name = PyBytes_FromString(info->dlpi_name);
    int failed = name == NULL || PyList_Append(names, name) < 0;
    Py_XDECREF(name);
    return failed; /* non-zero ends the walk, the exception set */
}

/* loaded_names(): each loaded object's name as the loader opened it, in load order (loaded.py). */
static PyObject *loaded_names(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    PyObject *names = PyList_New(0);
    if (names != NULL && dl_iterate_phdr(look_name, names) != 0) {
        Py_CLEAR(names);
    }
    return names;
}

#define LOADED_METHODS                                                                                           \
    {"loaded_counters", loaded_counters, METH_NOARGS,                                                          \
     "loaded_counters(): the dynamic loader's (adds, subs) counters, () where it keeps none (loaded.py)."},     \
        {"loaded_names", loaded_names, METH_NOARGS,                                                            \
         "loaded_names(): each loaded object's name as the loader opened it, as bytes, in load order."},
#else
#define LOADED_METHODS
#endif

#define ELF_METHODS                                                                                              \
    {"read_dynamic", read_dynamic, METH_O,                                                                     \
     "read_dynamic(path): facts/elf.py's read_dynamic as (needed, rpath, runpath, soname), or None."},         \
        LOADED_METHODS
