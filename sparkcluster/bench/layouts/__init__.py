"""`bench --layouts`: the layout chosen by measurement. Each layout named (tp, pp, replicas) is sized on the selected
nodes (choice.py), served through serve's own phases and measured by bench's own sweep in turn (run.py), recorded
as it is measured so that a run cut short resumes (state.py), and shown side by side with the best layout per
concurrency marked (report.py); cli.py wires bench's flags to it."""
