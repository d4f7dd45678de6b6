"""The blob store: large values by content hash, zstd-compressed, deduplicated.

Events hold a reference (``blob:sha256:<hex>``) instead of the value. Values
above ``App(blob_limit_bytes=...)`` are refused with ``PayloadError``. The store keys a
blob by the hash's 32 bytes (``rq_blobs.hash``, migration 0026); the storage verbs take
and give the hex, as references name it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import zstandard

from replayq import codec
from replayq.errors import PayloadError, StorageError
from replayq.runtime import INLINE_LIMIT_BYTES
from replayq.storage.protocol import BlobPut, Transaction

REF_PREFIX = "blob:sha256:"

_compressor = zstandard.ZstdCompressor(level=3)
_decompressor = zstandard.ZstdDecompressor()


class Encoded(NamedTuple):
    """A value checked and serialised once: the text is reused for the size check, the row,
    the blob and its hash. ``inline`` is the value when it stays in the row, else ``None``."""

    inline: Any
    ref: str | None
    raw: bytes | None
    text: str


def is_ref(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(REF_PREFIX)


def ref_of(data: bytes) -> str:
    """The content reference of ``data`` (``blob:sha256:<hex>``)."""
    import hashlib  # here: only a value past the blob limit is hashed, and every start paid

    return REF_PREFIX + hashlib.sha256(data).hexdigest()


def put_bytes(
    tx: Transaction, data: bytes, *, now: float, limit: int, what: str, ref: str | None = None
) -> str:
    """Store ``data`` once (by hash) and return its reference.

    ``ref``: the reference the caller already computed with ``ref_of(data)`` (not hashed again).
    """
    if len(data) > limit:
        raise PayloadError(f"{what}: {len(data)} bytes is above the blob limit of {limit} bytes")
    ref = ref or ref_of(data)
    # A ``bytearray``, as a trace pack's bytes (``storage/packs.py``): the ``sqlite3``
    # driver binds it at once, where for ``bytes`` it first looks for an adapter and fails
    # (an ``AttributeError`` raised and cleared, ~4,000 instructions a blob).
    body = bytearray(_compressor.compress(data))
    tx.blob_put(
        BlobPut(
            hash=ref.removeprefix(REF_PREFIX),
            codec="zstd",
            size=len(data),
            stored_size=len(body),
            body=body,
            now=now,
        )
    )
    return ref


def get_bytes(tx: Transaction, ref: str) -> bytes:
    row = tx.blob_get(ref.removeprefix(REF_PREFIX))
    if row is None:
        raise StorageError(f"blob {ref} is referenced but missing")
    return _decompressor.decompress(row.body) if row.codec == "zstd" else row.body


def store_json(
    tx: Transaction, value: Any, *, now: float, limit: int, what: str
) -> tuple[Any, str | None]:
    """Return ``(inline_value, None)`` for small values, ``(None, ref)`` for large ones."""
    text = codec.dumps(value, what=what)
    if len(text) <= INLINE_LIMIT_BYTES:
        return value, None
    return None, put_bytes(tx, text.encode(), now=now, limit=limit, what=what)


def load_json(tx: Transaction, inline: Any, ref: str | None) -> Any:
    if ref is None:
        return inline
    return codec.loads(get_bytes(tx, ref))
