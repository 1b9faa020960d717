"""The status page the supervisor serves: a live, read-only view of the fleet, the event log and goodput."""
