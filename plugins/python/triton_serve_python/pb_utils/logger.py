"""pb_utils.Logger: model log lines that end up in the server's log at the level asked."""
from __future__ import annotations

import enum
import os
import sys
from collections.abc import Callable

LogSink = Callable[[str, str], None]  # (level name, "file.py:line] message")


def _stderr_sink(level: str, line: str) -> None:
    print(f"{level[0]} {line}", file=sys.stderr, flush=True)


_sink: LogSink = _stderr_sink


def set_log_sink(sink: LogSink) -> LogSink:
    """Send log lines to ``sink`` (the worker sends them to the server; default: stderr); returns the old one."""
    global _sink
    previous, _sink = _sink, sink
    return previous


class Logger:
    """Static methods that log a message from model code, tagged with the caller's file and line."""

    class LogLevel(enum.Enum):
        INFO = "INFO"
        WARNING = "WARNING"
        ERROR = "ERROR"
        VERBOSE = "VERBOSE"

    @staticmethod
    def log(msg: str, level: Logger.LogLevel = LogLevel.INFO) -> None:
        Logger._emit(str(msg), Logger.LogLevel(level), depth=2)

    @staticmethod
    def log_info(msg: str) -> None:
        Logger._emit(str(msg), Logger.LogLevel.INFO, depth=2)

    @staticmethod
    def log_warn(msg: str) -> None:
        Logger._emit(str(msg), Logger.LogLevel.WARNING, depth=2)

    @staticmethod
    def log_error(msg: str) -> None:
        Logger._emit(str(msg), Logger.LogLevel.ERROR, depth=2)

    @staticmethod
    def log_verbose(msg: str) -> None:
        Logger._emit(str(msg), Logger.LogLevel.VERBOSE, depth=2)

    @staticmethod
    def _emit(msg: str, level: Logger.LogLevel, depth: int) -> None:
        caller = sys._getframe(depth)
        _sink(level.value, f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}] {msg}")
