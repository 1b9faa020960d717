"""Channel and server options shared by every agent endpoint that carries snapshot chunks.

Snapshots travel as chunk streams (common/chunks.py, CHUNK_BYTES = 4 MiB per message), so no
message comes near this limit; it is twice a chunk so a header or a larger chunk fits, and a
sender that puts a whole snapshot in one message is refused (RESOURCE_EXHAUSTED) instead of
being buffered.
"""

from __future__ import annotations

from ftsup.common.chunks import CHUNK_BYTES

MAX_MESSAGE_BYTES = 2 * CHUNK_BYTES


def message_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


MESSAGE_OPTIONS: list[tuple[str, int]] = message_options()
