"""What the daemons and the trainer-side library share, importing neither: TLS identities, structured
logs, systemd notification, the metrics listener, layered config files, retry backoff and the
snapshot chunk framing. Dependencies point one way: `ftsup.common` <- `ftsup.checkpoint` <-
`ftsup.trainer`; `ftsup.common` <- `ftsup.supervisor` / `ftsup.agent` (tests/unit/test_layering.py)."""
