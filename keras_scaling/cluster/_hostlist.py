"""Slurm's compressed host lists (`gpu[01-04,07]`) expanded, checked in Python first: `scontrol` 22.05 turns `node[1` into a wrong host."""

import ipaddress
import itertools
import os
import re
import shutil
import subprocess

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_SCONTROL_TIMEOUT_S = 10


def _split_top_level(text: str, parameter: str) -> list[str]:
    """Splits `text` at commas and white space outside brackets; refuses empty entries."""
    entries: list[str] = []
    current, depth = "", 0
    comma_pending = True  # a comma waits for the entry that must follow it
    for char in text + ",":  # the closing comma ends the last entry, and refuses a trailing comma
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"{parameter}: nested '[' in {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{parameter}: ']' without '[' in {text!r}")
        elif depth == 0 and (char == "," or char.isspace()):
            if current:
                entries.append(current)
                current, comma_pending = "", False
            if char == ",":
                if comma_pending:
                    raise ValueError(f"{parameter}: empty entry between commas in {text!r}")
                comma_pending = True
            continue
        current += char
    if depth:
        raise ValueError(f"{parameter}: '[' without ']' in {text!r}")
    return entries


def _expand_ranges(ranges: str, text: str, parameter: str) -> list[str]:
    """`"01-03,07"` -> `["01", "02", "03", "07"]`, keeping the zero padding of each range."""
    values: list[str] = []
    for part in ranges.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            message = f"{parameter}: {part!r} in {text!r} is not a number or a range such as 01-04"
            raise ValueError(message)
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise ValueError(f"{parameter}: range {part!r} in {text!r} runs backwards")
        width = len(first) if first.startswith("0") else 0
        values.extend(str(number).zfill(width) for number in range(int(first), int(last) + 1))
    return values


def _expand_one(name: str, text: str, parameter: str) -> list[str]:
    """One entry's bracket groups multiplied in `scontrol`'s order: a[1-2]b[1-2]c[1-2] is a1b1c1, a1b1c2, a2b1c1, ..."""
    pieces: list[str | list[str]] = []
    rest = name
    while "[" in rest:
        open_at = rest.index("[")
        close_at = rest.index("]", open_at)
        inside = rest[open_at + 1 : close_at]
        pieces.append(rest[:open_at])
        if ":" not in inside:
            pieces.append(_expand_ranges(inside, text, parameter))
        else:  # a bracketed IPv6 address is a host, not a range
            try:
                ipaddress.IPv6Address(inside)
            except ValueError:
                message = f"{parameter}: [{inside}] in {text!r} is neither numbers such as [01-04] nor an IPv6 address such as [fd00::1]"
                raise ValueError(message) from None
            pieces.append(f"[{inside}]")
        rest = rest[close_at + 1 :]
    pieces.append(rest)
    groups = [index for index, piece in enumerate(pieces) if isinstance(piece, list)]
    order = groups[-2::-1] + groups[-1:]
    hosts = []
    for values in itertools.product(*(pieces[index] for index in order)):
        parts = [piece if isinstance(piece, str) else "" for piece in pieces]
        for index, value in zip(order, values):
            parts[index] = value
        hosts.append("".join(parts))
    return hosts


def expand_hostlist_python(text: str, parameter: str = "host list") -> list[str]:
    """`expand_hostlist` without `scontrol`."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{parameter} is empty: expected host names such as 'gpu[01-04,07]'")
    entries = _split_top_level(text, parameter)
    return [host for entry in entries for host in _expand_one(entry, text, parameter)]


# The default configuration, and slurmd's cache on a configless cluster's nodes.
_SLURM_CONF_PATHS = ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf")


def _scontrol_hostnames(text: str) -> list[str] | None:
    scontrol = shutil.which("scontrol")
    # Without a configuration scontrol looks for a controller in DNS.
    configured = os.environ.get("SLURM_CONF") or any(map(os.path.exists, _SLURM_CONF_PATHS))
    if scontrol is None or not configured:
        return None
    command = [scontrol, "show", "hostnames", text]
    env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=_SCONTROL_TIMEOUT_S, env=env
        )
    except (OSError, subprocess.SubprocessError):
        return None
    hosts = result.stdout.split()
    return hosts if result.returncode == 0 and hosts and not result.stderr.strip() else None


def expand_hostlist(
    text: str, parameter: str = "host list", use_scontrol: bool = True
) -> list[str]:
    """Expands a Slurm compressed host list into host names.

    By `scontrol show hostnames` when it is on the `PATH` with a configuration, else by the
    same rules in Python (`[fd00::1]` is an IPv6 address).

    Args:
        text: str, the host list, such as `SLURM_STEP_NODELIST`.
        parameter: str, its name in error messages.
        use_scontrol: bool, whether to ask `scontrol` when it is there.

    Returns:
        list of str, the host names in order.

    Raises:
        ValueError: the list is empty or malformed.

    Example:

    ```python
    from keras_scaling import cluster
    cluster.expand_hostlist("gpu[01-03,07],login3")
    # ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login3']
    ```
    """
    hosts = expand_hostlist_python(text, parameter)
    from_scontrol = _scontrol_hostnames(text.strip()) if use_scontrol else None
    return hosts if from_scontrol is None else from_scontrol
