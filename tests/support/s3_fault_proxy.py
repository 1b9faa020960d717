"""Re-export: the S3 fault-injecting proxy lives in harness/chaos/s3_proxy.py, shared by the
integration tests and the `s3_errors` chaos scenario (one implementation)."""

from ftsup.harness.chaos.s3_proxy import Fault, FaultProxy, FaultRule

__all__ = ["Fault", "FaultProxy", "FaultRule"]
