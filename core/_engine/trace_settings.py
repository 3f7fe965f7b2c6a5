"""Trace settings as Triton 2.51 reads them: ``--trace-config`` and the deprecated ``--trace-*`` flags at
start-up, and the trace extension's setting updates (HTTP JSON, gRPC ``TraceSettingRequest``)."""
from __future__ import annotations

import argparse
import contextlib
import enum
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import request_json
from .errors import ServerError, Status, internal, unsupported

TRITON_MODE = "triton"
OPENTELEMETRY_MODE = "opentelemetry"
MODES = (TRITON_MODE, OPENTELEMETRY_MODE)
# The Batch Span Processor settings of opentelemetry mode, each with its environment variable and default.
BSP_SETTINGS = {"bsp_max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
                "bsp_schedule_delay": ("OTEL_BSP_SCHEDULE_DELAY", "5000"),
                "bsp_max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512")}
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
MIN_TRACE_COUNT = -1
# The fields a client may change: its name in the trace extension -> the field of SettingValues.
PROTOCOL_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count",
                   "log_frequency": "log_frequency"}

# A client's change to a model's or the global setting: field -> new value, or None to clear the field (a
# model's field then mirrors the global one, the global one its start-up value). Plain values: it crosses
# the front-end channel.
SettingUpdate = dict[str, int | None]


class TraceLevel(enum.IntFlag):
    """What a trace collects; OFF disables tracing."""

    OFF = 0
    TIMESTAMPS = 1
    TENSORS = 2


def level_names(level: int) -> list[str]:
    """The level as the trace extension reports it: ["OFF"], or the names of the collected kinds."""
    if not level:
        return ["OFF"]
    return [flag.name for flag in (TraceLevel.TIMESTAMPS, TraceLevel.TENSORS) if level & flag]  # type: ignore[misc]


@dataclass(frozen=True)
class SettingValues:
    """The values of one trace setting (global or a model's)."""

    level: int
    rate: int
    count: int
    log_frequency: int
    file: str


@dataclass(frozen=True)
class TraceConfig:
    """Tracing as the command line sets it up (Triton's defaults: off, every 1000th request, no limit)."""

    level: int = TraceLevel.OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = TRITON_MODE
    # The chosen mode's own settings in the order given (``--trace-config <mode>,<key>=<value>``, then the
    # Batch Span Processor defaults in opentelemetry mode): the settings response lists them.
    options: tuple[tuple[str, str], ...] = ()

    def values(self) -> SettingValues:
        return SettingValues(self.level, self.rate, self.count, self.log_frequency, self.file)

    def option(self, key: str) -> list[str]:
        """Every value given for the mode's setting ``key``, in order."""
        return [value for name, value in self.options if name == key]


# ---- the command line -----------------------------------------------------------------------------

def split_trace_config(text: str) -> tuple[str, str, str]:
    """One ``--trace-config`` value as (mode or "" for a global setting, setting, value); argparse's type."""
    comma = text.find(",")
    mode = ""
    if comma > 0:
        mode = _mode(text[:comma])
    elif comma == 0:
        raise argparse.ArgumentTypeError(
            f"No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> or "
            f"<setting>=<value>. Got {text}")
    equals = text.find("=", comma + 1)
    setting, value = text[comma + 1:equals], text[equals + 1:]
    if equals < 0 or not setting or not value:
        raise argparse.ArgumentTypeError(
            f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {text}")
    return mode, setting, value


def _mode(text: str) -> str:
    mode = text.lower()
    if mode not in MODES:
        raise argparse.ArgumentTypeError(
            f'invalid value for trace mode option: {mode}. Available options are "triton" and "opentelemetry"')
    return mode


def parse_level(text: str) -> TraceLevel:
    """A ``level`` value (any case): off/false, timestamps (or true, on, min, max), tensors."""
    level = text.lower()
    if level in ("false", "off"):
        return TraceLevel.OFF
    if level in ("true", "on", "min", "max", "timestamps"):
        return TraceLevel.TIMESTAMPS
    if level == "tensors":
        return TraceLevel.TENSORS
    raise argparse.ArgumentTypeError(f"invalid value for trace level option: {level}")


def _integer(text: str, low: int = -INT32_MAX - 1, high: int = INT32_MAX) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Invalid option value. Got {text}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"Provided option value is out of bound. Got {text}")
    return value


def _count(text: str) -> int:
    return _integer(text, MIN_TRACE_COUNT)


def _non_negative(text: str) -> int:
    return _integer(text, 0, UINT32_MAX)


