"""Channel and server options shared by every agent endpoint that may carry a snapshot."""

from __future__ import annotations

MAX_MESSAGE_BYTES = 512 * 1024 * 1024

MESSAGE_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
