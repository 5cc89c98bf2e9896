"""`hsk student lm`: a small random causal LM over a tokenizer of the user's choice, for `hsk train --method uld |
alm` (a student with another tokenizer than the store's teacher).

The tokenizer is an existing one (a folder, a hub id, 'minilm' for MiniLM's WordPiece vocabulary, 'smollm2'),
or a byte-level BPE trained here with the `tokenizers` library on the user's corpus (`train_bpe`). The model is
a Llama-shaped decoder of the given size over that vocabulary; a tokenizer without an EOS gets its SEP as the
EOS (a WordPiece vocabulary), the token that separates documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hskstore.format.config import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

EOS = "<|endoftext|>"


@dataclass(frozen=True)
class CausalShape:
    """The student's size: layers, width, heads (and KV heads), FFN width, longest block."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    ffn: int = 256
    max_positions: int = 1024

    def check(self) -> None:
        for flag, value in (("--layers", self.layers), ("--hidden", self.hidden), ("--heads", self.heads),
                            ("--ffn", self.ffn), ("--max-positions", self.max_positions)):
            if not 1 <= value <= 1 << 16:
                raise ConfigError(f"{flag} {value}: pass a whole number from 1 to {1 << 16}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ConfigError(f"--hidden {self.hidden} / --heads {self.heads}: the head width must be a whole even "
                              "number (rotary positions)")


def train_bpe(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE of `vocab_size` trained on `texts` (GPT-2's pre-tokenizer), EOS `<|endoftext|>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 260:
        raise ConfigError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least 260 (256 bytes and EOS)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


def with_eos(tokenizer: PreTrainedTokenizerBase, name: str) -> Any:
    """The tokenizer with an EOS: its own, else its SEP (WordPiece), else refused in one line."""
    if tokenizer.eos_token_id is None:
        if getattr(tokenizer, "sep_token", None) is None:
            raise ConfigError(f"the tokenizer {name} has no EOS or SEP token to separate documents: pass one that has")
        tokenizer.eos_token = tokenizer.sep_token
    return tokenizer


def causal_student(tokenizer: PreTrainedTokenizerBase, shape: CausalShape, seed: int = 0) -> Any:
    """A random Llama-shaped causal LM over the tokenizer's vocabulary."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    eos = tokenizer.eos_token_id
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.ffn,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.heads, max_position_embeddings=shape.max_positions,
                         eos_token_id=eos, bos_token_id=eos, pad_token_id=eos, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def build_causal_student(out: str, shape: CausalShape, *, tokenizer: str | None = None,
                         corpus: list[str] | None = None, vocab_size: int = 8192, seed: int = 0,
                         overwrite: bool = False) -> dict:
    """Save a student (model and tokenizer) to `out`; returns what was made."""
    from pipelines.core.models import load_tokenizer

    shape.check()
    target = Path(out)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out} exists and is not empty: pass --overwrite or another folder")
    if (tokenizer is None) == (corpus is None):
        raise ConfigError("pass --tokenizer (an existing tokenizer) or --train-tokenizer FILE (a BPE trained on it)")
    tok = train_bpe(corpus, vocab_size) if corpus is not None else with_eos(load_tokenizer(tokenizer), tokenizer)
    model = causal_student(tok, shape, seed)
    model.save_pretrained(target)
    tok.save_pretrained(target)
    return {"out": str(target), "vocab_size": len(tok), "parameters": sum(p.numel() for p in model.parameters()),
            "tokenizer": tokenizer or f"byte-level BPE of {len(tok)} trained on {len(corpus)} documents"}
