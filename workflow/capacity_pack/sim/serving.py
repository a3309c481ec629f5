"""Serving an ASGI app, a simulated replica's or the router's: the listening socket, uvicorn on
the event loop and HTTP/1.1 parser chosen (:func:`serving_stack`: uvloop and httptools unless
``--loop``/``--http`` say otherwise), and the port file written once the server accepts.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capacity_pack.sim.wire import InjectedDisconnect

log = logging.getLogger("capacity_pack.sim")


class _QuietInjected(logging.Filter):
    # uvicorn logs every exception escaping the app; an injected drop is intended behaviour.
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, InjectedDisconnect)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; port 0 picks a free port (read it with ``getsockname``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # An explicit IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says TCP, and without it the first token of a reused keep-alive
    # connection can wait up to 40 ms behind the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def install_log_filter() -> None:
    logging.getLogger("uvicorn.error").addFilter(_QuietInjected())


def _write_port_file(path: str | Path, port: int) -> None:
    """Write the bound port atomically (rename), so a reader never sees a torn file; the
    simulator keeps this small helper rather than import the project's io module."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n", encoding="utf-8")
    os.replace(tmp, target)


LOOPS = ("auto", "uvloop", "asyncio")
HTTP_PARSERS = ("auto", "httptools", "h11")


def _importable(name: str) -> bool:
    import importlib

    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def serving_stack(loop: str = "auto", http: str = "auto") -> tuple[str, str]:
    """The event loop and HTTP/1.1 parser that ``loop`` and ``http`` name: ``auto`` takes uvloop
    and httptools (uvicorn's standard extras, a dependency) when importable, else asyncio and
    h11 (uvicorn's pure-Python defaults). Naming one that is not installed is a ``ValueError``."""
    if loop not in LOOPS:
        raise ValueError(f"--loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if http not in HTTP_PARSERS:
        raise ValueError(f"--http must be one of {', '.join(HTTP_PARSERS)}, got {http!r}")
    has_uvloop = _importable("uvloop")
    has_httptools = _importable("httptools")
    if loop == "auto":
        loop = "uvloop" if has_uvloop else "asyncio"
    elif loop == "uvloop" and not has_uvloop:
        raise ValueError("--loop uvloop: uvloop is not installed (pip install 'uvicorn[standard]')")
    if http == "auto":
        http = "httptools" if has_httptools else "h11"
    elif http == "httptools" and not has_httptools:
        raise ValueError(
            "--http httptools: httptools is not installed (pip install 'uvicorn[standard]')"
        )
    return loop, http


def running_stack(config: Any) -> dict[str, str]:
    """What a started uvicorn server actually runs on, read from the running loop's class and
    the HTTP protocol class uvicorn loaded (``...h11_impl`` / ``...httptools_impl``)."""
    loop_module = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    http_module = config.http_protocol_class.__module__.rpartition(".")[2]
    return {"loop": loop_module, "http": http_module.removesuffix("_impl")}


def run_app(
    app: Any,
    sock: socket.socket,
    *,
    port_file: Path | None = None,
    announce: str | None = None,
    log_level: str = "warning",
    graceful_s: float = 2.0,
    loop: str = "auto",
    http: str = "auto",
    on_start: Callable[[dict[str, str]], None] | None = None,
) -> None:
    """Serve ``app`` on ``sock`` with uvicorn until SIGINT/SIGTERM, on the event loop and HTTP
    parser :func:`serving_stack` resolves ``loop`` and ``http`` to. Once the server accepts
    requests: ``on_start`` receives :func:`running_stack`, ``port_file`` gets the bound port
    (atomically) and ``announce`` is printed, formatted with ``port``, ``loop`` and ``http``."""
    import uvicorn

    loop_name, http_name = serving_stack(loop, http)
    install_log_filter()
    config = uvicorn.Config(
        app,
        loop=loop_name,
        http=http_name,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=graceful_s,
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)
    port = sock.getsockname()[1]

    async def main() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            stack = running_stack(config)
            if on_start is not None:
                on_start(stack)
            log.info("serving on event loop %s, HTTP parser %s", stack["loop"], stack["http"])
            # Start-up objects live as long as the server: keep them out of every GC pass, so
            # collections stay short and do not show up as step lateness.
            gc.freeze()
            if port_file is not None:
                _write_port_file(port_file, port)
            if announce:
                print(announce.format(port=port, **stack), flush=True)
        await task

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(main())
