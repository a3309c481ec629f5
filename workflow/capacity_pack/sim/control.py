"""Who may steer a simulator: the control-plane token, the ``Host`` check and the bind rule.

The control plane is every route under ``/sim/`` and ``/cluster/``. :class:`ControlGuard`, an
ASGI middleware in front of ``sim serve`` and ``sim cluster``, checks in this order:

1. ``Host`` (every route): the bound address (loopback: ``127.0.0.1:PORT``, ``localhost:PORT``,
   ``[::1]:PORT``, the port optional only for 80; a wildcard ``--allow-remote`` bind: this
   host's names and any IP literal; plus each ``--allowed-host``), else 403: ends DNS rebinding;
2. ``Origin`` (control routes and ``/reset_prefix_cache``): a foreign origin or ``null`` is 403;
3. token (control routes): ``X-Sim-Control-Token``, compared in constant time, else 401; drawn
   per process (``secrets.token_urlsafe(32)``) or taken from ``CAPACITY_PACK_SIM_CONTROL_TOKEN``
   (how the router gives each replica its own), written mode 0600 before the port file;
4. body (control routes and ``/reset_prefix_cache``, not GET/HEAD): JSON only, else 415.

``/reset_prefix_cache`` needs no token (vLLM's needs none, and the pack's reset sends none); the
simulator refuses a reset while blocks are in use. :func:`bind_problem`: why a non-loopback
``--host`` is refused without ``--allow-remote``. Imports nothing outside
:mod:`capacity_pack.sim`. Method: docs/failure-drills.md, 'The simulator's control plane'.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOKEN_HEADER = "X-Sim-Control-Token"
TOKEN_ENV = "CAPACITY_PACK_SIM_CONTROL_TOKEN"
CONTROL_PREFIXES = ("/sim/", "/cluster/")
# Mutating routes that keep vLLM's token-less contract but still refuse browsers.
OPEN_MUTATING = frozenset({"/reset_prefix_cache"})
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})
_BODYLESS = frozenset({"GET", "HEAD"})


def new_token() -> str:
    """This process's control token: the parent's choice (``TOKEN_ENV``) or a random one."""
    return os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)


def control_headers(token: str) -> dict[str, str]:
    return {TOKEN_HEADER: token}


def write_token_file(path: str | Path, token: str) -> Path:
    """Write ``token`` to ``path`` with mode 0600 whatever the umask, atomically (rename)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, f"{token}\n".encode())
    finally:
        os.close(fd)
    os.replace(tmp, target)
    return target


def read_token(path: str | Path) -> str:
    return Path(path).read_text(encoding="utf-8").strip()


@contextlib.contextmanager
def token_file(token: str, token_path: Path | None, port_file: Path | None):
    """Write the token where the flags say (see the module docstring) and yield the path; a
    private temporary folder made here is removed on the way out."""
    made: str | None = None
    if token_path is None and port_file is not None:
        token_path = port_file.with_name(port_file.name + ".token")
    if token_path is None:
        made = tempfile.mkdtemp(prefix="capacity-pack-sim-")
        token_path = Path(made) / "token"
    try:
        yield write_token_file(token_path, token)
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_problem(host: str, allow_remote: bool) -> tuple[str | None, str | None]:
    """(error, warning) for binding ``host``: an error when it is not loopback and
    ``allow_remote`` is off, a warning when it is allowed anyway."""
    if is_loopback(host):
        return None, None
    if not allow_remote:
        return (
            f"--host {host} is not a loopback address: the simulator would be reachable from "
            "other machines; pass --allow-remote to bind it anyway",
            None,
        )
    return None, (
        f"warning: binding {host}: the simulator is reachable from other machines; its data "
        f"plane needs no credential, its control plane the {TOKEN_HEADER} token"
    )


