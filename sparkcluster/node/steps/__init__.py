"""The DGX Spark node's steps, declared by name (`preflight.*`, `fabric.*`, `ssh.mesh`, `comm.env`, `hfcache.dir`,
`gpu.clock_cap`); each module is imported when a playbook names one of its steps (engine.steps.base.StepRegistry)."""

from ...engine.steps.base import declare

declare(f"{__name__}.cabling", "fabric.cabling")
declare(f"{__name__}.addresses", "fabric.addresses")
declare(f"{__name__}.preflight", "preflight.gpu", "preflight.driver", "preflight.qsfp", "preflight.docker",
        "preflight.disk", "preflight.cluster", "preflight.fabric")
declare(f"{__name__}.comm", "comm.env")
declare(f"{__name__}.hfcache", "hfcache.dir")
declare(f"{__name__}.mesh", "ssh.mesh")
declare(f"{__name__}.gpuclock", "gpu.clock_cap")
