"""systemd's notify protocol (sd_notify(3)), spoken directly: one datagram per state change.

Owns READY=1 / STATUS= / WATCHDOG=1 / STOPPING=1 for both daemons (`Type=notify` units). The
protocol is a newline-separated `KEY=VALUE` datagram to the AF_UNIX socket in $NOTIFY_SOCKET
(a leading '@' means the abstract namespace), so no libsystemd binding is needed. Outside
systemd ($NOTIFY_SOCKET unset) every call is a no-op. The watchdog is petted from the daemon's
own event loop (`pet_watchdog`), so a wedged loop stops petting and systemd restarts the daemon.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping


class Notifier:
    """Sends notify datagrams to systemd; silent when not started by a `Type=notify` unit."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self._address = _socket_address(address) if address else None
        self._watchdog_usec = watchdog_usec
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """Reads $NOTIFY_SOCKET and $WATCHDOG_USEC (honouring $WATCHDOG_PID like sd_watchdog_enabled)."""
        env = os.environ if environ is None else environ
        usec: int | None = None
        raw = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if raw.isdigit() and int(raw) > 0 and (not pid or pid == str(os.getpid())):
            usec = int(raw)
        return cls(env.get("NOTIFY_SOCKET") or None, usec)

    @property
    def is_enabled(self) -> bool:
        return self._address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to pet the watchdog: half its timeout, as sd_watchdog_enabled(3) advises."""
        return self._watchdog_usec / 2_000_000 if self._watchdog_usec else None

    def notify(self, **fields: str | int) -> bool:
        """Sends one datagram (`ready=1` -> `READY=1`); False when disabled or the send failed.

        A failed send is never fatal: losing a notification must not take the daemon down.
        """
        if self._address is None:
            return False
        payload = "\n".join(f"{key.upper()}={value}" for key, value in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify(ready=1, status=status, mainpid=os.getpid())

    def status(self, status: str) -> bool:
        return self.notify(status=status)

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify(stopping=1, status=status)

    def watchdog(self) -> bool:
        return self.notify(watchdog=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _socket_address(address: str) -> str | bytes:
    if address.startswith("@"):
        return b"\0" + address[1:].encode()  # Linux abstract namespace
    if not address.startswith("/"):
        raise ValueError(f"NOTIFY_SOCKET={address!r} is neither an absolute path nor '@abstract'")
    return address


async def pet_watchdog(notifier: Notifier) -> None:
    """Sends WATCHDOG=1 every half watchdog period until cancelled; returns at once without one.

    Runs as a task on the daemon's main loop: if that loop is blocked, no datagram goes out and
    systemd's WatchdogSec= fires (SIGABRT, then Restart=on-failure).
    """
    interval_s = notifier.watchdog_interval_s
    if interval_s is None or not notifier.is_enabled:
        return
    while True:
        notifier.watchdog()
        await asyncio.sleep(interval_s)
