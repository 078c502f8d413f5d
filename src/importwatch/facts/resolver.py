"""Name resolution: a UDP socket to port 53 is a DNS lookup, and resolv.conf says which nameservers it asks.

glibc's resolver sends its query over a UDP socket connected to the nameserver's port
53 and polls it until an answer or its timeout; a module body that resolves a name
with no nameserver answering sits there. The nameservers are read from the
process's own view of /etc/resolv.conf (/proc/PID/root: its mount namespace, a
container's file). The standard library only: the traced process reads this too.
"""

# Run from memory at a stall (tracing/standby.py), this module may import nothing that start-up holds back
# from the program (tracing/handback.py).
import os

from importwatch.facts import procstat

RESOLV_CONF = "/etc/resolv.conf"
DNS_PORT = 53


def is_dns_peer(peer: str) -> bool:
    """True for a peer address (`127.0.0.2:53`, `[::1]:53`) on the DNS port."""
    return peer.rpartition(":")[2] == str(DNS_PORT)


def nameservers(pid: "int | None" = None) -> "list[str] | None":
    """The nameservers resolv.conf names, as PID sees the file (None: this process); None when unreadable."""
    path = RESOLV_CONF if pid is None else f"/proc/{pid}/root{RESOLV_CONF}"
    try:
        with open(path, "rb") as file:
            text = file.read(1 << 16).decode("ascii", "replace")
    except OSError:
        return None
    found = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            found.append(words[1])
    return found


def lookup(
    host: "str | None", server: "str | None", seconds: "float | None", pid: "int | None" = None
) -> str:
    """`DNS lookup of HOST (nameserver ADDRESS from /etc/resolv.conf, no answer for N s)`, with what is known.

    SERVER is the nameserver's address (no port) when a socket to it was seen; without
    one, the first nameserver resolv.conf names is the one asked first.
    """
    named = nameservers(pid)
    if server is None and named:
        server = named[0]
    if server is None:
        source = "no nameserver in /etc/resolv.conf" if named is not None else f"{RESOLV_CONF} unreadable"
    elif named is not None and server in named:
        source = f"nameserver {server} from {RESOLV_CONF}"
    else:
        source = f"nameserver {server}, not in {RESOLV_CONF}"
    waited = f", no answer for {seconds:.1f} s" if seconds is not None else ", no answer yet"
    what = f"DNS lookup of {host}" if host else "DNS lookup"
    return f"{what} ({source}{waited})"


def server_of(peer: str) -> str:
    """The address of a peer `127.0.0.2:53` or `[::1]:53`, without its port."""
    return peer.rpartition(":")[0].strip("[]")


def queried(pid: "int | None" = None) -> list[str]:
    """The nameservers PID (None: this process) has a UDP socket connected to: its lookups in flight."""
    where = "self" if pid is None else str(pid)
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{where}/fd"):
            try:
                target = os.readlink(f"/proc/{where}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    found = []
    for table in ("udp", "udp6"):
        for fields in procstat.net_rows(where, table) or ():
            if len(fields) > 9 and fields[9] in inodes:
                host, _, port = fields[2].partition(":")
                if port and int(port, 16) == DNS_PORT:
                    found.append(_address(host))
    return found


def _address(hex_host: str) -> str:
    """An address as /proc/net/udp prints it (each 32-bit word in host byte order), in words."""
    raw = bytes.fromhex(hex_host)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ".".join(str(byte) for byte in words)
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(byte) for byte in words[12:])
    groups = [f"{int.from_bytes(words[i : i + 2], 'big'):x}" for i in range(0, 16, 2)]
    return ":".join(groups)
