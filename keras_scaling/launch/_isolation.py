"""A private network namespace with only loopback, for the workers of one local job (docs/guides/multi-worker.md).

TensorFlow's gRPC servers listen on every interface and authenticate nobody; inside, the
workers still reach each other on 127.0.0.1 and nothing outside reaches them.
"""

import contextlib
import ctypes
import dataclasses
import errno
import os
import socket
import struct
import subprocess
import sys
import weakref

MODES = ("auto", "require", "off")

# An errno name (EPERM) the holder's `unshare` fails with, as a kernel that forbids it would.
FAKE_ERRNO_ENV = "KERAS_SCALING_TEST_UNSHARE_ERRNO"

# <sched.h>, <linux/sockios.h>, <net/if.h>: the same on every Linux architecture.
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
# struct ifreq: the interface name, then a union whose first member is the flags.
_IFREQ_FLAGS = struct.Struct("16sh22x")

_READY = "ready"


class Unavailable(Exception):
    """The kernel (or the OS) gives this process no private network namespace."""


def _libc():
    # The process's own symbols, libc's included, without searching for a file.
    return ctypes.CDLL(None, use_errno=True)


def _call(function, *args):
    if function(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _map_own_ids(uid, gid):
    # An unprivileged process may write gid_map only after giving up setgroups.
    writes = (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1"))
    for name, text in writes:
        with open(f"/proc/self/{name}", "w") as file:
            file.write(text + "\n")


def _bring_loopback_up():
    import fcntl  # POSIX only: importing this module must work everywhere

    # A new network namespace has `lo` down, so even 127.0.0.1 is unreachable.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = _IFREQ_FLAGS.pack(b"lo", 0)
        flags = _IFREQ_FLAGS.unpack(fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, _IFREQ_FLAGS.pack(b"lo", flags | _IFF_UP))


def _hold(user_namespace):
    """The holder process: creates the namespaces, says so, and waits for stdin to close."""
    fake = os.environ.get(FAKE_ERRNO_ENV)
    fake_errno = getattr(errno, fake, errno.EPERM) if fake else None
    flags = _CLONE_NEWNET | (_CLONE_NEWUSER if user_namespace else 0)
    step = "unshare(CLONE_NEWUSER | CLONE_NEWNET)" if user_namespace else "unshare(CLONE_NEWNET)"
    # Inside the new user namespace, unmapped ids read as 65534 (nobody).
    uid, gid = os.geteuid(), os.getegid()
    try:
        if fake_errno is not None:
            raise OSError(fake_errno, os.strerror(fake_errno))
        _call(_libc().unshare, flags)
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


class Namespace:
    """The open namespaces of one job: `(file descriptor, CLONE_* type)`s in the order to join."""

    def __init__(self, fds):
        self._fds = list(fds)
        self._setns = _libc().setns
        self._finalizer = weakref.finalize(self, _close_all, list(fds))

    def enter(self):  # `Popen`'s `preexec_fn`, between fork and exec
        for fd, nstype in self._fds:
            _call(self._setns, fd, nstype)

    def close(self):  # the namespace lives on while a process is in it
        self._finalizer()


def _close_all(fds):
    for fd, _ in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def create(user_namespace=None, env=None):
    """A `Namespace` with only `lo`, up; `Unavailable` with the reason when refused (`user_namespace` None: either)."""
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"network namespaces exist only on Linux, this is {sys.platform}")
    # As root, the network namespace alone first: the workers keep their capabilities.
    attempts = (False, True) if os.geteuid() == 0 else (True,)
    attempts = attempts if user_namespace is None else (user_namespace,)
    failures = []
    for with_user in attempts:
        try:
            return _create_once(with_user, os.environ if env is None else env)
        except Unavailable as failure:
            failures.append(str(failure))
    raise Unavailable("; ".join(failures) + _sysctl_hint(_read_sysctls()))


def _create_once(user_namespace, env):
    command = [sys.executable, "-I", "-S", os.path.abspath(__file__), "hold"]
    command += ["--user-namespace"] if user_namespace else []
    pipe = subprocess.PIPE
    # A session of its own: the terminal's Ctrl-C is for the launcher.
    holder = subprocess.Popen(
        command, env=env, stdin=pipe, stdout=pipe, stderr=pipe, text=True, start_new_session=True
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


# Each kernel setting, and its value that forbids the namespaces.
_FORBIDDING = {
    "kernel.unprivileged_userns_clone": "0",
    "user.max_user_namespaces": "0",
    "user.max_net_namespaces": "0",
    "kernel.apparmor_restrict_unprivileged_userns": "1",
}


def _read_sysctls():
    values = {}
    for name in _FORBIDDING:
        with contextlib.suppress(OSError), open("/proc/sys/" + name.replace(".", "/")) as file:
            values[name] = file.read().strip()
    return values


def _sysctl_hint(values):
    """`"; forbidden by user.max_user_namespaces = 0"` for settings that forbid them, or `""`."""
    found = [
        f"{name} = {values[name]}" for name, bad in _FORBIDDING.items() if values.get(name) == bad
    ]
    return f"; forbidden by {', '.join(found)}" if found else ""


@dataclasses.dataclass
class Isolation:
    """What `open_for_job` decided: the `namespace` to join, or None and the `warning` to show."""

    namespace: Namespace | None
    warning: str = ""

    @property
    def preexec_fn(self):
        return None if self.namespace is None else self.namespace.enter

    def close(self):
        if self.namespace is not None:
            self.namespace.close()


def open_for_job(isolation, ports, env=None):
    """The `Isolation` of a job whose workers listen on `ports`; ValueError for an unknown or unmet `isolation`."""
    if isolation not in MODES:
        allowed = ", ".join(repr(mode) for mode in MODES)
        raise ValueError(f"isolation must be one of {allowed}, got {isolation!r}")
    if isolation == "off":
        return Isolation(None, _open_ports_warning("isolation is off", ports))
    try:
        return Isolation(create(env=env))
    except Unavailable as failure:
        if isolation == "require":
            raise ValueError(
                f"isolation is 'require', but the workers cannot get a private network namespace: {failure}. Allow unprivileged user namespaces, run as root, or use --isolation=auto to run with the workers' ports open"
            ) from None
        reason = f"no private network namespace ({failure})"
        return Isolation(None, _open_ports_warning(reason, ports))


def _open_ports_warning(reason, ports):
    listed = ", ".join(str(port) for port in ports)
    return f"{reason}: while the job runs, its workers listen on every network interface on port{'s' if len(ports) > 1 else ''} {listed}, and TensorFlow's servers authenticate nobody. See Security in the multi-worker guide."


if __name__ == "__main__":
    if sys.argv[1:2] != ["hold"]:
        sys.exit(f"usage: {sys.argv[0]} hold [--user-namespace]")
    sys.exit(_hold("--user-namespace" in sys.argv[2:]))
