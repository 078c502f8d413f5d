/* Part of _speedups.c: starting the watcher without copying the program (watcher_launch.py's C way).
 *
 * The watcher must never be the program's child (its os.wait() would see it), so it is started
 * through an intermediate process that leaves at once. Two fork()s copy the program's page tables
 * twice: 1.5 to 2.5 ms for a bare interpreter, and far more for a fork child of a process that has
 * torch loaded, which starts a watcher of its own. Here both processes share the program's memory
 * (clone with CLONE_VM | CLONE_VFORK, as posix_spawn does), each on a stack of its own, and do
 * nothing but system calls: the intermediate clones the watcher-to-be and leaves; the
 * watcher-to-be puts its descriptors in place and execs.
 *
 * A vfork suspends the thread that clones until the exec: 0.3 ms on an idle machine, 5 to 10 ms
 * when the other cores are busy (the previous job's watcher starting, say), and the program's
 * start-up would wait that long. So a thread of ours does it, every signal blocked, with no Python
 * state (it never takes the GIL), while the program goes on: spawn_detached returns at once, and
 * spawn_started tells how it went. Everything that thread reads is in one mapping of its own, so
 * nothing of the program's is read while the program runs. The intermediate sends no SIGCHLD
 * (its exit signal is 0) and is reaped with __WCLONE, which the program's os.wait() never does.
 *
 * Included once by _speedups.c: one translation unit. Not compiled on its own. */

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#define SPAWN_STACK (64 * 1024)
#define SPAWN_CLOSE 4 /* descriptors the spawning thread closes once the watcher-to-be has its own */

typedef struct {
    const char *executable;
    char **argv, **envp;
    int stderr_fd;
    int keep[8], keep_count;
    sigset_t mask;     /* the caller's, the watcher's once it is in place */
    char *second_top;  /* the watcher-to-be's stack */
    volatile pid_t watcher;
    volatile int error; /* errno of what failed, in either process */
    int copying;       /* the fallback: two copies of the program, as fork makes (see start_watcher) */
    int told[2];       /* then a pipe (close-on-exec): what failed, and the watcher's pid */
    int close[SPAWN_CLOSE], close_count;
    dev_t close_dev[SPAWN_CLOSE], keep_dev[8], stderr_dev;
    ino_t close_ino[SPAWN_CLOSE], keep_ino[8], stderr_ino;
    size_t size; /* of the mapping that holds this, the strings and the stacks */
} Spawn;

/* The last start in the background: 0 while under way, the watcher's pid, or -errno. Written by our
   thread, read by the program's; `spawn_owner` is the process that began it (a fork child has none). */
static int spawn_state;
static pid_t spawn_owner;
/* That thread, until joined: joined once it has told, so that a fork right after (3.12+ counts the
   kernel's threads for its warning) finds it gone. */
static pthread_t spawn_thread_id;
static int spawn_joinable;

/* The last start's thread joined, if it has told its outcome; the GIL released meanwhile. */
static void spawn_join(void) {
    if (spawn_joinable && spawn_owner == getpid() && __atomic_load_n(&spawn_state, __ATOMIC_ACQUIRE) != 0) {
        spawn_joinable = 0;
        Py_BEGIN_ALLOW_THREADS
        pthread_join(spawn_thread_id, NULL);
        Py_END_ALLOW_THREADS
    }
}

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
    if (spawn->copying) { /* the error above is in this process's copy only */
        int told = -errno;
        (void)!write(spawn->told[1], &told, sizeof told);
    }
    _exit(127);
}

/* The intermediate process: clones the watcher-to-be, which is orphaned when this one leaves. */
static int intermediate(void *arg) {
    Spawn *spawn = arg;
    int shared = spawn->copying ? 0 : CLONE_VM;
    pid_t watcher = clone(become_watcher, spawn->second_top, shared | CLONE_VFORK | SIGCHLD, spawn);
    if (watcher < 0) {
        spawn->error = errno;
    } else {
        spawn->watcher = watcher; /* the exec has happened, or the watcher-to-be has failed */
    }
    if (spawn->copying) {
        int told = watcher < 0 ? -spawn->error : watcher;
        (void)!write(spawn->told[1], &told, sizeof told);
    }
    _exit(0);
}

