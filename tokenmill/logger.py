"""tokenmill's one log format, as vLLM's: `INFO 11-30 13:04:05 [engine.py:88] message`.

On import of tokenmill, the "tokenmill" logger gets a stderr handler with this format at
TOKENMILL_LOGGING_LEVEL (default INFO), so `LLM(...)` and the command line say what they do
without any setup. TOKENMILL_CONFIGURE_LOGGING=0 leaves logging entirely to the application. The
server gives uvicorn's loggers the same format (`uvicorn_log_config`)."""
from __future__ import annotations

import logging
import os

FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
DATE_FORMAT = "%m-%d %H:%M:%S"


def configure() -> None:
    if os.environ.get("TOKENMILL_CONFIGURE_LOGGING", "1") == "0":
        return
    root = logging.getLogger("tokenmill")
    if any(getattr(h, "_tokenmill", False) for h in root.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    handler._tokenmill = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(os.environ.get("TOKENMILL_LOGGING_LEVEL", "INFO").upper())
    root.propagate = False


def set_level(level: str) -> None:
    logging.getLogger("tokenmill").setLevel(level.upper())


def uvicorn_log_config(level: str) -> dict:
    """uvicorn's loggers (startup, access log) in the same format on stderr."""
    fmt = {"()": "logging.Formatter", "fmt": FORMAT, "datefmt": DATE_FORMAT}
    handler = {"class": "logging.StreamHandler", "formatter": "tokenmill", "stream": "ext://sys.stderr"}
    return {"version": 1, "disable_existing_loggers": False, "formatters": {"tokenmill": fmt},
            "handlers": {"tokenmill": handler},
            "loggers": {name: {"handlers": ["tokenmill"], "level": level.upper(), "propagate": False}
                        for name in ("uvicorn", "uvicorn.error", "uvicorn.access")}}
