"""Large JSON documents (an item's trace, an item's recorded exchanges) stored compressed, the
large parts they share with other documents stored once.

A document is stored as its JSON text, zstd-compressed. Before that, each large part of the
text that this process has seen in another document already (a system prompt, the tools
array, the same long beginning of every model call's input) is cut out and replaced by a
token, its number between two NUL characters; the row lists the sha256 of each part, in the
tokens' order. A part is a `Blob` row keyed by that hash: the text, zstd-compressed, stored
once however many documents refer to it. JSON text never holds a raw NUL (JSON escapes it),
so no data reads as a token and no part overlaps one; reading pastes the parts back in place
of their tokens: the very text, so the very value, that was written.

The parts looked for: a long string's text (`PIECE_CHARS` characters or more), else as many
of its first `PIECE_CHARS`-character pieces as were seen before (texts that begin alike: a
model call's input is the system prompt, then the item's question); a list or dict of small
parts whose text is `MIN_OBJECT` characters or more (the tools array, not the request around
it). A part becomes a blob the second time the process sees it, in another document: one
seen once (a tool's result, an answer) stays where it is, costs no row, and compresses with
its neighbours. Only beginnings are cut into pieces: a piece that matches by chance further
on (the same usage figures in two responses) stays where it is.

Writers `pack` a batch of documents, then `save_blobs` every blob the batch refers to, new or
not (`ON CONFLICT DO NOTHING`), before the rows, in one transaction: a row never refers to a
blob that `prune_orphans` deleted meanwhile, since on PostgreSQL the prune locks the table
against those inserts while it collects the references (SQLite has one writer at a time).

zstd and hashlib let the GIL go on each call, and taking it back waits up to the switch
interval (5 ms) while another thread is busy (the engine's event loop beside the database
thread): a batch is compressed or decompressed in one call (python-zstandard's
`multi_*_to_buffer`), and hashed in pieces too small for hashlib to let the GIL go.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import zstandard
from django.db import connection, transaction

from cobalt_app.models import Blob, ItemTrace, Recording

LEVEL = 3
PIECE_CHARS = 512
MIN_OBJECT = 1024
TOKEN = "\x00"
ANCHOR = 64  # characters of a part looked for (`_replaced`)
DIGEST = 32  # bytes of a sha256, as listed in a row
HASH_PIECE = 2047  # bytes hashed per call: hashlib keeps the GIL below 2048
SEEN_MAX = 50_000  # parts seen once (Python's hash of their text); forgotten all at once
CACHE_SIZE = 32_000_000  # characters and bytes, per cache
CHUNK = 500  # hashes per query

_lock = threading.Lock()
_seen: set[int] = set()
# zstd contexts are not thread-safe: one compressor and one decompressor per thread.
_local = threading.local()


class MissingBlob(LookupError):
    """A stored document refers to a blob that is not in the database."""


class _Cache:
    """The most recently used entries, up to `CACHE_SIZE` (their sizes as given) in all."""

    def __init__(self) -> None:
        self.entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.size = 0

    def get(self, key: str) -> Any:
        entry = self.entries.get(key)
        if entry is None:
            return None
        self.entries.move_to_end(key)
        return entry[0]

    def put(self, key: str, value: Any, size: int) -> None:
        if key in self.entries:
            return
        self.entries[key] = (value, size)
        self.size += size
        while self.size > CACHE_SIZE and len(self.entries) > 1:
            self.size -= self.entries.popitem(last=False)[1][1]


_written = _Cache()  # a part's text → (its hash, compressed), for the parts stored as blobs
_escapes = _Cache()  # a string stored as a blob → its JSON text
_read = _Cache()  # hash (hex) → text, of the blobs read


def _compressor() -> zstandard.ZstdCompressor:
    if not hasattr(_local, "compressor"):
        _local.compressor = zstandard.ZstdCompressor(level=LEVEL)
    return _local.compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    if not hasattr(_local, "decompressor"):
        _local.decompressor = zstandard.ZstdDecompressor()
    return _local.decompressor


def compress(texts: Sequence[str]) -> list[bytes]:
    """Each text, zstd-compressed (one frame each, its size in its header)."""
    if not texts:
        return []
    encoded = [text.encode("utf-8", "surrogatepass") for text in texts]
    frames = _compressor().multi_compress_to_buffer(encoded, threads=0)
    return [frame.tobytes() for frame in frames]


def decompress(frames: Sequence[bytes | memoryview]) -> list[str]:
    if not frames:
        return []
    texts = _decompressor().multi_decompress_to_buffer([bytes(frame) for frame in frames])
    return [text.tobytes().decode("utf-8", "surrogatepass") for text in texts]


def pack(
    documents: Sequence[tuple[Any, str | None]], blobs: dict[str, bytes]
) -> list[tuple[bytes, bytes]]:
    """Documents as stored: (value, its JSON text or None) each → (its compressed text, the
    hashes of the blobs it refers to); those blobs are added to `blobs` (hex hash →
    compressed), for `save_blobs`. A text given must be `json.dumps`'s with its default
    separators and `ensure_ascii=False`, as the parts' texts are; a part whose text is not
    found there stays in place."""
    fresh: dict[str, str] = {}  # a part's text → its hash, for the blobs new in this batch
    texts, refs = [], []
    for value, text in documents:
        text, used = _cut(value, text, blobs, fresh)
        texts.append(text)
        refs.append(b"".join(bytes.fromhex(digest) for digest in used))
    parts = list(fresh)
    frames = compress([*texts, *parts])
    for part, frame in zip(parts, frames[len(texts) :], strict=True):
        blobs[fresh[part]] = frame
        with _lock:
            _written.put(part, (fresh[part], frame), len(part) + len(frame))
    return list(zip(frames[: len(texts)], refs, strict=True))


def _cut(
    value: Any, text: str | None, blobs: dict[str, bytes], fresh: dict[str, str]
) -> tuple[str, list[str]]:
    """The document's text with the large parts seen before replaced by tokens, and their
    hashes in the tokens' order."""
    if text is None:
        text = json.dumps(value, ensure_ascii=False)
    used: list[str] = []
    if len(text) < PIECE_CHARS or TOKEN in text:
        return text, used
    strings: dict[str, None] = {}  # long strings (a string repeated in the document once)
    objects: dict[str, None] = {}  # texts of lists and dicts of small parts
    if type(value) is dict or type(value) is list:
        _large_parts(value, strings, objects)
    elif type(value) is str and len(value) >= PIECE_CHARS:
        strings[value] = None
    looked: dict[str, str | None] = {}  # a part → its hash if a blob (counted once a document)
    for string in strings:
        whole = _escaped(string)
        digest = _look(whole, looked, blobs, fresh)
        if digest is not None:
            text = _replaced(text, whole, used, digest)
            with _lock:
                _escapes.put(string, whole, 2 * len(whole))
            continue
        shared = True  # else its first pieces, as long as each was seen before
        for start in range(0, len(whole) - PIECE_CHARS + 1, PIECE_CHARS):
            piece = whole[start : start + PIECE_CHARS]
            if not shared:
                _note(piece)
                continue
            digest = _look(piece, looked, blobs, fresh)
            if digest is None:
                shared = False
            else:
                text = _replaced(text, piece, used, digest)
    for piece in objects:
        digest = _look(piece, looked, blobs, fresh)
        if digest is not None:
            text = _replaced(text, piece, used, digest)
    return text, used