def add_trace_flags(tracing: argparse._ArgumentGroup, deprecated: argparse._ArgumentGroup) -> None:
    """``--trace-config`` in the Tracing group and the deprecated ``--trace-*`` flags."""
    tracing.add_argument(
        "--trace-config", action="append", default=[], type=split_trace_config,
        metavar="<string>,<string>=<string>",
        help="<mode>,<setting>=<value> or a global <setting>=<value> (repeatable): level=OFF|TIMESTAMPS|TENSORS, "
             "rate, count, mode=triton|opentelemetry; triton,file=<path>, triton,log-frequency=<n>; "
             "opentelemetry,url=<url>, opentelemetry,resource=<key>=<value>, opentelemetry,bsp_*=<n> "
             "(see docs/tracing.md)")
    flag = deprecated.add_argument
    flag("--trace-file", metavar="<string>", default=None, help="use --trace-config triton,file=<path>")
    flag("--trace-level", metavar="<string>", action="append", default=[], type=parse_level,
         help="use --trace-config level=<OFF|TIMESTAMPS|TENSORS>")
    flag("--trace-rate", metavar="<integer>", type=_non_negative, default=None,
         help="use --trace-config rate=<rate>")
    flag("--trace-count", metavar="<integer>", type=_count, default=None,
         help="use --trace-config count=<count>")
    flag("--trace-log-frequency", metavar="<integer>", type=_non_negative, default=None,
         help="use --trace-config triton,log-frequency=<n>")


_DEPRECATED = {
    "trace_file": ("--trace-file", "--trace-config triton,file=<filepath>"),
    "trace_level": ("--trace-level", "--trace-config level=<OFF|TIMESTAMPS|TENSORS>"),
    "trace_rate": ("--trace-rate", "--trace-config rate=<rate value>"),
    "trace_count": ("--trace-count", "--trace-config count=<count value>"),
    "trace_log_frequency": ("--trace-log-frequency", "--trace-config triton,log-frequency=<log frequency value>"),
}


def warn_deprecated_trace_flags(args: argparse.Namespace) -> None:
    """Triton's warning for each deprecated ``--trace-*`` flag given."""
    log = logging.getLogger("triton_serve")
    for attribute, (flag, replacement) in _DEPRECATED.items():
        if getattr(args, attribute) not in (None, []):
            log.warning("'%s' has been deprecated and will be removed in future releases. Please use '%s' instead.",
                        flag, replacement)


def trace_config_from_args(args: argparse.Namespace) -> TraceConfig:
    """The TraceConfig the trace flags describe, as Triton's parser resolves them (``--trace-config`` wins
    over a deprecated flag; any OFF level turns tracing off). Raises ServerError naming a bad setting."""
    level = TraceLevel.OFF
    disabled = False
    for parsed in args.trace_level:
        disabled |= parsed == TraceLevel.OFF
        level |= parsed
    fields: dict[str, Any] = {
        "rate": args.trace_rate if args.trace_rate is not None else 1000,
        "count": args.trace_count if args.trace_count is not None else -1,
        "log_frequency": args.trace_log_frequency if args.trace_log_frequency is not None else 0,
        "file": args.trace_file or "", "mode": TRITON_MODE}
    by_mode: dict[str, list[tuple[str, str]]] = {}
    for mode, setting, value in args.trace_config:
        by_mode.setdefault(mode, []).append((setting, value))
    for setting, value in by_mode.get("", []):
        with _naming(setting):
            if setting == "rate":
                fields["rate"] = _non_negative(value)
            elif setting == "level":
                parsed = parse_level(value)
                disabled |= parsed == TraceLevel.OFF
                level |= parsed
            elif setting == "mode":
                fields["mode"] = _mode(value)
            elif setting == "count":
                fields["count"] = _count(value)
    options = list(by_mode.get(fields["mode"], []))
    if fields["mode"] == TRITON_MODE:
        for setting, value in options:
            with _naming(f"triton,{setting}"):
                if setting == "file":
                    fields["file"] = value
                elif setting == "log-frequency":
                    fields["log_frequency"] = _non_negative(value)
    else:
        options = _opentelemetry_options(options)
    return TraceConfig(level=TraceLevel.OFF if disabled else level, options=tuple(options), **fields)


