"""Data layer: corpora, tokenizers, token cache, batching. Fast, offline, deterministic."""

from __future__ import annotations

import json
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from smallinit.data import (
    EOS_TOKEN,
    batch_starts,
    corpus_fingerprint,
    epochs,
    get_batch,
    iter_documents,
    iter_eval_batches,
    load_token_data,
    load_tokenizer,
    repeat_message,
    train_tokenizer,
)
from smallinit.data import cache as cache_mod
from smallinit.data.anchor import AnchorTask
from smallinit.errors import DataError

TEXTS = [
    "To be, or not to be: that is the question.\n",
    "床前明月光，疑是地上霜。举头望明月，低头思故乡。",
    "emoji 🙂👍🏽🇨🇭 and combining e\u0301, tabs\tand\r\nCRLF",
    "mixed 中文 and English <|endoftext|> literal, \x00 NUL and \x7f DEL",
    "",
    " leading and trailing spaces  ",
]


@pytest.fixture(scope="module")
def bytes_tok():
    return load_tokenizer("bytes")


@pytest.fixture(scope="module")
def default_tok():
    return load_tokenizer("default")


def one_line_error(excinfo) -> str:
    msg = str(excinfo.value)
    assert msg and "\n" not in msg, repr(msg)
    return msg


def write_jsonl(path, texts, field="text"):
    path.write_text(
        "".join(json.dumps({field: t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8"
    )
    return path


def docs_of(data, tok, split):
    """Decode a split back into documents (EOS-separated)."""
    arr = np.asarray(getattr(data, split)).tolist()
    docs, cur = [], []
    for t in arr:
        if t == tok.eos_id:
            docs.append(tok.decode(cur))
            cur = []
        else:
            cur.append(t)
    assert not cur, "every document ends with EOS"
    return docs


# --------------------------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("name", ["default", "bytes"])
@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(name, text, request):
    tok = request.getfixturevalue(f"{name}_tok")
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.eos_id not in ids  # a literal "<|endoftext|>" is not the EOS token
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_bytes_tokenizer(bytes_tok):
    assert bytes_tok.vocab_size == 257 and bytes_tok.eos_id == 256
    text = "héllo 世界"
    assert bytes_tok.encode(text) == list(text.encode("utf-8"))
    assert bytes_tok.decode([104, 105, 256]) == "hi" + EOS_TOKEN
    assert load_tokenizer("bytes").fingerprint == bytes_tok.fingerprint


def test_default_tokenizer(default_tok):
    assert default_tok.vocab_size == 8192 and default_tok.eos_id == 0
    assert default_tok.encode_batch(TEXTS) == [default_tok.encode(t) for t in TEXTS]
    assert default_tok.encode_batch([]) == []
    # BPE compresses: far fewer tokens than bytes on both languages
    for text in ("And I am sick at heart, and the king is dead.", "白日依山尽，黄河入海流。"):
        assert len(default_tok.encode(text)) < 0.6 * len(text.encode("utf-8"))
    assert load_tokenizer("default").fingerprint == default_tok.fingerprint


def test_tokenizer_save_load(tmp_path, default_tok):
    path = default_tok.save(tmp_path / "sub" / "tok.json")
    again = load_tokenizer(str(path))
    assert again.fingerprint == default_tok.fingerprint
    assert again.encode(TEXTS[1]) == default_tok.encode(TEXTS[1])
    default_tok.save(tmp_path / "sub" / "tokenizer.json")
    assert load_tokenizer(str(tmp_path / "sub")).fingerprint == default_tok.fingerprint  # a folder works


def test_tokenizer_errors(tmp_path):
    with pytest.raises(DataError) as e:
        load_tokenizer(str(tmp_path / "missing.json"))
    assert "not found" in one_line_error(e)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError) as e:
        load_tokenizer(str(bad))
    assert "bad.json" in one_line_error(e)
    # a valid tokenizer without the end-of-text token
    noeos = tmp_path / "noeos.json"
    hf = load_tokenizer("bytes").hf
    raw = json.loads(hf.to_str())
    raw["added_tokens"] = []
    noeos.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(DataError) as e:
        load_tokenizer(str(noeos))
    assert EOS_TOKEN in one_line_error(e)
    with pytest.raises(DataError) as e:
        train_tokenizer(["abc"], 100)
    one_line_error(e)


def test_train_tokenizer_deterministic(tmp_path):
    docs = [t for t in TEXTS if t] * 20 + ["the quick brown fox jumps over the lazy dog"] * 30
    a = train_tokenizer(docs, 320, tmp_path / "a.json")
    b = train_tokenizer(iter(docs), 320, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert a.fingerprint == b.fingerprint and a.eos_id == 0
    assert a.vocab_size <= 320
    for text in TEXTS:
        assert a.decode(a.encode(text)) == text
    assert len(a.encode("the quick brown fox")) < len(b"the quick brown fox")
    with pytest.raises(DataError) as e:
        train_tokenizer(["", ""], 300)
    assert "empty" in one_line_error(e)


# ----------------------------------------------------------------------------------------------- corpora


@pytest.fixture(scope="module")
def builtin_docs():
    return {name: list(iter_documents(name)) for name in ("shakespeare", "zh-poems", "default")}


def test_builtin_corpora(builtin_docs):
    shakespeare, poems, default = (builtin_docs[k] for k in ("shakespeare", "zh-poems", "default"))
    assert len(shakespeare) == 42 and all(d.strip() for d in shakespeare)
    assert any(d.startswith("HAMLET") for d in shakespeare)
    assert "Gutenberg" not in "".join(shakespeare[:5])
    assert len(poems) > 400 and all("\x1b" not in d for d in poems)
    assert all(any("\u4e00" <= c <= "\u9fff" for c in d) for d in poems)
    assert default == shakespeare + poems
    assert list(iter_documents("builtin:zh-poems")) == poems
    assert len({corpus_fingerprint(n) for n in ("shakespeare", "zh-poems", "default")}) == 3
    assert corpus_fingerprint("default") == corpus_fingerprint("builtin:default")


def test_the_larger_builtin_corpora(builtin_docs):
    """wiki-leads and python-stdlib are what NOTICE says; "large" is all four builtins, in order."""
    large = list(iter_documents("large"))
    n_default = len(builtin_docs["default"])
    assert large[:n_default] == builtin_docs["default"]
    wiki, stdlib = large[n_default : n_default + 26_227], large[n_default + 26_227 :]
    assert wiki[0].startswith("20th-century classical music is Western art music")
    assert any(d.startswith("La ") for d in wiki) and any(d.startswith("El ") for d in wiki)  # fr, es
    assert len(stdlib) == 538 and all("\r" not in d for d in stdlib)
    assert any(d.startswith('"""Common operations on Posix pathnames.') for d in stdlib)  # posixpath.py
    assert list(iter_documents("builtin:wiki-leads")) == wiki
    names = ("shakespeare", "zh-poems", "default", "wiki-leads", "python-stdlib", "large")
    assert len({corpus_fingerprint(n) for n in names}) == len(names)
    assert sum(len(d.encode("utf-8")) for d in large) > 5 * sum(
        len(d.encode("utf-8")) for d in builtin_docs["default"]
    )


def test_unknown_builtin_and_the_anchor_corpus():
    with pytest.raises(DataError) as e:
        iter_documents("builtin:nope")
    assert "builtin" in one_line_error(e) and "anchor" in one_line_error(e)  # the message lists it
    spec = "builtin:anchor?anchors=3&n=50&seed=2"
    task = AnchorTask.from_params("anchors=3&n=50&seed=2")
    docs = list(iter_documents(spec))
    assert docs == list(task.documents()) and len(docs) == 50
    assert corpus_fingerprint(spec) != corpus_fingerprint("builtin:anchor?anchors=3&n=50&seed=3")
    with pytest.raises(DataError) as e:
        list(iter_documents("builtin:anchor?anchors=99"))
    assert "anchors=99" in one_line_error(e)


def test_user_files(tmp_path):
    (tmp_path / "a.txt").write_text("first document\n\nstill the first", encoding="utf-8")
    write_jsonl(tmp_path / "b.jsonl", ["second", "", "third 中文"])
    pq.write_table(pa.table({"text": ["fourth", None, "fifth"], "n": [1, 2, 3]}), tmp_path / "c.parquet")
    (tmp_path / "sub").mkdir()
    write_jsonl(tmp_path / "sub" / "d.jsonl", ["sixth"])
    (tmp_path / "ignored.csv").write_text("x", encoding="utf-8")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "e.txt").write_text("hidden", encoding="utf-8")

    assert list(iter_documents(str(tmp_path / "a.txt"))) == ["first document\n\nstill the first"]
    assert list(iter_documents(str(tmp_path / "b.jsonl"))) == ["second", "third 中文"]
    assert list(iter_documents(str(tmp_path / "c.parquet"))) == ["fourth", "fifth"]
    everything = ["first document\n\nstill the first", "second", "third 中文", "fourth", "fifth", "sixth"]
    assert list(iter_documents(str(tmp_path))) == everything
    assert list(iter_documents(tmp_path)) == everything  # a Path works too
    assert list(iter_documents(str(tmp_path / "*.jsonl"))) == ["second", "third 中文"]
    assert list(iter_documents(str(tmp_path / "**" / "*.jsonl"))) == ["second", "third 中文", "sixth"]

    write_jsonl(tmp_path / "f.jsonl", ["body"], field="content")
    assert list(iter_documents(str(tmp_path / "f.jsonl"), text_field="content")) == ["body"]
    pq.write_table(pa.table({"content": ["pq body"]}), tmp_path / "g.parquet")
    assert list(iter_documents(str(tmp_path / "g.parquet"), text_field="content")) == ["pq body"]


def test_parquet_streams_in_batches(tmp_path):
    texts = [f"row {i}" for i in range(3000)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "big.parquet", row_group_size=500)
    assert list(iter_documents(str(tmp_path / "big.parquet"))) == texts


def _expect_error(spec, *needles, text_field="text"):
    with pytest.raises(DataError) as e:
        list(iter_documents(spec, text_field=text_field))
    msg = one_line_error(e)
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def test_corpus_errors(tmp_path):
    _expect_error(str(tmp_path / "nope.txt"), "not found")
    _expect_error(str(tmp_path / "nope" / "*.jsonl"), "matches no files")
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    _expect_error(str(empty_dir), "no .txt")
    (tmp_path / "x.csv").write_text("a,b", encoding="utf-8")
    _expect_error(str(tmp_path / "x.csv"), "unsupported")

    (tmp_path / "empty.txt").write_text("  \n\n", encoding="utf-8")
    _expect_error(str(tmp_path / "empty.txt"), "empty")
    write_jsonl(tmp_path / "empty.jsonl", ["", " "])
    _expect_error(str(tmp_path / "empty.jsonl"), "empty")

    (tmp_path / "bin.txt").write_bytes(b"abc\x00def")
    _expect_error(str(tmp_path / "bin.txt"), "bin.txt", "NUL")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    _expect_error(str(tmp_path / "latin1.txt"), "latin1.txt", "UTF-8")

    (tmp_path / "nofield.jsonl").write_text('{"text": "ok"}\n{"body": "x"}\n', encoding="utf-8")
    _expect_error(str(tmp_path / "nofield.jsonl"), "nofield.jsonl:2", "'text'")
    (tmp_path / "badjson.jsonl").write_text('{"text": "ok"}\n\n{"text": oops}\n', encoding="utf-8")
    _expect_error(str(tmp_path / "badjson.jsonl"), "badjson.jsonl:3", "JSON")
    (tmp_path / "nonstr.jsonl").write_text('{"text": 5}\n', encoding="utf-8")
    _expect_error(str(tmp_path / "nonstr.jsonl"), "nonstr.jsonl:1")

    pq.write_table(pa.table({"body": ["x"], "id": [1]}), tmp_path / "nocol.parquet")
    _expect_error(str(tmp_path / "nocol.parquet"), "'text'", "body, id")
    _expect_error(str(tmp_path / "nocol.parquet"), "not string", text_field="id")
    (tmp_path / "broken.parquet").write_bytes(b"not a parquet file at all")
    _expect_error(str(tmp_path / "broken.parquet"), "broken.parquet")


def test_corpus_fingerprint(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", ["one"])
    fp = corpus_fingerprint(str(p))
    assert fp == corpus_fingerprint(str(p)) and len(fp) == 64
    assert fp != corpus_fingerprint(str(p), text_field="body")
    write_jsonl(p, ["one, edited"])
    assert corpus_fingerprint(str(p)) != fp
    with pytest.raises(DataError):
        corpus_fingerprint(str(tmp_path / "missing"))


# ------------------------------------------------------------------------------------------------- cache


def make_corpus(tmp_path, n=40):
    return write_jsonl(tmp_path / "docs.jsonl", [f"document number {i} " + "x" * (i % 7) for i in range(n)])


def test_cache_hit_and_env(tmp_path, bytes_tok, monkeypatch):
    corpus = str(make_corpus(tmp_path))
    monkeypatch.setenv("SMALLINIT_CACHE", str(tmp_path / "envcache"))
    first = load_token_data(corpus, bytes_tok)
    assert not first.from_cache and first.path.is_relative_to(tmp_path / "envcache")
    assert first.train.dtype == np.uint16 and first.val.dtype == np.uint16
    assert first.vocab_size == 257 and first.eos_id == 256
    assert first.meta["n_documents"] == 40

    def boom(*a, **k):
        raise AssertionError("re-tokenised although the cache is valid")

    monkeypatch.setattr(bytes_tok, "encode_batch", boom)
    second = load_token_data(corpus, bytes_tok)
    assert second.from_cache and second.path == first.path
    assert isinstance(second.train, np.memmap)
    np.testing.assert_array_equal(second.train, first.train)
    np.testing.assert_array_equal(second.val, first.val)
    # an explicit cache_dir wins over the environment
    monkeypatch.undo()
    third = load_token_data(corpus, bytes_tok, cache_dir=tmp_path / "explicit")
    assert third.path.is_relative_to(tmp_path / "explicit") and not third.from_cache
    np.testing.assert_array_equal(third.train, first.train)


def test_cache_key_changes(tmp_path, bytes_tok):
    corpus = make_corpus(tmp_path)
    a = load_token_data(str(corpus), bytes_tok, cache_dir=tmp_path)
    assert load_token_data(str(corpus), bytes_tok, cache_dir=tmp_path, seed=1).path != a.path
    assert load_token_data(str(corpus), bytes_tok, cache_dir=tmp_path, val_fraction=0.2).path != a.path
    write_jsonl(corpus, ["a changed corpus", "with two documents"])
    b = load_token_data(str(corpus), bytes_tok, cache_dir=tmp_path)
    assert b.path != a.path and not b.from_cache and b.meta["n_documents"] == 2


def test_corrupt_cache_rebuilt(tmp_path, bytes_tok):
    corpus = str(make_corpus(tmp_path))
    good = load_token_data(corpus, bytes_tok, cache_dir=tmp_path)
    train, val = np.array(good.train), np.array(good.val)
    folder = good.path
    del good
    with open(folder / "train.bin", "r+b") as f:  # truncated data file
        f.truncate(10)
    again = load_token_data(corpus, bytes_tok, cache_dir=tmp_path)
    assert not again.from_cache
    np.testing.assert_array_equal(again.train, train)
    (folder / "meta.json").write_text("{garbage", encoding="utf-8")  # unreadable metadata
    (folder / "val.bin").unlink()
    third = load_token_data(corpus, bytes_tok, cache_dir=tmp_path)
    assert not third.from_cache
    np.testing.assert_array_equal(third.val, val)
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_concurrent_builds(tmp_path, bytes_tok):
    corpus = str(make_corpus(tmp_path, n=200))
    results, errors = [], []

    def build():
        try:
            results.append(load_token_data(corpus, bytes_tok, cache_dir=tmp_path / "shared"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 3
    assert sum(not r.from_cache for r in results) == 1  # the lock let only one of them tokenise
    for r in results[1:]:
        np.testing.assert_array_equal(r.train, results[0].train)
    final = load_token_data(corpus, bytes_tok, cache_dir=tmp_path / "shared")
    assert final.from_cache


def test_split_by_document(tmp_path, bytes_tok):
    texts = [f"doc-{i:03d}" for i in range(100)]
    corpus = str(write_jsonl(tmp_path / "d.jsonl", texts))
    a = load_token_data(corpus, bytes_tok, cache_dir=tmp_path / "c1", val_fraction=0.2, seed=3)
    b = load_token_data(corpus, bytes_tok, cache_dir=tmp_path / "c2", val_fraction=0.2, seed=3)
    train, val = docs_of(a, bytes_tok, "train"), docs_of(a, bytes_tok, "val")
    assert (train, val) == (docs_of(b, bytes_tok, "train"), docs_of(b, bytes_tok, "val"))
    assert not set(train) & set(val) and sorted(train + val) == texts
    assert train == sorted(train) and val == sorted(val)  # corpus order is kept within a split
    assert 5 <= len(val) <= 40
    other = load_token_data(corpus, bytes_tok, cache_dir=tmp_path / "c1", val_fraction=0.2, seed=4)
    assert docs_of(other, bytes_tok, "val") != val
    none = load_token_data(corpus, bytes_tok, cache_dir=tmp_path / "c1", val_fraction=0.0)
    assert len(none.val) == 0 and sorted(docs_of(none, bytes_tok, "train")) == texts


@pytest.mark.parametrize("seed", range(6))
def test_two_documents_one_each(tmp_path, bytes_tok, seed):
    corpus = str(write_jsonl(tmp_path / "two.jsonl", ["alpha", "beta"]))
    for frac in (0.01, 0.9):
        data = load_token_data(corpus, bytes_tok, cache_dir=tmp_path, val_fraction=frac, seed=seed)
        train, val = docs_of(data, bytes_tok, "train"), docs_of(data, bytes_tok, "val")
        assert len(train) == 1 and len(val) == 1 and sorted(train + val) == ["alpha", "beta"]


def test_single_document_split_by_position(tmp_path, bytes_tok):
    text = "abcdefghij" * 20  # 200 bytes + EOS = 201 tokens
    (tmp_path / "one.txt").write_text(text, encoding="utf-8")
    data = load_token_data(str(tmp_path / "one.txt"), bytes_tok, cache_dir=tmp_path)
    assert len(data.train) + len(data.val) == 201 and len(data.val) == round(201 * 0.05)
    joined = np.concatenate([data.train, data.val]).tolist()
    assert joined == list(text.encode()) + [bytes_tok.eos_id]


def test_default_tokenizer_on_builtin(tmp_path, default_tok):
    data = load_token_data("zh-poems", default_tok, cache_dir=tmp_path)
    assert data.train.dtype == np.uint16 and len(data.train) > 10 * len(data.val) > 0
    assert int(np.asarray(data.train).max()) < 8192
    assert data.meta["n_train_documents"] + data.meta["n_val_documents"] == data.meta["n_documents"]
    first = docs_of(data, default_tok, "train")[0]
    assert first in set(iter_documents("zh-poems"))


def test_cache_rejects_bad_arguments(tmp_path, bytes_tok):
    corpus = str(make_corpus(tmp_path))
    for frac in (-0.1, 1.0):
        with pytest.raises(DataError) as e:
            load_token_data(corpus, bytes_tok, cache_dir=tmp_path, val_fraction=frac)
        one_line_error(e)
    with pytest.raises(DataError) as e:
        load_token_data(str(tmp_path / "missing.jsonl"), bytes_tok, cache_dir=tmp_path)
    one_line_error(e)


def test_uint32_for_large_vocab():
    assert cache_mod.token_dtype(65535) == np.uint16
    assert cache_mod.token_dtype(65536) == np.uint32


def test_doc_split_hash_is_stable():
    u = cache_mod.doc_uniform(0, np.arange(5))
    np.testing.assert_array_equal(u, cache_mod.doc_uniform(0, np.arange(5)))
    assert ((u >= 0) & (u < 1)).all()
    assert cache_mod.doc_uniform(0, 3)[0] == u[3]  # depends only on (seed, index), not on the chunk
    big = cache_mod.doc_uniform(7, np.arange(20000))
    assert abs(big.mean() - 0.5) < 0.02 and abs((big < 0.05).mean() - 0.05) < 0.01


# ---------------------------------------------------------------------------------------------- batching


def test_batches_deterministic_and_shifted():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = get_batch(tokens, 8, 16, seed=1, step=5)
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
    x2, y2 = get_batch(tokens, 8, 16, seed=1, step=5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert not torch.equal(get_batch(tokens, 8, 16, seed=1, step=6)[0], x)
    assert not torch.equal(get_batch(tokens, 8, 16, seed=2, step=5)[0], x)
    starts = batch_starts(1000, 8, 16, seed=1, step=5)
    assert torch.equal(x[:, 0], torch.from_numpy(starts))
    many = batch_starts(20, 4096, 19, seed=0, step=0)  # exactly one window fits: start 0 only
    assert many.min() == 0 and many.max() == 0
    wide = batch_starts(100, 10000, 10, seed=0, step=0)
    assert wide.min() == 0 and wide.max() == 100 - 11


def test_rank_slices_concatenate():
    tokens = np.random.default_rng(0).integers(0, 257, size=5000).astype(np.uint16)
    gx, gy = get_batch(tokens, 12, 32, seed=9, step=3)
    for world in (1, 2, 3, 4, 6):
        parts = [get_batch(tokens, 12, 32, seed=9, step=3, rank=r, world_size=world) for r in range(world)]
        assert all(p[0].shape == (12 // world, 32) for p in parts)
        assert torch.equal(torch.cat([p[0] for p in parts]), gx)
        assert torch.equal(torch.cat([p[1] for p in parts]), gy)
    with pytest.raises(DataError) as e:
        get_batch(tokens, 12, 32, seed=9, step=3, rank=0, world_size=5)
    assert "multiple" in one_line_error(e)
    with pytest.raises(DataError):
        get_batch(tokens, 12, 32, seed=9, step=3, rank=2, world_size=2)


def test_too_short_corpus():
    with pytest.raises(DataError) as e:
        get_batch(np.arange(16, dtype=np.uint16), 2, 16, seed=0, step=0)
    msg = one_line_error(e)
    assert "16 tokens" in msg and "data.seq_len" in msg
    get_batch(np.arange(17, dtype=np.uint16), 2, 16, seed=0, step=0)  # exactly one window is enough
    with pytest.raises(DataError):
        list(iter_eval_batches(np.arange(5, dtype=np.uint16), 2, 8, None))


def test_eval_batches():
    tokens = np.arange(1001, dtype=np.uint16)
    batches = list(iter_eval_batches(tokens, 4, 10, None))
    xs = torch.cat([b[0] for b in batches])
    ys = torch.cat([b[1] for b in batches])
    assert xs.shape == (100, 10) and [b[0].shape[0] for b in batches] == [4] * 25
    assert torch.equal(xs.flatten(), torch.arange(1000)) and torch.equal(ys.flatten(), torch.arange(1, 1001))
    limited = list(iter_eval_batches(tokens, 4, 10, max_batches=3))
    assert len(limited) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(limited, batches))
    odd = list(iter_eval_batches(np.arange(56, dtype=np.uint16), 4, 10, None))
    assert [b[0].shape[0] for b in odd] == [4, 1]
    assert list(iter_eval_batches(tokens, 4, 10, max_batches=0)) == []


def test_batches_from_token_cache(tmp_path, bytes_tok):
    data = load_token_data(str(make_corpus(tmp_path, n=60)), bytes_tok, cache_dir=tmp_path)
    x, y = get_batch(data.train, 4, 8, seed=0, step=0)
    assert x.max() < data.vocab_size
    xv, _ = next(iter_eval_batches(data.val, 2, 8, 1))
    assert torch.equal(xv[0], torch.from_numpy(np.asarray(data.val[:8], dtype=np.int64)))


# ----------------------------------------------------------------------------------------------- repeated data


def test_repeat_message_only_beyond_one_epoch():
    assert epochs(10, 4, 25, 2000) == 0.5
    assert repeat_message(20, 4, 25, 2000, "default") is None  # exactly one epoch
    msg = repeat_message(30, 4, 25, 2000, "default")
    assert "1.50 epochs" in msg and "3,000" in msg and "'default'" in msg and "data.corpus=large" in msg