/* The intermediate cloned and reaped: the watcher's pid, or -errno. The calling thread's signals are
   all blocked meanwhile, so no handler of the program's runs on the stacks the clones share. Where a
   sandbox refuses a clone that shares memory (seccomp), the same two processes are copies of the
   program, as fork makes them, and tell what became of them through a pipe. */
static int start_watcher(Spawn *spawn, char *stacks) {
    spawn->second_top = stacks + 2 * SPAWN_STACK;
    spawn->watcher = -1;
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    pid_t middle = clone(intermediate, stacks + SPAWN_STACK, CLONE_VM | CLONE_VFORK, spawn);
    int cloned = errno;
    if (middle < 0 && (cloned == EPERM || cloned == ENOSYS || cloned == EINVAL) && pipe2(spawn->told, O_CLOEXEC) == 0) {
        spawn->copying = 1;
        middle = clone(intermediate, stacks + SPAWN_STACK, CLONE_VFORK, spawn);
        cloned = errno;
        close(spawn->told[1]);
    }
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (middle >= 0) {
        int status;
        while (waitpid(middle, &status, __WCLONE) < 0 && errno == EINTR) {
        }
    }
    if (spawn->copying) {
        int told[2] = {0, 0};
        ssize_t got = read(spawn->told[0], told, sizeof told);
        close(spawn->told[0]);
        if (middle >= 0) {
            spawn->error = got < (ssize_t)sizeof(int) ? ECHILD : told[0] < 0 ? -told[0] : 0;
            spawn->watcher = got >= (ssize_t)sizeof(int) && told[0] > 0 ? told[0] : -1;
        }
    }
    if (middle < 0) {
        return -cloned;
    }
    if (spawn->error != 0 || spawn->watcher <= 0) {
        return -(spawn->error ? spawn->error : ECHILD);
    }
    return spawn->watcher;
}

/* Whether FD is still the file it was (DEV, INO): the program may have closed it and opened its own there. */
static int same_file(int fd, dev_t dev, ino_t ino) {
    struct stat seen;
    return fstat(fd, &seen) == 0 && seen.st_dev == dev && seen.st_ino == ino;
}

/* The thread of ours that starts the watcher: then it closes what only the watcher needed (each
   only while it is still the file it was: the program may have put its own at that number), tells
   the outcome and unmaps everything it used. What it hands on must still be ours: the program runs
   meanwhile, and a descriptor of its own at one of those numbers must never reach the watcher. */
static void *spawn_thread(void *arg) {
    Spawn *spawn = arg;
    char *stacks = (char *)spawn + spawn->size - 2 * SPAWN_STACK;
    int outcome = same_file(spawn->stderr_fd, spawn->stderr_dev, spawn->stderr_ino) ? 0 : -EBADF;
    for (int i = 0; i < spawn->keep_count && outcome == 0; i++) { /* never a file of the program's handed on */
        if (!same_file(spawn->keep[i], spawn->keep_dev[i], spawn->keep_ino[i])) {
            outcome = -EBADF;
        }
    }
    if (outcome == 0) {
        outcome = start_watcher(spawn, stacks);
    }
    for (int i = 0; i < spawn->close_count; i++) {
        if (same_file(spawn->close[i], spawn->close_dev[i], spawn->close_ino[i])) {
            close(spawn->close[i]);
        }
    }
    munmap(spawn, spawn->size);
    __atomic_store_n(&spawn_state, outcome, __ATOMIC_RELEASE);
    return NULL;
}