def _large_parts(
    value: dict | list, strings: dict[str, None], objects: dict[str, None]
) -> tuple[int, bool]:
    """Add the long strings and the texts of large lists and dicts of small parts inside a
    list or dict; its rough JSON size, and whether it holds one."""
    if type(value) is dict:
        try:
            size = sum(map(len, value)) + 6 * len(value)
        except TypeError:  # keys that are not strings (JSON makes text of them)
            size = 14 * len(value)
        items = value.values()
    else:
        size, items = 2 * len(value), value
    holds = False
    for item in items:
        kind = type(item)
        if kind is str:
            length = len(item)
            size += length
            if length >= PIECE_CHARS:
                strings[item] = None
                holds = True
        elif kind is dict or kind is list:
            item_size, item_holds = _large_parts(item, strings, objects)
            if not item_holds and item_size >= MIN_OBJECT:
                objects[json.dumps(item, ensure_ascii=False)] = None
                item_holds = True
            size += item_size
            holds = holds or item_holds
        else:
            size += 6
    return size, holds


def _escaped(string: str) -> str:
    """A string's JSON text, unquoted (remembered for the strings stored as blobs)."""
    with _lock:
        known = _escapes.get(string)
    return known if known is not None else json.dumps(string, ensure_ascii=False)[1:-1]


def _replaced(text: str, piece: str, used: list[str], digest: str) -> str:
    """`text` with each `piece` replaced by the next token (`digest` appended to `used`);
    as it was if there is none. Looks for the piece's first characters, then compares: as
    fast for long pieces as `str.replace` is for short ones."""
    anchor, out, start = piece[:ANCHOR], [], 0
    at = text.find(anchor)
    while at >= 0:
        if text.startswith(piece, at):
            out += [text[start:at], f"{TOKEN}{len(used)}{TOKEN}"]
            start = at + len(piece)
            at = text.find(anchor, start)
        else:
            at = text.find(anchor, at + 1)
    if not out:
        return text
    used.append(digest)
    return "".join([*out, text[start:]])


def _look(
    part: str, looked: dict[str, str | None], blobs: dict[str, bytes], fresh: dict[str, str]
) -> str | None:
    if part not in looked:
        looked[part] = _digest_if_seen(part, blobs, fresh)
    return looked[part]


