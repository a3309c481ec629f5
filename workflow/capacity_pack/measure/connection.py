"""One keep-alive HTTP/1.1 client connection on a non-blocking socket that the event loop reads.

The pieces of :class:`capacity_pack.measure.transport.PlainHTTPTransport` below the pool:

- :class:`Connection`: the socket (``add_reader``; a read is one ``recvmsg``), the response
  head and body framing (chunked, ``Content-Length`` or close-delimited) decoded as bytes
  arrive, the read timeout, and closing or returning to the pool;
- kernel receive stamps: every read carries the kernel's receive time of its last segment
  (``SO_TIMESTAMPNS``, CLOCK_REALTIME), moved onto the monotonic clock with the two clocks'
  offset read at that moment, ``stamp = kernel_realtime - (time_ns() - perf_counter_ns())``,
  kept only when it falls within the second before the read (a clock step between the two
  reads makes it wrong); without kernel stamps (not Linux) the stamp is taken at the read;
- :class:`Body`: the response body stream (``httpx.AsyncByteStream``), one item per read, or
  each read handed to a callback as it arrives (:meth:`Body.feed`), so streaming costs no task
  switch per chunk;
- :class:`TimedWrite`: a prepared request that the dispatcher thread writes at its due
  instant (:mod:`capacity_pack.measure.dispatcher`), behind a lock so the socket cannot be
  closed between the thread's check and its write.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import httpx

from capacity_pack.measure.clock import offset_ns

NS = 1_000_000_000

# Connection states: between requests, reading a response head, then its body framing.
_IDLE, _HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _LENGTH, _UNTIL_EOF, _COMPLETE = (
    range(9)
)
_MAX_HEAD_BYTES = 1 << 16
_PAUSE_READING_BYTES = 1 << 20  # unread body bytes queued before the socket stops being read
DRAIN_GRACE_S = 1.0  # how long a finished-for-us response may take to end before closing
_READ_BYTES = 1 << 16
_ANCILLARY_BYTES = 64
_TIMESPEC = struct.Struct("@qq")  # struct timespec of a 64-bit Linux
_SO_TIMESTAMPNS = 35  # Linux asm-generic (x86-64, arm64); Python's socket module lacks it


def _enable_kernel_stamps(sock: socket.socket) -> bool:
    """Ask for the kernel's receive time with every read (Linux, 64-bit); False if not given."""
    if sys.platform != "linux" or _TIMESPEC.size != 16:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


class RequestWithdrawn(Exception):
    """The request's gate said no at its send time: nothing was written."""


class Pool(Protocol):
    """What a connection needs of its pool (``transport.PlainHTTPTransport``)."""

    def keep_idle(self, conn: Connection) -> None:
        """Take back a connection whose response ended cleanly, for reuse."""

    def forget(self, conn: Connection) -> None:
        """Drop a closed connection."""


class TimedWrite:
    """A prepared request that a thread (or the loop, when it is already due) writes once."""

    __slots__ = ("conn", "data", "gate", "lock", "state")

    def __init__(self, conn: Connection, data: bytes, gate: Callable[[int], bool] | None):
        self.conn = conn
        self.data = data
        self.gate = gate
        self.lock = threading.Lock()
        self.state = 0  # 0 pending, 1 fired, 2 cancelled

    def fire(self, in_loop: bool = False) -> None:
        conn = self.conn
        with self.lock:
            if self.state:
                return
            self.state = 1
            call = conn.loop.call_soon if in_loop else conn.loop.call_soon_threadsafe
            if self.gate is not None and not self.gate(time.perf_counter_ns()):
                call(conn.fail_head, RequestWithdrawn())
                return
            data = self.data
            try:
                n = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                call(conn.fail_head, httpx.WriteError(str(exc)))
                return
            if n < len(data):
                call(conn.write_rest, data[n:])

    def cancel(self) -> None:
        """From the loop: the socket is about to close; a write not yet made never will be."""
        with self.lock:
            if not self.state:
                self.state = 2


