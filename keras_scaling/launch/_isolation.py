"""A private network namespace with only loopback, for the workers of one local job.

TensorFlow's gRPC servers listen on every network interface whatever address
`TF_CONFIG` names, and they authenticate nobody: anyone who reaches a
worker's port can make it run operations, file reads and writes included.
Inside a network namespace of their own, whose only interface is `lo`, the
workers still reach each other on 127.0.0.1 and nothing outside reaches them.

How, and why this way:

- A short-lived *holder* process (this file, run as a script with only the
  standard library) calls `unshare(2)` through ctypes, since `os.unshare`
  exists only from Python 3.12, and brings `lo` up with the `SIOCSIFFLAGS`
  ioctl. No external program (util-linux `unshare`, `ip`) is needed, so it
  works in minimal containers, and each failure comes back as the kernel's
  errno. The holder is a process of its own because `unshare(CLONE_NEWUSER)`
  is refused to a process with several threads, as the launcher has.
- As root, the holder unshares the network namespace alone, so the workers
  keep their user and capabilities. Otherwise (or when that is refused, as
  in a container without `CAP_SYS_ADMIN`), it unshares a user namespace too
  and maps the user's own uid and gid to themselves, as
  `unshare --user --map-current-user --net` does: the workers keep their ids.
- The launcher keeps the namespaces open through file descriptors of
  `/proc/HOLDER/ns/*`, and each worker joins them with `setns(2)` between
  `fork` and `exec` (`subprocess.Popen(preexec_fn=...)`), so all workers of
  one job share one namespace, workers started later included. Only two
  system calls run there; `exec` errors still reach `Popen` as they would.
- Nothing else changes: the file system, devices, process ids, signals.
  The workers lose any network other than loopback, by design.

`KERAS_SCALING_TEST_UNSHARE_ERRNO=EPERM` (any errno name) makes every
`unshare` call of the holder fail with that errno, as a kernel that forbids
it would: tests use it to see what happens on such a system.
"""

import ctypes
import errno
import os
import socket
import struct
import subprocess
import sys
import weakref

MODES = ("auto", "require", "off")

FAKE_ERRNO_ENV = "KERAS_SCALING_TEST_UNSHARE_ERRNO"

# <sched.h> and <linux/sockios.h>, <net/if.h>; the same on every Linux architecture.
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
# struct ifreq: the interface name, then a union whose first member is the flags.
_IFREQ_FLAGS = struct.Struct("16sh22x")

_READY = "ready"


class Unavailable(Exception):
    """The kernel (or the OS) gives this process no private network namespace."""


def check_mode(isolation):
    """Returns `isolation` if it is one of `MODES`; raises ValueError naming it otherwise."""
    if isolation not in MODES:
        raise ValueError(
            f"isolation must be one of {', '.join(repr(mode) for mode in MODES)}, got {isolation!r}"
        )
    return isolation


def _libc():
    # The process's own symbols, libc's included, without searching for a file.
    return ctypes.CDLL(None, use_errno=True)


