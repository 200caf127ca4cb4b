"""Addresses of this node: which are loopback, which one the other nodes of a job reach it at, and whether a
service on the internet (the Hugging Face Hub, W&B) can be reached from here."""

from __future__ import annotations

import functools
import ipaddress
import socket
import threading
import urllib.request
from urllib.parse import urlsplit

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


def route_address(url: str) -> tuple[str, int]:
    """(host, port) a connection to `url` opens first: the proxy the environment names for its scheme
    (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY; not when NO_PROXY covers the host), else the URL's own host and port."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (80 if parts.scheme == "http" else 443)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass_environment(host):
        if "://" not in proxy:
            proxy = "http://" + proxy
        p = urlsplit(proxy)
        return p.hostname or "", p.port or (443 if p.scheme == "https" else 80)
    return host, port


def reachable(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection toward `url` (`route_address`: through the environment's proxy where one applies)
    opens within `timeout_s`, name lookup included (a resolver that hangs counts as unreachable); asked once per
    process and address."""
    return connects(*route_address(url), timeout_s)


@functools.cache
def connects(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TCP connection to host:port opens within `timeout_s` (cached per process)."""
    opened: list[bool] = []

    def connect() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                opened.append(True)
        except OSError:
            pass

    probe = threading.Thread(target=connect, daemon=True)  # getaddrinfo has no timeout of its own
    probe.start()
    probe.join(timeout_s)
    return bool(opened)
