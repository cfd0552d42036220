"""sparkcluster: take DGX Sparks from cabled to serving one model across all of them, over RDMA."""

__version__ = "0.1.0"
