"""The ftsup node agent: supervisor link, trainer launcher, RAM snapshot store, trainer and peer services."""
