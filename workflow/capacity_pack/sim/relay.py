"""Relaying a replica's response to the client across the replica's emulated link.

The response head and each chunk are released ``latency_ms`` after they reached the router (a
pipeline delay, order kept), and within the link's bandwidth (:meth:`Link.release_at
<capacity_pack.sim.replicas.Link.release_at>`); a replica that fails mid-response takes itself
out of rotation and cuts the client's connection the same way (:class:`InjectedDisconnect
<capacity_pack.sim.wire.InjectedDisconnect>`). The upstream is released however the relay ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from starlette.responses import StreamingResponse

from capacity_pack.sim.replicas import Replica
from capacity_pack.sim.wire import InjectedDisconnect


class Relay(StreamingResponse):
    """A proxied response whose upstream is released however the relay ends: completed, cut
    by the replica, or abandoned by a client that left before the first byte."""

    def __init__(self, content: Any, release: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


class Pipe:
    """Carries one upstream response to the client across the replica's emulated link."""

    def __init__(
        self,
        mark_failed: Callable[[Replica, str], None],
        r: Replica,
        upstream: httpx.Response,
    ) -> None:
        # The router's Cluster.mark_failed: a replica that fails mid-response leaves rotation.
        self.mark_failed = mark_failed
        self.r = r
        self.upstream = upstream
        self._raw = upstream.aiter_raw()
        self._queue: asyncio.Queue[tuple[float, Any]] | None = None
        self._reader: asyncio.Task[None] | None = None

    def pipeline(self) -> None:
        """From now on a reader drains the replica as it sends, so each chunk's delay runs
        from its own arrival, not from the release of the chunk before it."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._reader = asyncio.get_running_loop().create_task(self._read(self._queue))

    async def chunks(self) -> AsyncIterator[bytes]:
        r = self.r
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._queue is None and not r.link.clean:
                    self.pipeline()
                if self._queue is None:
                    try:
                        chunk = await anext(self._raw)
                    except StopAsyncIteration:
                        return
                else:
                    release_at, item = await self._queue.get()
                    wait = release_at - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    chunk = item
                r.relayed_bytes_total += len(chunk)
                yield chunk
        except httpx.TransportError as err:
            r.relay_failures_total += 1
            self.mark_failed(r, f"mid-stream failure ({type(err).__name__})")
            # The replica died mid-response: drop the client's connection the same way.
            raise InjectedDisconnect(f"replica {r.index} failed mid-response") from None

    async def _read(self, queue: asyncio.Queue[tuple[float, Any]]) -> None:
        link = self.r.link
        loop = asyncio.get_running_loop()
        end: Exception | None = None
        try:
            async for chunk in self._raw:
                queue.put_nowait((link.release_at(loop.time(), len(chunk)), chunk))
        except Exception as err:
            end = err
        # The end of the response, or the replica's failure, crosses the link like the data.
        queue.put_nowait((loop.time() + link.latency_s, end))

    async def close(self) -> None:
        self.r.outstanding -= 1
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self.upstream.aclose()