class Body(httpx.AsyncByteStream):
    """A response body stream (``httpx.AsyncByteStream``): one item per socket read.

    Besides iteration, :meth:`feed` hands every read, as it arrives, to a callback run inside
    the connection's read callback, so a streamed response costs no task switch per chunk.
    """

    __slots__ = ("conn", "queue", "queued", "done", "exc", "waiter", "arrival_ns",
                 "reuse_when_complete", "sink", "sink_exc")  # fmt: skip

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.queue: deque[tuple[int, bytes]] = deque()
        self.queued = 0
        self.done = False
        self.exc: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.arrival_ns = 0
        self.reuse_when_complete = False
        self.sink: Callable[[int, bytes], bool] | None = None
        self.sink_exc: BaseException | None = None

    def push(self, now_ns: int, data: bytes) -> None:
        sink = self.sink
        if sink is not None:
            try:
                if sink(now_ns, data):
                    self.sink = None
                    self._wake()
            except Exception as exc:  # the reader's failure, reported to its task
                self.sink, self.sink_exc = None, exc
                self._wake()
            return
        self.queue.append((now_ns, data))
        self.queued += len(data)
        if self.queued > _PAUSE_READING_BYTES and not self.conn.read_paused:
            self.conn.pause_reading()
        self._wake()

    def finish(self, exc: BaseException | None = None) -> None:
        self.done = True
        self.sink = None
        if exc is not None and self.exc is None:
            self.exc = exc
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def __aiter__(self):
        queue, conn = self.queue, self.conn
        while True:
            if queue:
                self.arrival_ns, data = queue.popleft()
                self.queued -= len(data)
                if conn.read_paused and self.queued < _PAUSE_READING_BYTES // 4:
                    conn.resume_reading()
                yield data
            elif self.exc is not None:
                raise self.exc
            elif self.done:
                return
            else:
                self.waiter = asyncio.get_running_loop().create_future()
                conn.waiting()
                try:
                    await self.waiter
                finally:
                    self.waiter = None

    async def feed(self, sink: Callable[[int, bytes], bool]) -> None:
        """Call ``sink(arrival_ns, data)`` for each read until it returns True or the body
        ends (its error raised here); reads already queued go first."""
        queue = self.queue
        while queue:
            self.arrival_ns, data = queue.popleft()
            self.queued -= len(data)
            if sink(self.arrival_ns, data):
                return
        self.conn.resume_reading()
        if not self.done:
            self.sink = sink
            self.waiter = asyncio.get_running_loop().create_future()
            self.conn.waiting()
            try:
                await self.waiter
            finally:
                self.waiter = None
                self.sink = None
        if self.sink_exc is not None:
            raise self.sink_exc
        if self.exc is not None:
            raise self.exc

    async def aclose(self) -> None:
        self.conn.release(self)


def receive_stamp(kernel_realtime_ns: int, offset_ns: int, now_ns: int, previous_ns: int) -> int:
    """A read's stamp on perf_counter's clock: the kernel's receive time (CLOCK_REALTIME) less the
    two clocks' offset read now, when it falls within the second before ``now_ns`` (else the
    clocks stepped between the reads: ``now_ns``), and never before the connection's previous
    read (``previous_ns``): the offset is read anew at each read and its two clock calls are not
    simultaneous, so two reads close together could otherwise come out tens of nanoseconds in
    reverse order (measured: a chunk gap of -40 ns on the CI host)."""
    stamp = kernel_realtime_ns - offset_ns
    if not now_ns - NS < stamp <= now_ns:
        stamp = now_ns
    return max(stamp, previous_ns)


