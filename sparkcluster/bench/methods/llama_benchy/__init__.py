"""llama-benchy 0.4.0's method, exact: its chat requests (chat), its session of cells of bursts (schedule, run),
its arithmetic and its JSON, CSV and markdown (formats); `bench --method llama-benchy` and `--profile` (cli)."""
