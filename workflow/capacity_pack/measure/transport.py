"""The plain-HTTP transport under the load generator's httpx client.

:class:`PlainHTTPTransport` exists because httpx's own stack costs ~100 us of CPU per SSE chunk
and stamps chunks late (see its docstring); it serves ``http://`` targets, and ``https://`` ones
keep httpx's default transport. Its connections
(:class:`~capacity_pack.measure.connection.Connection`) stamp each read with the kernel's
receive time.

Two request extensions and one response extension connect it with the run
(:mod:`capacity_pack.measure.run`): ``SENT_HOOK`` (the gate called at the write instant, which
stamps the send and applies the in-flight ceiling), ``SEND_AT`` (the instant a timed send is
written by the dispatcher thread) and ``BODY_EXTENSION`` (the body stream, fed to the SSE reader
inside the connection's read callback).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from typing import Any

import httpx

from capacity_pack.measure.connection import Connection, RequestWithdrawn, TimedWrite

# Request extension: ``gate(now_ns) -> bool``, called at the instant the request's bytes are to
# be written (``now_ns`` is that instant); False withdraws the request (``RequestWithdrawn``).
SENT_HOOK = "capacity_pack.on_sent"
# Request extension: the ``perf_counter_ns`` instant to write the request at (the transport
# needs a ``scheduler``); everything else (connection, bytes) is made ready before it.
SEND_AT = "capacity_pack.send_at_ns"
# Response extension: the body stream (``Body``); ``arrival_ns`` is the read time of the bytes
# last yielded.
BODY_EXTENSION = "capacity_pack.body"

# Closer to due than this, the loop waits out the rest itself instead of handing the write over.
_TIMED_WRITE_MIN_NS = 20_000


class PlainHTTPTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` for plain-HTTP/1.1 keep-alive streaming on asyncio.

    Built because httpx's default stack (httpcore, h11, anyio) costs ~100 us of CPU per SSE
    chunk (two reads per event, cancel scopes, context managers) and stamps a chunk only when
    the reading task gets round to it. Here each connection is a non-blocking socket that the
    event loop watches (``add_reader``); a read is one ``recvmsg`` that also returns the
    kernel's receive time (:class:`Connection`), and the response framing (chunked,
    ``Content-Length`` or close-delimited) is decoded right there. The body stream
    (:class:`Body`, ``BODY_EXTENSION``) yields one item per read, or hands each read to a
    callback as it arrives (``Body.feed``), so streaming costs no task switch per chunk.

    Pool: idle keep-alive connections per origin, most recently used first, no cap on their
    number (``limits.keepalive_expiry`` closes those idle longer); a connection goes back only
    after its response ended cleanly and the server allowed reuse. A response abandoned before
    its end closes its connection (the server sees the disconnect), unless the reader marked
    ``reuse_when_complete`` (it has all it wants): then the rest is awaited for up to 1 s.
    Timeouts (``request.extensions["timeout"]``): connect, write (only if the socket's buffer
    is full), read (no byte for that long while a head or body read waits). Errors are the
    exceptions httpx's own transport raises (``ConnectError``, ``ConnectTimeout``,
    ``ReadTimeout``, ``WriteTimeout``, ``WriteError``, ``ReadError``, ``RemoteProtocolError``),
    with h11's wording. No retries. Only ``http://``; TLS targets keep httpx's default one.

    Timed sends (``SEND_AT`` and a ``scheduler``, the run's dispatcher thread): the request is
    prepared early (connection taken or opened, bytes built) and the scheduler's thread writes
    it at the due instant (``socket.send``), calling the ``SENT_HOOK`` gate there, so neither
    the event loop's backlog nor httpx's request handling delays or blurs the send. A lock per
    timed write keeps the socket from being closed between the thread's check and its write.
    """

    def __init__(self, limits: Any = None, *, scheduler: Any = None) -> None:
        self.scheduler = scheduler
        self.keepalive_expiry_s = getattr(limits, "keepalive_expiry", 5.0)
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self._all: set[Connection] = set()

    async def __aenter__(self) -> PlainHTTPTransport:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()

    async def handle_async_request(self, request):
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"PlainHTTPTransport serves http only, not {url}")
        key = (url.host, url.port or 80)
        timeouts = request.extensions.get("timeout") or {}
        conn = self._take_idle(key) or await self._connect(key, timeouts.get("connect"))
        try:
            data = await _serialize(request)
            conn.start(request.method == "HEAD", timeouts.get("read"))
            gate = request.extensions.get(SENT_HOOK)
            send_at = request.extensions.get(SEND_AT)
            if send_at is not None and self.scheduler is not None:
                conn.pending = TimedWrite(conn, data, gate)
                if send_at - time.perf_counter_ns() <= _TIMED_WRITE_MIN_NS:
                    # Too close to hand over: wait out the last microseconds here, since a
                    # send is never written before its due instant.
                    while time.perf_counter_ns() < send_at:
                        pass
                    conn.pending.fire(in_loop=True)
                elif not self.scheduler.write_at(send_at, conn.pending):
                    conn.pending.fire(in_loop=True)  # already due: no hand-over
            else:
                if gate is not None and not gate(time.perf_counter_ns()):
                    raise RequestWithdrawn
                await conn.send_all(data, timeouts.get("write"))
            status, reason, headers = await conn.head()
            conn.cancel_pending()  # fired long since (a server answers only what it read)
        except RequestWithdrawn:
            conn.pending = None
            conn.withdrawn()  # nothing was written: the connection is as good as before
            raise
        except BaseException:
            conn.abort()
            raise
        return httpx.Response(
            status,
            headers=headers,
            stream=conn.body,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": reason,
                BODY_EXTENSION: conn.body,
            },
        )

    def _take_idle(self, key: tuple[str, int]) -> Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.lost or conn.closed:
                continue
            if self.keepalive_expiry_s is not None and now - conn.idle_since > (
                self.keepalive_expiry_s
            ):
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, key: tuple[str, int], timeout_s: float | None) -> Connection:
        loop = asyncio.get_running_loop()
        host, port = key
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    version = ipaddress.ip_address(host).version
                    family = socket.AF_INET6 if version == 6 else socket.AF_INET
                    addresses = [(family, (host, port))]
                except ValueError:  # a name: resolve it (in asyncio's executor)
                    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                    addresses = [(info[0], info[4]) for info in infos]
                error: OSError = OSError(f"no address for {host}")
                for family, address in addresses:
                    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
                    try:
                        sock.setblocking(False)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        await loop.sock_connect(sock, address)
                    except OSError as exc:
                        sock.close()
                        error = exc
                        continue
                    except BaseException:
                        sock.close()
                        raise
                    break
                else:
                    raise error
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection to {host}:{port} within "
                                       f"{timeout_s} s") from exc  # fmt: skip
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        conn = Connection(self, key, sock)
        self._all.add(conn)
        return conn

    def keep_idle(self, conn: Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)

    def forget(self, conn: Connection) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)


async def _serialize(request) -> bytes:
    body = await request.aread()
    head = [f"{request.method} ".encode(), request.url.raw_path, b" HTTP/1.1\r\n"]
    chunked = False
    for name, value in request.headers.raw:
        head += (name, b": ", value, b"\r\n")
        chunked = chunked or (name.lower() == b"transfer-encoding" and b"chunked" in value)
    head.append(b"\r\n")
    if chunked:
        head += (b"%x\r\n" % len(body), body, b"\r\n0\r\n\r\n") if body else (b"0\r\n\r\n",)
    else:
        head.append(body)
    return b"".join(head)
