/* Part of _speedups.c: starting the watcher without copying the program (watcher_launch.py's C way).
 *
 * The watcher must never be the program's child (its os.wait() would see it), so it is started
 * through an intermediate process that leaves at once. Two fork()s copy the program's page tables
 * twice: 1.5 to 2.5 ms for a bare interpreter, and far more for a fork child of a process that has
 * torch loaded, which starts a watcher of its own. Here both processes share the program's memory
 * (clone with CLONE_VM | CLONE_VFORK, as posix_spawn does), each on a stack of its own, and do
 * nothing but system calls: the intermediate clones the watcher-to-be and leaves; the
 * watcher-to-be puts its descriptors in place and execs. The calling thread waits meanwhile (the
 * vfork), every signal blocked, so no handler of the program's runs on our stacks.
 *
 * Included once by _speedups.c: one translation unit. Not compiled on its own. */

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#define SPAWN_STACK (64 * 1024)

typedef struct {
    const char *executable;
    char **argv, **envp;
    int stderr_fd;
    int keep[8], keep_count;
    sigset_t mask;     /* the caller's, the watcher's once it is in place */
    char *second_top;  /* the watcher-to-be's stack */
    volatile pid_t watcher;
    volatile int error; /* errno of what failed, in either process */
} Spawn;

/* /dev/null on FD (0 or 1) in the watcher-to-be; -1 on failure. */
static int null_on(int fd, int mode) {
    int null = open("/dev/null", mode);
    if (null < 0) {
        return -1;
    }
    if (null != fd && (dup2(null, fd) < 0 || close(null) < 0)) {
        return -1;
    }
    return 0;
}

/* The watcher-to-be: its own session, in /, stdin and stdout on /dev/null, the program's stderr on
   2, the kept descriptors inherited, no handler of the program's, its signal mask; then the exec. */
static int become_watcher(void *arg) {
    Spawn *spawn = arg;
    struct sigaction plain;
    memset(&plain, 0, sizeof plain);
    plain.sa_handler = SIG_DFL;
    for (int number = 1; number < NSIG; number++) {
        struct sigaction seen;
        if (sigaction(number, NULL, &seen) == 0 && seen.sa_handler != SIG_DFL && seen.sa_handler != SIG_IGN) {
            sigaction(number, &plain, NULL);
        }
    }
    if (setsid() < 0 || chdir("/") < 0 || null_on(0, O_RDONLY) < 0 || null_on(1, O_WRONLY) < 0 ||
        (spawn->stderr_fd != 2 && dup2(spawn->stderr_fd, 2) < 0)) {
        goto failed;
    }
    for (int i = 0; i < spawn->keep_count; i++) {
        if (fcntl(spawn->keep[i], F_SETFD, 0) < 0) {
            goto failed;
        }
    }
    sigprocmask(SIG_SETMASK, &spawn->mask, NULL);
    execve(spawn->executable, spawn->argv, spawn->envp);
failed:
    spawn->error = errno;
    _exit(127);
}

/* The intermediate process: clones the watcher-to-be, which is orphaned when this one leaves. */
static int intermediate(void *arg) {
    Spawn *spawn = arg;
    pid_t watcher = clone(become_watcher, spawn->second_top, CLONE_VM | CLONE_VFORK | SIGCHLD, spawn);
    if (watcher < 0) {
        spawn->error = errno;
    } else {
        spawn->watcher = watcher; /* the exec has happened, or the watcher-to-be has failed */
    }
    _exit(0);
}

/* A NULL-ended array of the bytes in LIST (borrowed from it); NULL with an exception. */
static char **byte_strings(PyObject *list) {
    Py_ssize_t size = PyList_Size(list);
    char **strings = size < 0 ? NULL : PyMem_Calloc((size_t)size + 1, sizeof(char *));
    if (strings == NULL) {
        return size < 0 ? NULL : (char **)PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        if ((strings[i] = PyBytes_AsString(PyList_GET_ITEM(list, i))) == NULL) {
            PyMem_Free(strings);
            return NULL;
        }
    }
    return strings;
}

/* spawn_detached(executable, argv, env, stderr_fd, keep): the watcher's pid; OSError when it could not be
   started. ARGV and ENV are lists of bytes (ENV's as b"NAME=value"); KEEP, the descriptors it inherits. */
static PyObject *spawn_detached(PyObject *module, PyObject *args) {
    (void)module;
    const char *executable;
    PyObject *argv_list, *env_list, *keep;
    Spawn spawn;
    memset(&spawn, 0, sizeof spawn);
    if (!PyArg_ParseTuple(args, "yO!O!iO!:spawn_detached", &executable, &PyList_Type, &argv_list, &PyList_Type,
                          &env_list, &spawn.stderr_fd, &PyTuple_Type, &keep)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(keep) > (Py_ssize_t)(sizeof spawn.keep / sizeof spawn.keep[0])) {
        PyErr_SetString(PyExc_ValueError, "spawn_detached: too many descriptors to keep");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keep); i++) {
        long fd = PyLong_AsLong(PyTuple_GET_ITEM(keep, i));
        if (fd == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (fd < 0 || fd > 0x7fffffffL) {
            PyErr_SetString(PyExc_ValueError, "spawn_detached: not a descriptor");
            return NULL;
        }
        spawn.keep[spawn.keep_count++] = (int)fd;
    }
    spawn.executable = executable;
    spawn.argv = byte_strings(argv_list);
    spawn.envp = spawn.argv == NULL ? NULL : byte_strings(env_list);
    char *stacks = spawn.envp == NULL ? MAP_FAILED
                                      : mmap(NULL, 2 * SPAWN_STACK, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    PyObject *result = NULL;
    if (stacks == MAP_FAILED) {
        if (!PyErr_Occurred()) {
            PyErr_SetFromErrno(PyExc_OSError);
        }
        goto done;
    }
    spawn.second_top = stacks + 2 * SPAWN_STACK;
    spawn.watcher = -1;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &spawn.mask);
    pid_t middle = clone(intermediate, stacks + SPAWN_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, &spawn);
    int cloned = errno;
    pthread_sigmask(SIG_SETMASK, &spawn.mask, NULL);
    munmap(stacks, 2 * SPAWN_STACK);
    if (middle < 0) {
        errno = cloned;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    int status;
    while (waitpid(middle, &status, 0) < 0 && errno == EINTR) {
    }
    if (spawn.error != 0 || spawn.watcher <= 0) {
        errno = spawn.error ? spawn.error : ECHILD;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyLong_FromLong((long)spawn.watcher);
done:
    PyMem_Free(spawn.argv);
    PyMem_Free(spawn.envp);
    return result;
}

/* child_subreaper(): whether this process is a child subreaper (PR_SET_CHILD_SUBREAPER): then an
   orphaned watcher would become its child. */
static PyObject *child_subreaper(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    int flag = 0;
    if (prctl(PR_GET_CHILD_SUBREAPER, &flag, 0, 0, 0) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong(flag);
}
