"""How a server's log lines look: text for people, or one JSON object per line for a log
collector (``aggview --log-format json``), whose fields a query can select without parsing the
message."""

from __future__ import annotations

import json
import logging
import os
import time

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def default_format() -> str:
    """``AGGVIEW_LOG_FORMAT`` when set (a container's environment), else text."""
    return os.environ.get("AGGVIEW_LOG_FORMAT", "text")


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON: time (UTC, ISO 8601 with milliseconds), level, logger,
    process id, message, the timestamp of the transaction it is about (``ts``, where the call
    gives ``extra={"ts": ...}``), and the traceback of an exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        ts = getattr(record, "ts", None)  # the transaction a line is about (extra={"ts": ...})
        if ts is not None:
            line["ts"] = ts
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(verbose: bool, log_format: str) -> None:
    """The root logger of a command: INFO with ``verbose``, else WARNING, in ``log_format``."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}; got {log_format!r}")
    handler = logging.StreamHandler()
    if log_format == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter(TEXT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
