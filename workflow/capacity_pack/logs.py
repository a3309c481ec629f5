"""Job logging and the console, with every secret redacted on the way out.

Rule scripts call :func:`job_logging` with their ``log`` path; the ``capacity-pack`` command
calls :func:`redact_console` first. Every sink passes through
:func:`capacity_pack.redact.redact_text`: the root logger's handler (:class:`RedactingFormatter`),
``sys.stderr`` and ``sys.stdout`` (:class:`RedactingWriter`, which passes text on a line at a time
so a secret written in pieces is matched whole: MLflow's logger and prints), and a redacting
``sys.excepthook`` and ``threading.excepthook``. A job's log starts empty at every run (mode
``w``). httpx and httpcore log at WARNING and above only: their one INFO line per request would
repeat the records. What counts as a secret, and every sink: docs/security.md.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from capacity_pack.errors import StatedError
from capacity_pack.redact import redact_text

# A writer that never sends a newline still has its text passed on past this many characters.
MAX_PENDING_CHARS = 65536
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RedactingFormatter(logging.Formatter):
    """A formatter whose whole output (message, exception and stack text) is redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class RedactingWriter:
    """A text stream that passes what it is given on to ``stream``, redacted, a line at a time.

    Bytes are refused (as by any text stream), and there is no ``buffer`` attribute, so nothing
    written through this object reaches ``stream`` unredacted.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._pending = ""
        self._lock = threading.RLock()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._pending += text
            if "\n" in text or len(self._pending) > MAX_PENDING_CHARS:
                whole, newline, rest = self._pending.rpartition("\n")
                if not newline:
                    whole, rest = self._pending, ""
                self._pending = rest
                self.stream.write(redact_text(whole + newline))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._lock:
            if getattr(self.stream, "closed", False):
                return
            if self._pending:
                pending, self._pending = self._pending, ""
                self.stream.write(redact_text(pending))
            self.stream.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:
        return getattr(self.stream, "errors", None)

    @property
    def closed(self) -> bool:
        return bool(getattr(self.stream, "closed", False))


def redacted_exception(exc: BaseException | None = None, *, limit: int | None = None) -> str:
    """The traceback of ``exc`` (default: the one being handled), redacted."""
    if exc is None:
        return redact_text(traceback.format_exc(limit=limit))
    return redact_text("".join(traceback.format_exception(exc, limit=limit)))


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    sys.stderr.write(redact_text(text))
    sys.stderr.flush()


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
    sys.stderr.write(redact_text(f"Exception in thread {name}:\n{text}"))
    sys.stderr.flush()


def install_excepthooks() -> None:
    """Redact the tracebacks Python prints for uncaught exceptions (main and other threads);
    a hook someone else installed is left in place."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook
    if threading.excepthook is threading.__excepthook__:
        threading.excepthook = _thread_excepthook


def redact_console() -> None:
    """Redact everything this process writes to its standard output and error from now on
    (the ``capacity-pack`` command: error messages, warnings, tracebacks, library output)."""
    if not isinstance(sys.stdout, RedactingWriter) and sys.stdout is not None:
        sys.stdout = RedactingWriter(sys.stdout)
    if not isinstance(sys.stderr, RedactingWriter) and sys.stderr is not None:
        sys.stderr = RedactingWriter(sys.stderr)
    install_excepthooks()


QUIET_LIBRARIES = ("httpx", "httpcore")


@contextlib.contextmanager
def job_logging(path: str | Path, name: str = "capacity_pack") -> Iterator[logging.Logger]:
    """Send the job's logging, standard error and failure to ``path`` (emptied first), redacted;
    standard output stays on the console, redacted too."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        handler = logging.StreamHandler(fh)
        handler.setFormatter(RedactingFormatter(LOG_FORMAT))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        for chatty in QUIET_LIBRARIES:
            logging.getLogger(chatty).setLevel(logging.WARNING)
        old_stderr, old_stdout = sys.stderr, sys.stdout
        err, out = RedactingWriter(fh), RedactingWriter(old_stdout)
        sys.stderr, sys.stdout = err, out
        try:
            yield logging.getLogger(name)
        except StatedError as exc:
            # The user's to fix, and the message says how: one line in the log and on the
            # console, no traceback, a non-zero exit.
            err.flush()
            line = redact_text(f"error: {exc}")
            fh.write(line + "\n")
            fh.flush()
            print(line, file=old_stderr)
            raise SystemExit(1) from None
        except (SystemExit, KeyboardInterrupt) as stop:
            # An interrupt or a chosen exit status is no crash: one line, no traceback.
            err.flush()
            reason = redact_text(str(stop) or type(stop).__name__)
            fh.write(f"{type(stop).__name__}: {reason}\n")
            fh.flush()
            if not isinstance(stop, SystemExit) or stop.code not in (0, None):
                print(f"{type(stop).__name__}: {reason}", file=old_stderr)
            raise
        except BaseException:
            err.flush()
            fh.write(redacted_exception())
            fh.flush()
            # Also show the reason on the console, where the person running the pipeline looks.
            print(redacted_exception(limit=0).strip(), file=old_stderr)
            # The exception goes on to the interpreter, which prints it to the console again.
            install_excepthooks()
            raise
        finally:
            for stream in (out, err):
                with contextlib.suppress(Exception):
                    stream.flush()
            sys.stderr, sys.stdout = old_stderr, old_stdout
            root.removeHandler(handler)