def _note(part: str) -> None:
    """Remember a part as seen once, without making a blob of it."""
    with _lock:
        if len(_seen) >= SEEN_MAX:
            _seen.clear()
        _seen.add(hash(part))


def _digest_if_seen(part: str, blobs: dict[str, bytes], fresh: dict[str, str]) -> str | None:
    """The hash of a part seen in another document before, its blob added to `blobs` (or to
    `fresh`, to compress); None, noting it, the first time."""
    digest = fresh.get(part)
    if digest is not None:
        return digest
    with _lock:
        known = _written.get(part)
        if known is None:
            key = hash(part)
            if key not in _seen:
                if len(_seen) >= SEEN_MAX:
                    _seen.clear()
                _seen.add(key)
                return None
            _seen.discard(key)
    if known is not None:
        blobs[known[0]] = known[1]
        return known[0]
    fresh[part] = digest = _sha256(part)
    return digest


def _sha256(text: str) -> str:
    data = memoryview(text.encode("utf-8", "surrogatepass"))
    digest = hashlib.sha256()
    for start in range(0, len(data), HASH_PIECE):
        digest.update(data[start : start + HASH_PIECE])
    return digest.hexdigest()


def save_blobs(blobs: Mapping[str, bytes]) -> None:
    """Store the blobs of rows about to be written (those stored already stay as they are),
    in the rows' transaction, before them."""
    if blobs:
        Blob.objects.bulk_create(  # in hash order: two writers never wait for each other
            [Blob(sha256=digest, data=blobs[digest]) for digest in sorted(blobs)],
            ignore_conflicts=True,
        )


def digests(refs: bytes | memoryview) -> list[str]:
    """The hashes (hex) a row's blob list holds, in order."""
    refs = bytes(refs)
    return [refs[i : i + DIGEST].hex() for i in range(0, len(refs), DIGEST)]


def unpack(text: str, refs: bytes | memoryview, texts: Mapping[str, str]) -> Any:
    """A stored document's value from its decompressed text and blob list: each token
    replaced by the text of its blob."""
    return json.loads(pasted(text, refs, texts))


def pasted(text: str, refs: bytes | memoryview, texts: Mapping[str, str]) -> str:
    """A stored document's JSON text, as written, from its decompressed text and blob list."""
    if refs:
        listed = digests(refs)
        parts = text.split(TOKEN)
        parts[1::2] = [texts[listed[int(number)]] for number in parts[1::2]]
        text = "".join(parts)
    return text


def read(rows: Iterable[tuple[bytes | memoryview, bytes | memoryview]]) -> list[Any]:
    """The values of stored documents, (data, blob list) each, in order: one query for the
    blobs they refer to, none for those read before."""
    return [json.loads(text) for text in read_texts(rows)]


def read_texts(rows: Iterable[tuple[bytes | memoryview, bytes | memoryview]]) -> list[str]:
    """`read`, the documents left as their JSON text."""
    rows = list(rows)
    texts = blob_texts({digest for _, refs in rows for digest in digests(refs)})
    plain = decompress([data for data, _ in rows])
    return [pasted(text, refs, texts) for text, (_, refs) in zip(plain, rows, strict=True)]


def blob_texts(hashes: Iterable[str]) -> dict[str, str]:
    """The texts of these blobs (hex hashes); `MissingBlob` if one is not stored."""
    texts, missing = {}, []
    with _lock:
        for digest in hashes:
            text = _read.get(digest)
            if text is None:
                missing.append(digest)
            else:
                texts[digest] = text
    for start in range(0, len(missing), CHUNK):
        rows = Blob.objects.filter(sha256__in=missing[start : start + CHUNK])
        found = list(rows.values_list("sha256", "data"))
        for (digest, _), text in zip(found, decompress([data for _, data in found]), strict=True):
            texts[digest] = text
            with _lock:
                _read.put(digest, text, len(text))
    absent = set(missing) - texts.keys()
    if absent:
        raise MissingBlob(f"stored data refers to missing blob(s) {', '.join(sorted(absent))}")
    return texts


def prune_orphans() -> int:
    """Delete the blobs that no trace and no recording refers to any more; how many."""
    with transaction.atomic():
        if connection.vendor == "postgresql":  # writers wait (see the module docstring)
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {Blob._meta.db_table} IN SHARE ROW EXCLUSIVE MODE")
        used: set[str] = set()
        for model in (ItemTrace, Recording):
            # Most rows refer to the same few blobs: the database keeps one of each list.
            lists = model.objects.exclude(blobs=b"").values_list("blobs", flat=True).distinct()
            for refs in lists.iterator():
                used.update(digests(refs))
        stored = Blob.objects.values_list("sha256", flat=True)
        orphans = [digest for digest in stored.iterator() if digest not in used]
        for start in range(0, len(orphans), CHUNK):
            Blob.objects.filter(sha256__in=orphans[start : start + CHUNK]).delete()
    return len(orphans)