def _host_name(host: str) -> str:
    host = host.lower()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]") if name.startswith("[") else name)
    except ValueError:
        return False
    return True


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` header value as (lower-case name, port or None); None when malformed. An IPv6
    name keeps its brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
    elif value.count(":") == 1:
        name, _, port_text = value.partition(":")
        rest = ":" + port_text
    elif ":" in value:
        return None
    else:
        name, rest = value, ""
    if not rest:
        return name, None
    if not rest.startswith(":") or not rest[1:].isdigit():
        return None
    return name, int(rest[1:])


@dataclass(frozen=True)
class HostPolicy:
    """The ``Host`` values this server answers to (see the module docstring)."""

    port: int
    names: frozenset[str] = field(default=_LOOPBACK_NAMES)
    any_ip: bool = False

    @classmethod
    def for_bind(cls, host: str, port: int, extra: tuple[str, ...] = ()) -> HostPolicy:
        names = set(_LOOPBACK_NAMES) | {_host_name(n) for n in extra}
        any_ip = False
        if host.lower() in _WILDCARDS:
            any_ip = True
            names |= {n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n}
        else:
            names.add(_host_name(host))
        return cls(port, frozenset(names), any_ip)

    def allows(self, value: str | None) -> bool:
        if value is None:
            return False
        parsed = split_host(value)
        if parsed is None:
            return False
        name, port = parsed
        if (port if port is not None else 80) != self.port:
            return False
        return name in self.names or (self.any_ip and _is_ip(name))

    def allows_origin(self, origin: str) -> bool:
        scheme, sep, netloc = origin.partition("://")
        return bool(sep) and scheme.lower() == "http" and self.allows(netloc)


def _error(status: int, err_type: str, message: str) -> tuple[int, bytes]:
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return status, json.dumps(body, separators=(",", ":")).encode()


def _shown(value: str) -> str:
    return repr(value[:100])


class ControlGuard:
    """ASGI middleware: the checks of the module docstring, in front of ``app``."""

    def __init__(self, app: Any, *, token: str, hosts: HostPolicy) -> None:
        self.app = app
        self.token = token.encode()
        self.hosts = hosts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.check(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, body = refusal
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def check(self, scope: Any) -> tuple[int, bytes] | None:
        """None when the request may pass, else (status, JSON error body)."""
        host = None
        # ASGI header names are lower-case; the first Host counts. Only Host is read on the data
        # plane, which stays as cheap as it was.
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
                break
        host_text = host.decode("latin-1") if host is not None else None
        if not self.hosts.allows(host_text):
            return _error(
                403,
                "PermissionDeniedError",
                f"Host {_shown(host_text) if host_text is not None else '(none)'} is not this "
                f"server's address (127.0.0.1:{self.hosts.port}, localhost:{self.hosts.port} or "
                f"[::1]:{self.hosts.port})",
            )
        path = scope["path"]
        control = path.startswith(CONTROL_PREFIXES)
        if not control and path not in OPEN_MUTATING:
            return None
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)
        origin = headers.get(b"origin")
        if origin is not None and not self.hosts.allows_origin(origin.decode("latin-1")):
            return _error(
                403,
                "PermissionDeniedError",
                f"cross-origin request from {_shown(origin.decode('latin-1'))} refused",
            )
        if control and not secrets.compare_digest(
            headers.get(TOKEN_HEADER.lower().encode(), b""), self.token
        ):
            return _error(
                401,
                "AuthenticationError",
                f"the control plane needs the {TOKEN_HEADER} header with this server's token "
                "(the --token-file it wrote at start-up)",
            )
        if scope["method"] not in _BODYLESS and not _json_body(headers):
            kind = headers.get(b"content-type", b"(none)").decode("latin-1")
            return _error(
                415,
                "UnsupportedMediaTypeError",
                f"control requests take a JSON body (Content-Type: application/json), not "
                f"{_shown(kind)}",
            )
        return None


def _json_body(headers: dict[bytes, bytes]) -> bool:
    kind = headers.get(b"content-type")
    if kind is None:
        # No type is fine only with no body: an empty object.
        return headers.get(b"content-length", b"0").strip() == b"0" and (
            b"transfer-encoding" not in headers
        )
    return kind.split(b";", 1)[0].strip().lower() == b"application/json"
