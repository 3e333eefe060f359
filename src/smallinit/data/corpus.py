"""Corpora: the builtin ones shipped with the package, and the user's own files.

A corpus spec is one of

* ``"shakespeare"`` — 42 works of Shakespeare (Project Gutenberg editions), one document per work;
* ``"zh-poems"`` — 409 classical Chinese poems (Tang 300 and Song 100), one document per poem;
* ``"default"`` — both of the above (Shakespeare first, then the poems): a small bilingual corpus;
* ``"wiki-leads"`` — the lead paragraphs of 26,227 Wikipedia articles (English, Spanish, French: each
  language's "vital articles"), one document per article;
* ``"python-stdlib"`` — the 538 source files of the Python 3.11 standard library (a pinned Debian build),
  one document per file;
* ``"large"`` — all four (26.7 MB of UTF-8 text), for runs that would see ``"default"`` more than once;
* a ``.txt`` file (the whole file is one document), a ``.jsonl`` file (one document per line, from the
  ``text_field`` field), a ``.parquet`` file (the ``text_field`` column, read in record batches), a folder
  (every .txt/.jsonl/.parquet below it, sorted by path), or a glob pattern (``data/*.jsonl``, ``**``
  allowed).

``"builtin:<name>"`` is accepted for every builtin name. ``"builtin:anchor"`` is the synthetic
anchor-function task, served by ``smallinit.data.anchor`` (``iter_documents(params)`` and
``fingerprint(params)``), ``params`` being the spec's query string (``builtin:anchor?anchors=4&seed=1``).

Documents that are empty or only whitespace are skipped; a corpus without any other document is an error.
"""

from __future__ import annotations

import glob
import hashlib
import json
import lzma
import os
from collections.abc import Iterator
from pathlib import Path

from smallinit import io
from smallinit.data import anchor
from smallinit.errors import DataError

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
BUILTIN_FILES = {
    "shakespeare": "shakespeare.jsonl.xz",
    "zh-poems": "zh-poems.jsonl.xz",
    "wiki-leads": "wiki-leads.jsonl.xz",
    "python-stdlib": "python-stdlib.jsonl.xz",
}
BUILTIN_MIXES = {
    "default": ("shakespeare", "zh-poems"),
    "large": ("shakespeare", "zh-poems", "wiki-leads", "python-stdlib"),
}
BUILTIN_CORPORA = tuple(BUILTIN_FILES) + tuple(BUILTIN_MIXES)
SYNTHETIC_CORPORA = {"anchor": anchor}  # name → module with iter_documents(params) and fingerprint(params)
SUFFIXES = (".txt", ".jsonl", ".parquet")
_GLOB_CHARS = set("*?[")
_PARQUET_BATCH_ROWS = 1024
_FINGERPRINT_VERSION = 1


def _builtin_name(spec: str) -> str | None:
    name = spec[len("builtin:") :] if spec.startswith("builtin:") else spec
    if (
        name in BUILTIN_FILES
        or name in BUILTIN_MIXES
        or (spec.startswith("builtin:") and name.partition("?")[0] in SYNTHETIC_CORPORA)
    ):
        return name
    if spec.startswith("builtin:") and name.partition("?")[0] == "sink":
        raise DataError(
            "builtin:sink is generated batch by batch (smallinit.data.sink), not a corpus of documents; "
            "train on it, or pass a document corpus here"
        )
    if spec.startswith("builtin:"):
        names = ", ".join(BUILTIN_CORPORA + tuple(SYNTHETIC_CORPORA))
        raise DataError(f"unknown builtin corpus '{spec}'; use one of: {names}")
    return None


def _builtin_file(name: str) -> Path:
    path = BUILTIN_DIR / BUILTIN_FILES[name]
    if not path.is_file():
        raise DataError(
            f"builtin corpus file {path} is missing; reinstall smallinit or run scripts/build_builtin_data.py"
        )
    return path


def _iter_builtin(name: str) -> Iterator[str]:
    if name in BUILTIN_MIXES:
        for part in BUILTIN_MIXES[name]:
            yield from _iter_builtin(part)
        return
    base, _, params = name.partition("?")  # synthetic corpora take parameters after '?'
    if base in SYNTHETIC_CORPORA:
        yield from SYNTHETIC_CORPORA[base].iter_documents(params)
        return
    path = _builtin_file(name)
    try:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)["text"]
    except (lzma.LZMAError, EOFError, UnicodeDecodeError, json.JSONDecodeError, KeyError) as e:
        raise DataError(
            f"builtin corpus file {path} is damaged ({type(e).__name__}); reinstall smallinit"
        ) from None