class Connection:
    """One keep-alive HTTP/1.1 connection on a non-blocking socket read by the event loop.

    The loop calls :meth:`_readable` when the socket has data; ``recvmsg`` returns it with the
    kernel's receive time of its last segment (``SO_TIMESTAMPNS``, realtime, turned into the
    monotonic clock with the two clocks' offset read at that moment), so a read's stamp is when
    the bytes reached this host, not when a busy loop got round to them. Without kernel stamps
    (not Linux) the stamp is taken at the read.
    """

    def __init__(self, pool: Pool, key: tuple[str, int], sock: socket.socket) -> None:
        self.pool = pool
        self.key = key
        self.sock = sock
        self.fd = sock.fileno()
        self.loop = asyncio.get_running_loop()
        self.kernel_stamps = _enable_kernel_stamps(sock)
        self.closed = False
        self.state = _IDLE
        self.buf = b""
        self.left = 0
        self.no_body = False
        self.reusable = True
        self.lost = False
        self.idle_since = 0.0
        self.head_waiter: asyncio.Future | None = None
        self.body: Body | None = None
        self.read_timeout_s: float | None = None
        self.last_read_ns = 0
        self.wait_ns = 0
        self.timer: asyncio.TimerHandle | None = None
        self.read_paused = False
        self.body_bytes = 0
        self.pending: TimedWrite | None = None
        self.loop.add_reader(self.fd, self._readable)

    # -- the socket ------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(_READ_BYTES, _ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            self.abort()
            return
        if not data:
            self._lost(None)
            self.abort()
            return
        now = time.perf_counter_ns()
        if ancillary and len(ancillary[-1][2]) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(ancillary[-1][2])
            offset = offset_ns()
            now = receive_stamp(sec * NS + nsec, offset, now, self.last_read_ns)
        self.last_read_ns = now
        state = self.state
        if _HEAD < state < _COMPLETE:
            self._body_bytes(data, now)
        elif state == _HEAD:
            self._head_bytes(data, now)
        else:
            self.reusable = False  # bytes nobody asked for: never reuse this connection
            self.abort()

    def pause_reading(self) -> None:
        if not self.read_paused and not self.closed:
            self.read_paused = True
            self.loop.remove_reader(self.fd)

    def resume_reading(self) -> None:
        if self.read_paused and not self.closed:
            self.read_paused = False
            self.loop.add_reader(self.fd, self._readable)

    async def send_all(self, data: bytes, timeout_s: float | None) -> None:
        """Write ``data`` now; only a full socket buffer makes this wait (write timeout)."""
        view = memoryview(data)
        try:
            async with asyncio.timeout(timeout_s):
                while view:
                    try:
                        view = view[self.sock.send(view) :]
                    except (BlockingIOError, InterruptedError):
                        await self._writable()
        except TimeoutError as exc:
            raise httpx.WriteTimeout(f"request not written within {timeout_s} s") from exc
        except OSError as exc:
            raise httpx.WriteError(str(exc)) from exc

    async def _writable(self) -> None:
        waiter = self.loop.create_future()
        self.loop.add_writer(self.fd, lambda: waiter.done() or waiter.set_result(None))
        try:
            await waiter
        finally:
            if not self.closed:
                self.loop.remove_writer(self.fd)

    def write_rest(self, data: bytes) -> None:
        """The part of a timed write the socket did not take at once (loop side)."""
        if not self.closed:
            self.loop.create_task(self._write_rest(data))

    async def _write_rest(self, data: bytes) -> None:
        try:
            await self.send_all(data, None)
        except httpx.HTTPError as exc:
            self._fail(exc)
            self.abort()

    def abort(self) -> None:
        """Close the connection (idempotent); a timed write not yet made never will be."""
        self.cancel_pending()
        self.reusable = False
        self.timer_cancel()
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.fd)
            self.loop.remove_writer(self.fd)
            self.sock.close()
            if not self.lost:
                # Closed from this side: whoever still waits is told so (a cancelled waiter
                # needs nothing).
                self.lost = True
                head = self.head_waiter
                if head is not None and not head.done():
                    head.cancel()
                if self.body is not None and not self.body.done:
                    self.body.finish(httpx.ReadError("connection closed by the client"))
        self.pool.forget(self)

    # -- the request side ------------------------------------------------------------------

    def start(self, head_only: bool, read_timeout_s: float | None) -> None:
        self.state = _HEAD
        self.no_body = head_only
        self.read_timeout_s = read_timeout_s
        self.buf = b""
        self.body = None
        self.head_waiter = self.loop.create_future()

    async def head(self) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        waiter = self.head_waiter
        assert waiter is not None
        if not waiter.done():
            self.waiting()
        return await waiter

    def waiting(self) -> None:
        """A head or body read starts waiting: the read timeout runs from now or the last byte."""
        self.wait_ns = time.perf_counter_ns()
        if self.read_timeout_s is not None and self.timer is None:
            self.timer = self.loop.call_later(self.read_timeout_s, self._check)

    def _check(self) -> None:
        self.timer = None
        head, body = self.head_waiter, self.body
        waiting = (head is not None and not head.done()) or (
            body is not None and body.waiter is not None and not body.waiter.done()
        )
        if not waiting or self.read_timeout_s is None:
            return
        idle_s = (time.perf_counter_ns() - max(self.last_read_ns, self.wait_ns)) / NS
        if idle_s < self.read_timeout_s:
            self.timer = self.loop.call_later(self.read_timeout_s - idle_s, self._check)
            return
        self._fail(httpx.ReadTimeout(f"no data for {self.read_timeout_s} s"))
        self.abort()

    def release(self, body: Body) -> None:
        """The body stream was closed: back to the pool, drain, or close."""
        if body is not self.body:
            return
        if self.state == _COMPLETE and self.reusable and not self.lost:
            self._to_pool()
        elif body.reuse_when_complete and self.reusable and not self.lost and not body.exc:
            self.timer_cancel()
            self.timer = self.loop.call_later(DRAIN_GRACE_S, self.abort)
        else:
            self.abort()

    def cancel_pending(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None

    def fail_head(self, exc: BaseException) -> None:
        head = self.head_waiter
        if head is not None and not head.done():
            head.set_exception(exc)

    def withdrawn(self) -> None:
        if self.reusable and not self.lost and not self.closed:
            self._to_pool()
        else:
            self.abort()

    def timer_cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _to_pool(self) -> None:
        self.timer_cancel()
        self.state = _IDLE
        self.body = None
        self.head_waiter = None
        self.pool.keep_idle(self)

    # -- the response side -----------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        self.reusable = False
        head = self.head_waiter
        if head is not None and not head.done():
            head.set_exception(exc)
        elif self.body is not None and not self.body.done:
            self.body.finish(exc)

    def _lost(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        self.reusable = False
        self.timer_cancel()
        state = self.state
        if state == _UNTIL_EOF:
            self._complete()
        elif state == _HEAD:
            self._fail(
                httpx.ReadError(str(exc))
                if exc is not None
                else httpx.RemoteProtocolError("Server disconnected without sending a response.")
            )
        elif _HEAD < state < _COMPLETE:
            if exc is not None:
                self._fail(httpx.ReadError(str(exc)))
            else:
                what = (
                    f"received {self.body_bytes} bytes, expected {self.body_bytes + self.left}"
                    if state == _LENGTH
                    else "incomplete chunked read"
                )
                self._fail(httpx.RemoteProtocolError(
                    f"peer closed connection without sending complete message body: {what}"
                ))  # fmt: skip

    def _protocol_error(self, message: str) -> None:
        self._fail(httpx.RemoteProtocolError(message))
        self.abort()

    def _head_bytes(self, data: bytes, now_ns: int) -> None:
        buf = self.buf + data if self.buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD_BYTES:
                    self._protocol_error("response head too large")
                else:
                    self.buf = buf
                return
            lines = buf[:end].split(b"\r\n")
            buf = buf[end + 4 :]
            parts = lines[0].split(b" ", 2)
            try:
                status = int(parts[1])
            except (IndexError, ValueError):
                status = 0
            if not parts[0].startswith(b"HTTP/1.") or not 100 <= status <= 999:
                self._protocol_error(f"malformed status line {lines[0][:100]!r}")
                return
            if status < 200 and status != 101:
                continue  # informational (100 Continue, 103 Early Hints): the real head follows
            break
        headers = []
        chunked, length = False, None
        keep_alive = parts[0] != b"HTTP/1.0"
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                self._protocol_error(f"malformed header line {line[:100]!r}")
                return
            name, value = name.strip(), value.strip()
            headers.append((name, value))
            lower = name.lower()
            if lower == b"transfer-encoding":
                chunked = value.lower().rsplit(b",", 1)[-1].strip() == b"chunked"
            elif lower == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    self._protocol_error(f"malformed Content-Length {value[:50]!r}")
                    return
            elif lower == b"connection":
                tokens = value.lower()
                if b"close" in tokens:
                    keep_alive = False
                elif b"keep-alive" in tokens:
                    keep_alive = True
        self.reusable = self.reusable and keep_alive
        self.buf = b""
        self.body = Body(self)
        self.body_bytes = 0
        if status == 101:
            self.state, self.reusable = _COMPLETE, False  # another protocol: not ours to read
        elif self.no_body or status in (204, 304):
            self.state = _COMPLETE
        elif chunked:
            self.state = _CHUNK_SIZE
        elif length is not None:
            self.state, self.left = (_LENGTH, length) if length else (_COMPLETE, 0)
        else:
            self.state = _UNTIL_EOF
            self.reusable = False
        reason = parts[2] if len(parts) > 2 else b""
        head = self.head_waiter
        if head is not None and not head.done():
            head.set_result((status, reason, headers))
        if self.state == _COMPLETE:
            self._complete(buf)
        elif buf:
            self._body_bytes(buf, now_ns)

    def _body_bytes(self, data: bytes, now_ns: int) -> None:
        state = self.state
        if state == _UNTIL_EOF:
            self.body.push(now_ns, data)
            return
        if state == _LENGTH:
            take = min(self.left, len(data))
            self.left -= take
            self.body_bytes += take
            self.body.push(now_ns, data[:take] if take < len(data) else data)
            if not self.left:
                self._complete(data[take:])
            return
        buf = self.buf + data if self.buf else data
        self.buf = b""
        pos, n, out = 0, len(buf), []
        while pos < n:
            if state == _CHUNK_DATA:
                take = min(self.left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self.left -= take
                if not self.left:
                    state = _CHUNK_END
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > _MAX_HEAD_BYTES:
                    self._protocol_error("chunk header or trailer line too long")
                    return
                self.buf = buf[pos:]
                break
            line, pos = buf[pos:eol], eol + 2
            if state == _CHUNK_SIZE:
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    self._protocol_error(f"malformed chunk size line {line[:50]!r}")
                    return
                if size:
                    self.left, state = size, _CHUNK_DATA
                else:
                    state = _TRAILER
            elif state == _CHUNK_END:
                if line:
                    self._protocol_error("chunk data longer than its declared size")
                    return
                state = _CHUNK_SIZE
            elif not line:  # the blank line that ends the trailer ends the message
                self.state = state
                if out:
                    self.body.push(now_ns, b"".join(out))
                self._complete(buf[pos:])
                return
        self.state = state
        if out:
            self.body.push(now_ns, out[0] if len(out) == 1 else b"".join(out))

    def _complete(self, extra: bytes = b"") -> None:
        if extra:
            self.reusable = False  # bytes after the response's end: never reuse this connection
        self.state = _COMPLETE
        self.timer_cancel()
        body = self.body
        if body is not None:
            draining = body.reuse_when_complete
            body.finish()
            if draining and self.reusable and not self.lost:
                self._to_pool()  # the reader let go before the end; it has come now
