"""`ftsup chaos`: break a real local cluster in one named way and check that ftsup recovers."""