/* Bytes from LIST copied to AT (NULL-ended pointers into TEXT, which advances); -1 with an exception. */
static int copy_strings(PyObject *list, char **at, char **text) {
    Py_ssize_t size = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < size; i++) {
        char *bytes;
        Py_ssize_t length;
        if (PyBytes_AsStringAndSize(PyList_GET_ITEM(list, i), &bytes, &length) < 0) {
            return -1;
        }
        at[i] = *text;
        memcpy(*text, bytes, (size_t)length + 1);
        *text += length + 1;
    }
    at[size] = NULL;
    return 0;
}

/* The room the strings of LIST take, ended by NUL; -1 with an exception. */
static Py_ssize_t strings_size(PyObject *list) {
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "spawn_detached: bytes expected");
            return -1;
        }
        total += PyBytes_GET_SIZE(item) + 1;
    }
    return total;
}

/* The descriptors of a tuple of ints, checked, into FDS (at most MOST); their count, or -1 with an exception. */
static int descriptors(PyObject *tuple, int *fds, int most) {
    if (PyTuple_GET_SIZE(tuple) > most) {
        PyErr_SetString(PyExc_ValueError, "spawn_detached: too many descriptors");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        long fd = PyLong_AsLong(PyTuple_GET_ITEM(tuple, i));
        if (fd == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (fd < 0 || fd > 0x7fffffffL) {
            PyErr_SetString(PyExc_ValueError, "spawn_detached: not a descriptor");
            return -1;
        }
        fds[i] = (int)fd;
    }
    return (int)PyTuple_GET_SIZE(tuple);
}

/* spawn_detached(executable, argv, env, stderr_fd, keep, close): start the watcher from a thread of ours
   and return at once (spawn_started says how it went). ARGV and ENV are lists of bytes (ENV's as
   b"NAME=value"); KEEP, the descriptors it inherits; CLOSE, those the thread closes once it has them.
   OSError when the thread cannot be started (then nothing was closed). */
static PyObject *spawn_detached(PyObject *module, PyObject *args) {
    (void)module;
    const char *executable;
    PyObject *argv_list, *env_list, *keep, *to_close;
    int stderr_fd;
    if (!PyArg_ParseTuple(args, "yO!O!iO!O!:spawn_detached", &executable, &PyList_Type, &argv_list, &PyList_Type,
                          &env_list, &stderr_fd, &PyTuple_Type, &keep, &PyTuple_Type, &to_close)) {
        return NULL;
    }
    if (spawn_owner == getpid() && __atomic_load_n(&spawn_state, __ATOMIC_ACQUIRE) == 0) {
        PyErr_SetString(PyExc_RuntimeError, "spawn_detached: a start is under way");
        return NULL;
    }
    spawn_join();
    Spawn head;
    memset(&head, 0, sizeof head);
    Py_ssize_t argv_text = strings_size(argv_list), env_text = argv_text < 0 ? -1 : strings_size(env_list);
    if (env_text < 0 || (head.keep_count = descriptors(keep, head.keep, 8)) < 0 ||
        (head.close_count = descriptors(to_close, head.close, SPAWN_CLOSE)) < 0) {
        return NULL;
    }
    struct stat stderr_seen;
    if (fstat(stderr_fd, &stderr_seen) < 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    head.stderr_dev = stderr_seen.st_dev;
    head.stderr_ino = stderr_seen.st_ino;
    for (int i = 0; i < head.keep_count + head.close_count; i++) {
        int close_it = i >= head.keep_count, at = close_it ? i - head.keep_count : i;
        struct stat seen;
        if (fstat(close_it ? head.close[at] : head.keep[at], &seen) < 0) {
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        *(close_it ? &head.close_dev[at] : &head.keep_dev[at]) = seen.st_dev;
        *(close_it ? &head.close_ino[at] : &head.keep_ino[at]) = seen.st_ino;
    }
    /* One mapping: the Spawn, the pointer arrays, the strings, then the two stacks on a page boundary. */
    size_t pointers = (size_t)(PyList_GET_SIZE(argv_list) + PyList_GET_SIZE(env_list) + 2) * sizeof(char *);
    size_t text = strlen(executable) + 1 + (size_t)argv_text + (size_t)env_text;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t front = (sizeof(Spawn) + pointers + text + page - 1) / page * page;
    head.size = front + 2 * SPAWN_STACK;
    char *block = mmap(NULL, head.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (block == MAP_FAILED) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Spawn *spawn = (Spawn *)block;
    *spawn = head;
    spawn->argv = (char **)(block + sizeof(Spawn));
    spawn->envp = spawn->argv + PyList_GET_SIZE(argv_list) + 1;
    char *at = (char *)(spawn->envp + PyList_GET_SIZE(env_list) + 1);
    memcpy(at, executable, strlen(executable) + 1);
    spawn->executable = at;
    at += strlen(executable) + 1;
    if (copy_strings(argv_list, spawn->argv, &at) < 0 || copy_strings(env_list, spawn->envp, &at) < 0) {
        munmap(block, head.size);
        return NULL;
    }
    spawn->stderr_fd = stderr_fd;
    pthread_sigmask(SIG_SETMASK, NULL, &spawn->mask); /* the watcher's, as the program's is now */
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setstacksize(&attributes, 128 * 1024);
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before); /* the thread starts with every signal blocked */
    spawn_owner = getpid();
    __atomic_store_n(&spawn_state, 0, __ATOMIC_RELEASE);
    int failed = pthread_create(&spawn_thread_id, &attributes, spawn_thread, spawn);
    spawn_joinable = !failed;
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    pthread_attr_destroy(&attributes);
    if (failed) {
        __atomic_store_n(&spawn_state, -failed, __ATOMIC_RELEASE);
        munmap(block, head.size);
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* spawn_started(wait): the watcher's pid once spawn_detached's thread has started it; None while it is
   still under way after waiting up to WAIT seconds (the GIL released); OSError where it failed, or
   where this process began none (a fork child). */
static PyObject *spawn_started(PyObject *module, PyObject *arg) {
    (void)module;
    double wait = PyFloat_AsDouble(arg);
    if (wait == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    int state = spawn_owner == getpid() ? __atomic_load_n(&spawn_state, __ATOMIC_ACQUIRE) : -ECHILD;
    for (int tries = 0; state == 0 && tries < wait * 5000.0; tries++) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec pause = {0, 200000}; /* 0.2 ms */
        nanosleep(&pause, NULL);
        Py_END_ALLOW_THREADS
        state = __atomic_load_n(&spawn_state, __ATOMIC_ACQUIRE);
    }
    if (state == 0) {
        Py_RETURN_NONE;
    }
    spawn_join();
    if (state < 0) {
        errno = -state;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong((long)state);
}

/* lock_if_ours(fd, device, inode): flock(FD, LOCK_EX | LOCK_NB) where FD still refers to that device and
   inode (the watcher's pipe as we made it): True once taken, False while another holds it, None when the
   program has put something else at that number (a lock there would be on its file), OSError else
   (watcher_launch.hush, at the exit: fcntl would be one more module at start-up, 0.15 ms). The look and
   the lock are made without letting go of the GIL: no thread of the program's Python runs between them. */
static PyObject *lock_if_ours(PyObject *module, PyObject *args) {
    (void)module;
    int fd;
    unsigned long long device, inode;
    if (!PyArg_ParseTuple(args, "iKK:lock_if_ours", &fd, &device, &inode)) {
        return NULL;
    }
    struct stat seen;
    if (fd < 0 || fstat(fd, &seen) != 0 || (unsigned long long)seen.st_dev != device ||
        (unsigned long long)seen.st_ino != inode) {
        Py_RETURN_NONE;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        Py_RETURN_TRUE;
    }
    if (errno == EWOULDBLOCK) {
        Py_RETURN_FALSE;
    }
    return PyErr_SetFromErrno(PyExc_OSError);
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
