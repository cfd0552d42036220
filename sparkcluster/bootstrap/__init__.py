"""`sparkcluster facts`, `bootstrap` and `run`: the engine's playbooks over the steps the wings declare. The
step catalog (`stepcatalog`) names every step a playbook may use, the engine's own, node's and staging's
`models.stage`, so the engine stays ignorant of the wings while bootstrap.yml uses theirs; `cli` wires the commands
from parsed flags. It may import serving (where the runtime it is given is recorded), never bench or doctor."""
