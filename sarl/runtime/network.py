"""Addresses of this node: which are loopback, and which one the other nodes of a job reach it at."""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK_NAMES = ("localhost", "ip6-localhost")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on now (the system's choice), for a server started next."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) means this machine only: 127.0.0.0/8, ::1, localhost."""
    host = host.strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except OSError:
            return False


def routable_ip(toward: str | None = None, allow_loopback: bool = False) -> str:
    """This node's address on the interface that routes toward `toward` (a host or address; None: the
    default route); OSError if that is a loopback address, unless `allow_loopback`. No packet is sent: a UDP
    socket is connected, which only picks the route."""
    target = toward or "192.0.2.1"  # TEST-NET-1: routed by the default route, never answered
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))
            ip = s.getsockname()[0]
        except OSError as err:
            raise OSError(f"no route from this node toward {target}: {err}") from err
    if not allow_loopback and (is_loopback(ip) or ip == "0.0.0.0"):
        raise OSError(f"this node's route toward {target} is a loopback address ({ip})")
    return ip