def resolve_files(spec: str | os.PathLike) -> list[Path]:
    """The files a path/folder/glob spec stands for, sorted; DataError if there are none."""
    s = os.fspath(spec)
    path = Path(s).expanduser()
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise DataError(
                f"corpus file {s} has an unsupported type '{path.suffix}'; use .txt, .jsonl or .parquet"
            )
        return [path]
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and p.suffix.lower() in SUFFIXES and not _hidden(p.relative_to(path))
        )
        if not files:
            raise DataError(
                f"corpus folder {s} has no .txt, .jsonl or .parquet files; add some or pass a file"
            )
        return files
    if _GLOB_CHARS & set(s):
        matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(s), recursive=True))
        files = [p for p in matches if p.is_file() and p.suffix.lower() in SUFFIXES]
        if not files:
            what = "no files" if not matches else "no .txt, .jsonl or .parquet files"
            raise DataError(f"corpus pattern '{s}' matches {what}; check the pattern")
        return files
    names = ", ".join(BUILTIN_CORPORA)
    raise DataError(
        f"corpus '{s}' not found: not a builtin ({names}) and no such file or folder; check the path"
    )


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def _check_text(data: bytes, path: Path, where: str = "") -> str:
    loc = f"{path}{where}"
    if b"\x00" in data:
        raise DataError(f"corpus file {loc} contains NUL bytes (binary?); pass UTF-8 text files only")
    try:
        return data.decode("utf-8-sig" if not where or where == ":1" else "utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"corpus file {loc} is not valid UTF-8 (byte {e.start}); re-encode it as UTF-8, "
            f"e.g. iconv -f <encoding> -t UTF-8"
        ) from None


def _read_txt(path: Path) -> Iterator[str]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read corpus file {path} ({e.strerror}); check its permissions") from None
    yield _check_text(data, path)


def _read_jsonl(path: Path, field: str) -> Iterator[str]:
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, the generator may be abandoned
    except OSError as e:
        raise DataError(f"cannot read corpus file {path} ({e.strerror}); check its permissions") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            line = _check_text(raw, path, f":{lineno}")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{path}:{lineno} is not valid JSON ({e.msg}); write one JSON object per line"
                ) from None
            except RecursionError:
                raise DataError(
                    f"{path}:{lineno} nests JSON too deeply; write one flat JSON object per line"
                ) from None
            if not isinstance(obj, dict) or field not in obj:
                raise DataError(
                    f"{path}:{lineno} has no '{field}' field; add it or choose the field with data.text_field"
                )
            text = obj[field]
            if text is None:
                continue
            if not isinstance(text, str):
                raise DataError(
                    f"{path}:{lineno} field '{field}' is {type(text).__name__}, not a string; store text in it"
                )
            yield text


def _read_parquet(path: Path, field: str) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(
            f"cannot read parquet file {path} ({msg}); check that it is a valid parquet file"
        ) from None
    names = pf.schema_arrow.names
    if field not in names:
        raise DataError(
            f"parquet file {path} has no column '{field}' (columns: {', '.join(names)}); "
            "choose one with data.text_field"
        )
    ftype = pf.schema_arrow.field(field).type
    is_view = getattr(pa.types, "is_string_view", lambda t: False)
    if not (pa.types.is_string(ftype) or pa.types.is_large_string(ftype) or is_view(ftype)):
        raise DataError(
            f"parquet file {path} column '{field}' has type {ftype}, not string; choose a text column"
        )
    try:
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=[field]):
            for text in batch.column(0).to_pylist():
                if text is not None:
                    yield text
    except (pa.ArrowException, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(
            f"cannot read parquet file {path} ({msg}); check that it is a valid parquet file"
        ) from None


def _iter_file(path: Path, field: str) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix == ".txt":
        yield from _read_txt(path)
    elif suffix == ".jsonl":
        yield from _read_jsonl(path, field)
    else:
        yield from _read_parquet(path, field)


def iter_documents(spec: str | os.PathLike, text_field: str = "text") -> Iterator[str]:
    """Yield the non-empty documents of a corpus, in a fixed order.

    Raises DataError (possibly only once iteration reaches the problem) for a missing path, an empty
    corpus, a binary or non-UTF-8 file, a bad JSONL line or a missing parquet column.
    """
    s = os.fspath(spec)
    name = _builtin_name(s) if isinstance(spec, str) else None
    if name is not None:
        source: Iterator[str] = _iter_builtin(name)
    else:
        files = resolve_files(s)
        source = (doc for path in files for doc in _iter_file(path, text_field))
    return _non_empty(source, s)


def _non_empty(source: Iterator[str], spec: str) -> Iterator[str]:
    n = 0
    for doc in source:
        if doc and not doc.isspace():
            n += 1
            yield doc
    if n == 0:
        raise DataError(
            f"corpus '{spec}' is empty (no non-empty documents); add text or check data.text_field"
        )


def corpus_fingerprint(spec: str | os.PathLike, text_field: str = "text") -> str:
    """A stable hash of a corpus's inputs, for cache keys.

    Builtins: the name and the shipped file's content hash. Files: their resolved paths, sizes and
    modification times (so an edited file gives a new fingerprint) and the text field.
    """
    s = os.fspath(spec)
    name = _builtin_name(s) if isinstance(spec, str) else None
    if name is not None:
        parts = BUILTIN_MIXES.get(name, (name,))
        items: list = []
        for part in parts:
            base, _, params = part.partition("?")
            if base in SYNTHETIC_CORPORA:
                items.append([part, str(SYNTHETIC_CORPORA[base].fingerprint(params))])
            else:
                items.append([part, io.sha256_file(_builtin_file(part))])
        payload = {"v": _FINGERPRINT_VERSION, "builtin": name, "parts": items}
    else:
        files = []
        for p in resolve_files(s):
            st = p.stat()
            files.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
        payload = {"v": _FINGERPRINT_VERSION, "files": files, "text_field": text_field}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()
