"""hsk inside other training frameworks: `hf` (the Hugging Face Trainer)."""
