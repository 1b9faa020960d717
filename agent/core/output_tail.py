"""A rank's last lines of output, bounded, for the failure record (TrainerExit, GenerationEnded,
JobFailed): the traceback a person needs, not just an exit code.

Pure. The launcher reads at most `READ_BYTES` from the end of the rank's log file; this module
keeps the last `MAX_LINES` lines within `MAX_BYTES` (the log record and the gRPC message stay
small however chatty the script is), and adds the exception torch's `@record` wrote to
TORCHELASTIC_ERROR_FILE when there is one.
"""

from __future__ import annotations

MAX_LINES = 20
MAX_BYTES = 4096
READ_BYTES = 16 * 1024  # read this much of the log's end: enough for MAX_LINES of usual lines


def bounded_tail(data: bytes, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES) -> str:
    """The last `max_lines` lines of `data`, at most `max_bytes` of UTF-8 (cut at a line start when it can)."""
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines()[-max_lines:]
    tail = "\n".join(lines)
    encoded = tail.encode()
    if len(encoded) <= max_bytes:
        return tail
    cut = encoded[-max_bytes:].decode("utf-8", errors="ignore")
    newline = cut.find("\n")
    return cut[newline + 1:] if 0 <= newline < len(cut) - 1 else cut


def error_file_message(record: object, max_bytes: int = MAX_BYTES) -> str:
    """The exception from torch's error file, parsed (`{"message": {"message": ..., "extraInfo": ...}}`), or ""."""
    try:
        message = record["message"]  # type: ignore[index]
        if isinstance(message, dict):
            summary = str(message.get("message", ""))
            stack = str(message.get("extraInfo", {}).get("py_callstack", ""))
            body = f"{stack}\n{summary}" if stack and summary not in stack else (stack or summary)
        else:
            body = str(message)
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""
    return bounded_tail(body.encode(), max_bytes=max_bytes)


def failure_tail(log_end: bytes, error_record: object = None) -> str:
    """What a failure record carries: torch's recorded exception when there is one, else the log's tail."""
    recorded = error_file_message(error_record) if error_record is not None else ""
    return recorded or bounded_tail(log_end)
