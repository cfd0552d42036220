"""`sparkcluster sim`: a simulated DGX Spark cluster on this machine (root, network namespaces, real sshd)."""

from .cluster import SimCluster
from .options import UpOptions

__all__ = ["SimCluster", "UpOptions"]
