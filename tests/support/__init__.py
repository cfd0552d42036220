"""What the tests share, in one place: no test module imports another. helpers (the CLI run as a user runs it, ssh
into a simulated host), the stub servers run as processes (`python -m tests.support.openai_stub`, `hostile_server`),
the strict and scripted fake transports, and each wing's data: fabrics, recipes' registries, serving's scripted
nodes, bench's results and layouts, the simulated cluster's serve and rings."""
