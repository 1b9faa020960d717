"""Sharded checkpoints to an object store (S3 or a local directory) on torch.distributed.checkpoint.

Layers, bottom up: `store` (the ObjectStore seam; `local.LocalDirStore`, `s3.S3Store`), `digest`
(parts and SHA-256), `manifest` and `policy` (pure: the commit record, retention and resharding
rules), `dcp` (DCP StorageWriter/Reader), `catalog` (commit protocol, list, abort, gc) and `flows`
(save/load for a job). Imports of torch and boto3 stay in the modules that need them.
"""
