"""The record of one candidate: what happened to it and how fast it ran; and how errors are kept."""

from __future__ import annotations

import enum
import re
import traceback
from dataclasses import dataclass
from typing import Any

__all__ = ["STATUSES", "Status", "Trial", "error_headline", "format_error"]


class Status(str, enum.Enum):
    """What happened to a candidate. A ``str`` enum: ``Status.OK == "ok"``, and it is stored as its value."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    RESOURCE_ERROR = "resource_error"
    MISMATCH = "mismatch"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"

    def __str__(self) -> str:
        return self.value


STATUSES = tuple(s.value for s in Status)


@dataclass(frozen=True)
class Trial:
    """What happened to one candidate. Latencies are in milliseconds.

    ``rounds`` and ``spread`` are set for finalists, re-timed in interleaved rounds: ``median_ms`` is
    then the median of the rounds' medians and ``spread`` is ``(slowest - fastest round) / median_ms``.
    ``device`` is where it was measured (``"cuda:1"``; the model too when models were mixed) when
    tuning on several devices (``set_tuning(devices=...)``), else ``None``; a finalist's is the one
    device all finalists were re-timed on.
    """

    config: dict[str, Any]
    status: str  # a Status (a str)
    error: str | None = None
    compile_s: float | None = None
    median_ms: float | None = None
    min_ms: float | None = None
    iqr_ms: float | None = None
    rounds: int | None = None
    spread: float | None = None
    device: str | None = None

    @property
    def latency(self) -> float | None:
        """Median latency in ms (``None`` unless ``status == "ok"``)."""
        return self.median_ms

    @property
    def headline(self) -> str:
        """The one line of ``error`` that says what went wrong (empty when there is none)."""
        return error_headline(self.error)


#: The exception's own text is kept whole up to this many characters (then cut in the middle);
#: the traceback after it is cut to its innermost frames.
MESSAGE_CHARS = 16000
TRACEBACK_CHARS = 3000
_TB_MARK = "\n--- traceback (innermost frames) ---\n"


def _cut_middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def format_error(exc: BaseException, tb: str | None = None) -> str:
    """``"Type: message"`` whole, then the innermost part of the traceback.

    The message is what names the fault (a compiler's diagnostic, a bad value); the traceback only
    says where. So the message is never cut from the front, and the traceback is cut instead.
    """
    head = _cut_middle(f"{type(exc).__name__}: {exc}", MESSAGE_CHARS)
    if tb is None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(tb) > TRACEBACK_CHARS:
        tb = "..." + tb[-TRACEBACK_CHARS:]
    return head + _TB_MARK + tb if tb.strip() else head


# A compiler's own diagnostic: "kernel.cu(12): error: ...", "error: ...", "fatal error: ...".
_DIAG = re.compile(r"\b(fatal )?error\b\s*:", re.IGNORECASE)
# An exception line: "ValueError: ...", "tvm.error.InternalError: ...".
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b\s*:")


def error_headline(error: str | None, width: int = 300) -> str:
    """One line that says what went wrong: the exception line, plus the compiler's own error line.

    TVM puts its C++ traceback into the exception message and the real message last, so when the
    first line only announces a traceback, the last exception line of the message is taken.
    """
    if not error or not error.strip():
        return ""
    message = error.split(_TB_MARK, 1)[0]
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if not lines:
        return ""
    head = lines[0]
    if head.endswith("Traceback (most recent call last):") or head.endswith(":") and len(lines) > 1:
        exc_lines = [ln for ln in lines[1:] if _EXC_LINE.match(ln)]
        if exc_lines:
            head = f"{head.split(':', 1)[0]}: {exc_lines[-1]}"
    diag = next((ln for ln in lines if _DIAG.search(ln) and ln != head and ln not in head), None)
    out = head if diag is None else f"{head} | {diag}"
    return out if len(out) <= width else out[: width - 3] + "..."
