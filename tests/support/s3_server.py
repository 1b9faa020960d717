"""Re-export: the SeaweedFS test server lives in harness/s3_server.py, so `ftsup chaos` (an installed
command) can start one without importing the test tree."""

from ftsup.harness.s3_server import (
    ACCESS_KEY,
    READY_DEADLINE_S,
    REGION,
    SECRET_KEY,
    S3Server,
    S3ServerError,
    weed_binary,
)

__all__ = ["ACCESS_KEY", "READY_DEADLINE_S", "REGION", "SECRET_KEY", "S3Server", "S3ServerError", "weed_binary"]
