"""The DGX Spark node's steps, registered by name (`preflight.*`, `fabric.addresses`, `ssh.mesh`, `comm.env`,
`hfcache.dir`)."""

from . import addresses, cabling, comm, hfcache, mesh, preflight  # noqa: F401 (registers)
