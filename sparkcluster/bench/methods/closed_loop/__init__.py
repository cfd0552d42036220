"""sparkcluster's own method: C streams kept in flight (schedule), figures inside the window all C are busy
(arithmetic)."""