def _opentelemetry_options(options: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The opentelemetry settings with the Batch Span Processor's numbers checked, and those not given
    taken from their OTEL_BSP_* variables or defaults."""
    checked = []
    for setting, value in options:
        if setting in BSP_SETTINGS:
            with _naming(f"opentelemetry,{setting}"):
                value = str(_non_negative(value))
        elif setting == "resource" and "=" not in value:
            raise ServerError(f'Bad option: "--trace-config opentelemetry,resource".\n'
                              f"expected <key>=<value>, got {value}")
        checked.append((setting, value))
    given = {setting for setting, _ in checked}
    for setting, (variable, default) in BSP_SETTINGS.items():
        if setting not in given:
            try:
                checked.append((setting, str(_non_negative(os.environ.get(variable, default)))))
            except argparse.ArgumentTypeError as error:
                raise ServerError(f'Bad option: "{variable}".\n{error}') from None
    return checked


@contextlib.contextmanager
def _naming(setting: str) -> Iterator[None]:
    """Turns a bad value's ArgumentTypeError into Triton's start-up error naming the --trace-config setting."""
    try:
        yield
    except argparse.ArgumentTypeError as error:
        raise ServerError(f'Bad option: "--trace-config {setting}".\n{error}') from None


# ---- the trace extension's updates ------------------------------------------------------------------

def update_from_json(body: bytes) -> SettingUpdate:
    """``POST v2[/models/<m>]/trace/setting``: Triton's reading of the JSON body (values are strings,
    ``trace_level`` an array of them, null clears a field)."""
    doc = request_json.parse(body, Status.INTERNAL)
    if not isinstance(doc, dict):
        return {}
    if "trace_file" in doc:
        raise _file_not_updatable()
    update: SettingUpdate = {}
    if "trace_level" in doc:
        levels = doc["trace_level"]
        if levels is None:
            update["level"] = None
        elif not isinstance(levels, list):
            raise internal("attempt to access JSON non-array as array")
        elif levels:
            if not all(isinstance(name, str) for name in levels):
                raise internal("attempt to access JSON non-string as string")
            update["level"] = _level_from_names(levels)
    for name, field in PROTOCOL_FIELDS.items():
        if field == "level" or name not in doc:
            continue
        value = doc[name]
        if value is None:
            update[field] = None
        elif not isinstance(value, str):
            raise internal("attempt to access JSON non-string as string")
        else:
            update[field] = _setting_number(name, value, http=True)
    return update


def update_from_grpc(settings: Mapping[str, Sequence[str]]) -> SettingUpdate | None:
    """A ``TraceSettingRequest``'s settings (an empty value list clears a field); None when it names none."""
    if not settings:
        return None
    if "trace_file" in settings:
        raise _file_not_updatable()
    update: SettingUpdate = {}
    for name, field in PROTOCOL_FIELDS.items():
        if name not in settings:
            continue
        values = list(settings[name])
        if not values:
            update[field] = None
        elif field == "level":
            update[field] = _level_from_names(values)
        elif len(values) > 1:
            raise ServerError(f"expect only 1 value for '{name}'")
        else:
            update[field] = _setting_number(name, values[0], http=False)
    return update


def _file_not_updatable() -> ServerError:
    return unsupported("trace file location can not be updated through network protocol")


def _level_from_names(names: Sequence[str]) -> int:
    level = TraceLevel.OFF
    for name in names:
        if name == "OFF":
            if len(names) != 1:
                raise ServerError("Expect only one trace level 'OFF' is specified")
        elif name in ("TIMESTAMPS", "TENSORS"):
            level |= TraceLevel[name]
        else:
            raise ServerError(f"Unable to parse 'trace_level', expect OFF, TIMESTAMPS or TENSORS, got: {name}")
    return int(level)  # a plain int: an update crosses the front-end channel


def _setting_number(name: str, text: str, *, http: bool) -> int:
    """An integer setting's value with Triton's messages (a count below -1 reads "got:<v>" over HTTP)."""
    low, high = (MIN_TRACE_COUNT, INT32_MAX) if name == "trace_count" else (0, UINT32_MAX)
    try:
        value = int(text)
    except ValueError:
        raise ServerError(f"Unable to parse '{name}', got: {text}") from None
    if name == "trace_count" and value < MIN_TRACE_COUNT and value >= -INT32_MAX - 1:
        separator = "" if http else " "
        raise ServerError(f"Unable to parse '{name}'. Expecting value >= {MIN_TRACE_COUNT}, got:{separator}{text}")
    if not low <= value <= high:
        raise ServerError(f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {text}")
    return value


def merged(fallback: SettingValues, current: SettingValues | None, specified: frozenset[str],
           update: SettingUpdate) -> tuple[SettingValues, frozenset[str]]:
    """Triton's update rule: a field is the setting's own (specified) when the update sets it, or it was
    specified before and the update does not clear it; every other field is the fallback's. The file is
    always the fallback's (no client can set it)."""
    own = {field for field in PROTOCOL_FIELDS.values()
           if (field in update and update[field] is not None) or (field in specified and field not in update)}
    values: dict[str, int] = {field: getattr(current, field) for field in own if field not in update}
    values |= {field: value for field, value in update.items() if field in own and value is not None}
    return SettingValues(
        level=values.get("level", fallback.level), rate=values.get("rate", fallback.rate),
        count=values.get("count", fallback.count), log_frequency=values.get("log_frequency", fallback.log_frequency),
        file=fallback.file), frozenset(own)


def invalid_reason(values: SettingValues, mode: str) -> str:
    """Why a setting cannot sample ("" when it can, as far as the values go)."""
    if not values.level:
        return "tracing is disabled"
    if values.rate == 0:
        return "sample rate must be non-zero"
    if mode == TRITON_MODE and not values.file:
        return "trace file name is not given"
    return ""
