"""Re-export: the 3-member loopback etcd cluster lives in harness/etcd_cluster.py, so `ftsup chaos`
(an installed command) can start one without importing the test tree."""

from ftsup.harness.etcd_cluster import HEALTH_DEADLINE_S, EtcdCluster, EtcdClusterError, Member, free_ports, tmpfs_root

__all__ = ["HEALTH_DEADLINE_S", "EtcdCluster", "EtcdClusterError", "Member", "free_ports", "tmpfs_root"]