def _call(function, *args):
    if function(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _flag_names(flags):
    names = [
        name
        for name, value in (("CLONE_NEWUSER", _CLONE_NEWUSER), ("CLONE_NEWNET", _CLONE_NEWNET))
        if flags & value
    ]
    return " | ".join(names)


def _unshare(flags, fake_errno=None):
    if fake_errno is not None:
        raise OSError(fake_errno, os.strerror(fake_errno))
    _call(_libc().unshare, flags)


def _map_own_ids(uid, gid):
    """Maps `uid` and `gid` (this process's, read before `unshare`) to themselves."""
    with open("/proc/self/uid_map", "w") as file:
        file.write(f"{uid} {uid} 1\n")
    # An unprivileged process may write gid_map only after giving up setgroups.
    with open("/proc/self/setgroups", "w") as file:
        file.write("deny\n")
    with open("/proc/self/gid_map", "w") as file:
        file.write(f"{gid} {gid} 1\n")


def _bring_loopback_up():
    import fcntl  # POSIX only: importing this module must work everywhere

    # A new network namespace has `lo` down, so even 127.0.0.1 is unreachable.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = _IFREQ_FLAGS.pack(b"lo", 0)
        flags = _IFREQ_FLAGS.unpack(fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, _IFREQ_FLAGS.pack(b"lo", flags | _IFF_UP))


def _hold(user_namespace):
    """The holder: creates the namespaces, says so, and waits for stdin to close."""
    fake = os.environ.get(FAKE_ERRNO_ENV)
    fake_errno = getattr(errno, fake, errno.EPERM) if fake else None
    flags = _CLONE_NEWNET | (_CLONE_NEWUSER if user_namespace else 0)
    step = f"unshare({_flag_names(flags)})"
    # Inside the new user namespace, unmapped ids read as 65534 (nobody).
    uid, gid = os.geteuid(), os.getegid()
    try:
        _unshare(flags, fake_errno)
        if user_namespace:
            step = "mapping the user's ids into the user namespace"
            _map_own_ids(uid, gid)
        step = "bringing lo up"
        _bring_loopback_up()
    except OSError as error:
        code = errno.errorcode.get(error.errno or 0, f"errno {error.errno}")
        print(f"{step} failed: {code} ({error.strerror})", flush=True)
        return 1
    print(_READY, flush=True)
    sys.stdin.read()
    return 0


def _attempts():
    """Whether to add a user namespace, in the order to try."""
    if os.geteuid() == 0:
        return (False, True)
    return (True,)


class Namespace:
    """The open namespaces of one job; `enter` makes the calling process join them.

    Args:
        fds: list of (file descriptor, CLONE_* type), in the order to join.
    """

    def __init__(self, fds):
        self._fds = list(fds)
        self._setns = _libc().setns
        self._finalizer = weakref.finalize(self, _close_all, list(fds))

    def enter(self):
        """Joins the namespaces: for `Popen(preexec_fn=...)`, between fork and exec."""
        for fd, nstype in self._fds:
            _call(self._setns, fd, nstype)

    def close(self):
        """Closes the descriptors; the namespace lives on while a process is in it."""
        self._finalizer()


def _close_all(fds):
    for fd, _ in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def create(user_namespace=None, env=None):
    """Creates a network namespace with only `lo`, up, and returns it open.

    Args:
        user_namespace: bool or None, whether to create a user namespace too;
            None tries without one as root and with one otherwise.
        env: dict, the environment of the holder process; `os.environ` by default.

    Returns:
        A `Namespace`.

    Raises:
        Unavailable: with the reason, when the OS or kernel refuses.
    """
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"network namespaces exist only on Linux, this is {sys.platform}")
    attempts = _attempts() if user_namespace is None else (user_namespace,)
    failures = []
    for with_user in attempts:
        try:
            return _create_once(with_user, os.environ if env is None else env)
        except Unavailable as failure:
            failures.append(str(failure))
    raise Unavailable("; ".join(failures) + _sysctl_hint(_read_sysctls()))


def _create_once(user_namespace, env):
    command = [sys.executable, "-I", "-S", os.path.abspath(__file__), "hold"]
    if user_namespace:
        command.append("--user-namespace")
    holder = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the terminal's Ctrl-C is for the launcher
    )
    assert holder.stdin and holder.stdout and holder.stderr  # all three are pipes
    try:
        line = holder.stdout.readline().strip()
        if line != _READY:
            holder.stdin.close()
            if not line:
                status = holder.wait()
                last = (holder.stderr.read().strip().splitlines() or [""])[-1]
                line = f"the namespace holder exited with status {status}: {last}"
            raise Unavailable(line)
        types = ([("user", _CLONE_NEWUSER)] if user_namespace else []) + [("net", _CLONE_NEWNET)]
        fds = []
        try:
            for name, nstype in types:
                fds.append((os.open(f"/proc/{holder.pid}/ns/{name}", os.O_RDONLY), nstype))
        except OSError as error:
            _close_all(fds)
            raise Unavailable(f"cannot open the namespace: {error}") from None
        return Namespace(fds)
    finally:
        if holder.poll() is None:
            holder.stdin.close()
        try:
            holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        holder.stderr.close()


