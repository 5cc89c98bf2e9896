"""Value codecs, registered by name: the registration of every codec hsk knows.

    from hskstore import codecs
    codec = codecs.get(store.selection.value_dtype)
    values, scale = codec.encode(values16)
    decoded = codec.decode(values, scale, n_width)

Each line below is one codec's registration: its name (what `--values` takes and a store records),
its module (imported on first use; its CODEC is the instance) and the CLI's words for it. The order
is the CLI's; the first is the default. Installed packages add theirs through the entry point group
`hsk.codecs` (base.find_plugins). A codec that a `lut.Lut` describes (int4, mxfp4, nf3) needs no
device code. docs/guide/adding-a-codec.md says how to add one.
"""

from .base import (
    FULL,
    Declared,
    UnknownCodecError,
    ValueCodec,
    can_convert,
    chained,
    choices,
    chosen,
    declare,
    declared,
    get,
    names,
    register,
)

declare("float16", "float16")
declare("int8", "int8", "an fp16 scale per vector")
declare("int4", "int4", "4-bit codes, an fp16 scale per group of 32 kept values")
declare("mxfp4", "mxfp4", "OCP MXFP4: e2m1 codes, a power-of-two scale per 32")
declare("nf3", "nf3", "3-bit NormalFloat codes, a one-byte log scale per 32")
declare("nf4", "nf4", "4-bit NormalFloat codes, a one-byte log scale per 64")
declare("int8u", "int8u", "int8 codes, no scale: values already scaled (hidden:fit's indices)", alone=False)

__all__ = ["FULL", "Declared", "UnknownCodecError", "ValueCodec", "can_convert", "chained", "choices", "chosen",
           "declare", "declared", "get", "names", "register"]
