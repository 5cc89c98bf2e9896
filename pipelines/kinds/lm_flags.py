"""Flags that the language-model kinds (mlm, clm, seq2seq) declare alike: their `--help` heading and their text."""

from __future__ import annotations

from pipelines.core.flags import flag

HEADING = "Language-model stores (--objective mlm, clm or seq2seq)"


def text_file():
    return flag(None, "--objective mlm/clm: raw text, one example (document) per line.", section=HEADING)


def data_file():
    return flag(None, "Your own csv/tsv/json/parquet file instead of GLUE.", section="")


def text_columns():
    return flag(None, "Text columns of --data-file, e.g. 'question,sentence'.", section="")


def limit():
    return flag(None, "Dump only the first N examples.", section="")


def workers(section: str):
    return flag(None, "Dump on a local dask cluster of N processes, each computing and writing whole shards (one GPU "
                "per worker with --device cuda).", section=section)


def scheduler(section: str):
    return flag(None, "Dump on a running dask cluster (tcp://HOST:PORT); every worker must reach the teacher, the "
                "data it is sent and --out.", section=section)
