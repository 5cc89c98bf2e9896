"""The one training loop and what surrounds every run of it: setup (precision, compile, checkpoint identity,
resume), the loss meter, data-parallel ranks, evaluation and the typed run summary."""
