"""Triton's logging extension: the log settings, how a change to them is checked, and Triton's log lines."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TextIO

from .errors import ServerError, Status, unsupported
from .subscribers import Subscribers

FORMATS = ("default", "ISO8601")
# The settings a client may change, with the type each takes and its name in Triton's error message.
_CHANGEABLE: dict[str, tuple[type, str]] = {
    "log_info": (bool, "boolean"), "log_warning": (bool, "boolean"), "log_error": (bool, "boolean"),
    "log_verbose_level": (int, "int32"), "log_format": (str, "string")}
_MAX_VERBOSE_LEVEL = 2**32 - 1  # the gRPC field is a uint32
# Verbose (DEBUG) lines come only from loggers named so: the core's and the bundled plugins'.
OUR_LOGGERS = "triton_serve"
ESCAPE_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"  # "0": messages are written as they are, not JSON-escaped


@dataclasses.dataclass(frozen=True)
class LogSettings:
    """The log settings, as ``GET /v2/logging`` shows them; ``log_file`` "" is standard error."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def updated(self, changes: Mapping[str, Any]) -> LogSettings:
        """These settings with ``changes`` made; raises ServerError naming the first bad setting, in which
        case nothing changes. None is a setting named without a value (gRPC's empty ``SettingValue``)."""
        if "log_file" in changes:
            raise unsupported("log file location can not be updated through network protocol")
        for name in changes:
            if name not in _CHANGEABLE:
                raise ServerError(f"unknown log setting '{name}'; the settings are log_file, "
                                  f"{', '.join(_CHANGEABLE)}")
        for name, (kind, kind_name) in _CHANGEABLE.items():
            if name not in changes:
                continue
            value = changes[name]
            out_of_range = isinstance(value, int) and kind is int and not 0 <= value <= _MAX_VERBOSE_LEVEL
            if type(value) is not kind or out_of_range:
                raise ServerError(f"expect {kind_name} for '{name}'")
            if name == "log_format" and value not in FORMATS:
                raise ServerError(f"invalid argument for log_format, got: {value}")
        return dataclasses.replace(self, **changes)


class TritonLogFormatter(logging.Formatter):
    """Triton's log line, in UTC, with the process id and the source file and line:
    ``I1123 02:30:00.123456 1234 file.py:123] "message"`` (default) or
    ``2026-11-23T02:30:00Z I 1234 file.py:123] "message"`` (ISO8601). The message, with any traceback,
    is JSON-escaped onto one line unless TRITON_SERVER_ESCAPE_LOG_MESSAGES=0."""

    def __init__(self, log_format: str = "default", *, escape: bool = True) -> None:
        super().__init__()
        self.iso8601 = log_format == "ISO8601"
        self.escape = escape

    def format(self, record: logging.LogRecord) -> str:
        level = "E" if record.levelno >= logging.ERROR else "W" if record.levelno >= logging.WARNING else "I"
        seconds, micros = divmod(round(record.created * 1_000_000), 1_000_000)
        t = time.gmtime(seconds)
        if self.iso8601:
            stamp = (f"{t.tm_year}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}Z "
                     f"{level}")
        else:
            stamp = f"{level}{t.tm_mon:02d}{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{micros:06d}"
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            message += "\n" + self.formatStack(record.stack_info)
        if self.escape:
            message = json.dumps(message, ensure_ascii=False)
        return f"{stamp} {record.process} {record.filename}:{record.lineno}] {message}"


class TritonLogHandler(logging.StreamHandler[TextIO]):
    """This process's log output: the records the settings let through, as Triton's lines, to the log file
    (appended to) or standard error.

    Errors, warnings and info lines each have their switch; records below INFO are verbose lines, written
    while ``log_verbose_level`` is above 0 (whatever ``log_info`` says, as in Triton) and only from our loggers.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.settings = LogSettings()
        self.escape = os.environ.get(ESCAPE_VARIABLE) != "0"

    def configure(self, settings: LogSettings) -> None:
        """Take ``settings``; raises ServerError, changing nothing, when the log file cannot be opened."""
        if settings.log_file != self.settings.log_file:
            stream = _open_log_file(settings.log_file) if settings.log_file else sys.stderr
            previous = self.setStream(stream)
            if self.settings.log_file and previous is not None:
                previous.close()
        self.setFormatter(TritonLogFormatter(settings.log_format, escape=self.escape))
        self.settings = settings

    def emit(self, record: logging.LogRecord) -> None:
        if not self.settings.log_file:
            self.stream = sys.stderr  # whatever standard error is now (a test harness may have replaced it)
        super().emit(record)

    def filter(self, record: logging.LogRecord) -> bool:
        settings = self.settings
        if record.levelno >= logging.ERROR:
            return settings.log_error
        if record.levelno >= logging.WARNING:
            return settings.log_warning
        if record.levelno >= logging.INFO:
            return settings.log_info
        return settings.log_verbose_level > 0 and record.name.startswith(OUR_LOGGERS)


def _open_log_file(path: str) -> TextIO:
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as error:
        raise ServerError(f"failed to open log file '{path}': {error.strerror}", Status.INTERNAL) from None


_handler: TritonLogHandler | None = None


def apply_log_settings(settings: LogSettings) -> None:
    """Make this process log as ``settings`` say, through one TritonLogHandler on the root logger (other
    handlers stay). Raises ServerError, changing nothing, when the log file cannot be opened."""
    global _handler
    handler = _handler or TritonLogHandler()
    handler.configure(settings)
    root = logging.getLogger()
    if _handler is None:
        root.addHandler(handler)
        _handler = handler
    root.setLevel(logging.DEBUG if settings.log_verbose_level > 0 else logging.INFO)
    if not sys.stderr.isatty():
        # Libraries' tqdm progress bars (weights loading, engines compiling) would fill a log with one line per
        # redraw: on a terminal they stay, elsewhere tqdm (>= 4.66 reads TQDM_* defaults) draws nothing.
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class LogControl:
    """The model owner's log settings: ``update`` checks a change, applies it to this process and hands the
    new settings to each subscriber (the front-end processes), so that every process logs alike."""

    def __init__(self, settings: LogSettings | None = None) -> None:
        self.settings = settings or LogSettings()
        self._subscribers = Subscribers[LogSettings]()

    def subscribe(self, subscriber: Callable[[LogSettings], Awaitable[None] | None]) -> None:
        """Call ``subscriber(settings)`` after every change; what it returns, if anything, is awaited."""
        self._subscribers.add(subscriber)

    async def update(self, changes: Mapping[str, Any]) -> LogSettings:
        """Make ``changes`` (all or, on a ServerError, none of them) and return the settings now in force, once
        every subscriber says it has them (the front-end processes: see FrontendPool)."""
        settings = self.settings.updated(changes)
        apply_log_settings(settings)
        self.settings = settings
        await self._subscribers.notify(settings)
        return settings
