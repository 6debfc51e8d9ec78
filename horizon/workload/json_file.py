"""A JSON document as a file: plain, gzipped (``.gz``) or xz-compressed (``.xz``), chosen by
the path's suffix when writing and by the content's magic bytes when reading. Compressed
output is byte-identical for the same document (no name, no time stamp). xz's long window
dedupes prompts that share long prefixes far apart in the file (shared system prompts), which
gzip's 32 KB window cannot."""

from __future__ import annotations

import gzip
import json
import lzma
import os

XZ_MAGIC = b"\xfd7zXZ\x00"


def write_json(doc: object, path: str | os.PathLike[str]) -> None:
    data = json.dumps(doc).encode()
    p = str(path)
    if p.endswith(".gz"):
        with open(p, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f:
            f.write(data)
    elif p.endswith(".xz"):
        with open(p, "wb") as f:
            f.write(lzma.compress(data, preset=6))
    else:
        with open(p, "wb") as f:
            f.write(data)


def read_json(path: str | os.PathLike[str]) -> object:
    """The document; ValueError (from json, or a corrupt stream as OSError/EOFError/LZMAError)
    is the caller's to word."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    elif raw[:6] == XZ_MAGIC:
        raw = lzma.decompress(raw)
    return json.loads(raw)