_SYSCTLS = {
    "kernel.unprivileged_userns_clone": "/proc/sys/kernel/unprivileged_userns_clone",
    "user.max_user_namespaces": "/proc/sys/user/max_user_namespaces",
    "user.max_net_namespaces": "/proc/sys/user/max_net_namespaces",
    "kernel.apparmor_restrict_unprivileged_userns": (
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
    ),
}


def _read_sysctls():
    values = {}
    for name, path in _SYSCTLS.items():
        try:
            with open(path) as file:
                values[name] = file.read().strip()
        except OSError:
            pass
    return values


def _sysctl_hint(values):
    """The kernel settings in `values` (name to text) that forbid the namespaces.

    For example `{"user.max_user_namespaces": "0"}` gives
    `"; forbidden by user.max_user_namespaces = 0"`; settings that allow them
    give `""`.
    """
    forbidding = {
        "kernel.unprivileged_userns_clone": "0",
        "user.max_user_namespaces": "0",
        "user.max_net_namespaces": "0",
        "kernel.apparmor_restrict_unprivileged_userns": "1",
    }
    found = [
        f"{name} = {values[name]}"
        for name, value in forbidding.items()
        if values.get(name) == value
    ]
    return f"; forbidden by {', '.join(found)}" if found else ""


class Isolation:
    """What `open_for_job` decided: the namespace to join, or why there is none.

    Args:
        namespace: a `Namespace`, or None when the workers run without one.
        warning: str, the one line to show the user, empty with a namespace.
    """

    def __init__(self, namespace, warning=""):
        self.namespace = namespace
        self.warning = warning

    @property
    def preexec_fn(self):
        """`Namespace.enter`, or None: the `preexec_fn` of each worker's `Popen`."""
        return None if self.namespace is None else self.namespace.enter

    def close(self):
        """Closes the namespace, if any, once no more workers will join it."""
        if self.namespace is not None:
            self.namespace.close()


def open_for_job(isolation, ports, env=None):
    """The private network of a job whose workers listen on `ports`, per `isolation`.

    Args:
        isolation: `"auto"` (a namespace when the kernel allows one, else a
            warning), `"require"` (a namespace, else ValueError) or `"off"`
            (no namespace, a warning).
        ports: list of int, the workers' ports, named in the warning.
        env: dict, the environment of the holder process.

    Returns:
        An `Isolation`.

    Raises:
        ValueError: `isolation` is unknown, or `"require"` and no namespace
            can be created.
    """
    check_mode(isolation)
    if isolation == "off":
        return Isolation(None, _open_ports_warning("isolation is off", ports))
    try:
        return Isolation(create(env=env))
    except Unavailable as failure:
        if isolation == "require":
            raise ValueError(
                "isolation is 'require', but the workers cannot get a private "
                f"network namespace: {failure}. Allow unprivileged user "
                "namespaces, run as root, or use isolation 'auto' "
                "(--isolation=auto) to run with the workers' ports open on "
                "every network interface"
            ) from None
        return Isolation(
            None, _open_ports_warning(f"no private network namespace ({failure})", ports)
        )


def _open_ports_warning(reason, ports):
    listed = ", ".join(str(port) for port in ports)
    return (
        f"{reason}: while the job runs, its workers listen on every network "
        f"interface on port{'s' if len(ports) > 1 else ''} {listed}, and "
        "TensorFlow's servers authenticate nobody; anyone who can reach this "
        "machine can run operations in them. See Security in the README."
    )


if __name__ == "__main__":
    if sys.argv[1:2] != ["hold"]:
        sys.exit(f"usage: {sys.argv[0]} hold [--user-namespace]")
    sys.exit(_hold("--user-namespace" in sys.argv[2:]))
