"""Where a run's batches and targets come from: the store stream and its on-device decoding, the sources
(a store, a live teacher, rows in memory) and the dev data."""
