"""One handler per pipeline family: `load` and `run(batch)` execute inside the worker process."""
