"""Hostile or malformed input: each gets one line and exit 2 (never a traceback or a hang), and nothing runs
that the input smuggled in — loading never unpickles.

Property-based (hypothesis, bounded so the file stays fast) over config files, ``--set`` values, CLI
arguments, corpora and sweep files; explicit cases for the known-bad shapes of each.
"""

import contextlib
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import smallinit
from smallinit import AnalysisConfig, Config, DataConfig, ModelConfig, MoEConfig, TrainConfig, load_model
from smallinit.cli import main
from smallinit.data import load_tokenizer
from smallinit.data.cache import doc_uniform
from smallinit.errors import ConfigError, SmallinitError
from smallinit.io import sha256_file
from smallinit.study.planning.recipes import load_recipe
from smallinit.study.running import Sweep, resolve_config
from smallinit.train import Trainer
from smallinit.train import checkpoint as ckpt
from support.runs import TINY_MODEL, snapshot

FAST = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TINY = [
    *TINY_MODEL,
    "train.batch_size=4",
    "train.steps=1",
    "train.eval_every=0",
    "train.eval_batches=1",
    "train.warmup_steps=0",
]


def sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def cli(argv: list[str]) -> tuple[int, str, str]:
    """``smallinit ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: --help (0) or a usage error (2)
            code = e.code if isinstance(e.code, int) else 0
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, err: str) -> str:
    assert code == 2, (code, err)
    assert "Traceback" not in err and err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("smallinit") and ": error: " in err, err
    return err.strip()


# -- nothing is ever unpickled ---------------------------------------------------------------------------


class Payload:
    """Unpickling this creates ``marker``: proof that a loader ran code from a file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture()
def payloads(tmp_path):
    marker = tmp_path / "PWNED"
    blob = pickle.dumps({"model.embed.weight": Payload(marker)})
    torch.save({"weight": Payload(marker)}, tmp_path / "payload.pt")  # the torch.load zip format
    pickle.loads(blob)  # the payload works: this test can fail
    assert marker.exists()
    marker.unlink()
    return marker, {"pickle": blob, "torch.save": (tmp_path / "payload.pt").read_bytes()}


def test_no_unpickling_api_in_the_code():
    """Tensors come only from safetensors; torch.load, if ever used, must be weights_only=True."""
    src = Path(smallinit.__file__).parent
    offenders = []
    for f in src.rglob("*.py"):
        text = f.read_text(encoding="utf-8")
        for pattern in (
            r"\bimport pickle\b",
            r"\bpickle\.loads?\(",
            r"\bdill\b",
            r"\bjoblib\b",
            r"\bshelve\b",
            r"allow_pickle\s*=\s*True",
            r"torch\.load\((?![^)]*weights_only\s*=\s*True)",
        ):
            offenders += [f"{f.relative_to(src)}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert offenders == []


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("pickle") / "run"
    Trainer(
        Config.load(overrides=[*TINY, "data.corpus=shakespeare", "train.steps=2"]), run, callbacks=[]
    ).fit()
    return run


@pytest.mark.parametrize("fmt", ["pickle", "torch.save"])
@pytest.mark.parametrize("fname", ["model.safetensors", "optim.safetensors"])
def test_pickle_in_place_of_checkpoint_is_refused_unrun(fmt, fname, finished_run, payloads, tmp_path):
    marker, blobs = payloads
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    ck = ckpt.newest_checkpoint(run).path
    (ck / fname).write_bytes(blobs[fmt])
    state = json.loads((ck / "state.json").read_text())  # checksums updated: only the format can refuse it
    state["files"][fname] = {"bytes": len(blobs[fmt]), "sha256": sha256_file(ck / fname)}
    (ck / "state.json").write_text(json.dumps(state))
    before = snapshot(run)

    code, _, err = cli(["train", "--out", str(run), "--resume"])
    assert "not a readable safetensors file" in assert_one_line_error(code, err)
    if fname == "model.safetensors":
        with pytest.raises(SmallinitError, match="not a readable safetensors file"):
            load_model(run)
    assert not marker.exists()
    assert before == snapshot(run)


@pytest.mark.parametrize("fmt", ["pickle", "torch.save"])
def test_pickle_as_tokenizer_config_or_state_is_refused_unrun(fmt, payloads, finished_run, tmp_path):
    marker, blobs = payloads
    tok = tmp_path / "tokenizer.json"
    tok.write_bytes(blobs[fmt])
    with pytest.raises(SmallinitError, match="cannot read tokenizer file"):
        load_tokenizer(str(tok))
    code, _, err = cli(["train", "--out", str(tmp_path / "a"), *sets(*TINY, f"data.tokenizer={tok}")])
    assert "cannot read tokenizer file" in assert_one_line_error(code, err)

    toml = tmp_path / "config.toml"
    toml.write_bytes(blobs[fmt])
    code, _, err = cli(["info", "--config", str(toml)])
    assert "not valid TOML" in assert_one_line_error(code, err)

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "config.json").write_bytes(blobs[fmt])
    code, _, err = cli(["train", "--out", str(run), "--resume"])
    assert "not valid JSON" in assert_one_line_error(code, err)
    state = run / "checkpoints" / ckpt.newest_checkpoint(finished_run).path.name / "state.json"
    state.write_bytes(blobs[fmt])
    with pytest.raises(SmallinitError):
        load_model(state.parent)
    assert not marker.exists() and not (tmp_path / "a").exists()


# -- configs and --set values ----------------------------------------------------------------------------

SECTIONS = {
    "model": ModelConfig,
    "train": TrainConfig,
    "data": DataConfig,
    "analysis": AnalysisConfig,
    "moe": MoEConfig,
}
KNOWN_KEYS = sorted({f.name for cls in SECTIONS.values() for f in fields(cls)} | {"preset"})
WORDS = [
    "cpu-1m",
    "tiny",
    "1.5b",
    "headwise",
    "none",
    "bf16",
    "fp16",
    "cosine",
    "wsd",
    "skip",
    "bytes",
    "shakespeare",
    "cpu",
    "cuda:7",
    "null",
    "",
    "../../etc",
    "\x00",
    "é✓",
]

scalars = st.one_of(  # plausible values often, so that valid configs come up too
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-3, max_value=300),
    st.sampled_from([2, 4, 8, 16, 32, 64]),
    st.floats(),
    st.floats(min_value=1e-6, max_value=0.9),
    st.booleans(),
    st.sampled_from(WORDS),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=6), c, max_size=3)
    ),
    max_leaves=6,
)


def section(name: str):
    keys = [f.name for f in fields(SECTIONS[name])] + (["preset", "moe"] if name == "model" else [])
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), scalars | values, max_size=4)


documents = st.one_of(
    st.fixed_dictionaries(
        {}, optional={name: section(name) for name in ("model", "train", "data", "analysis")}
    ),
    st.dictionaries(
        st.sampled_from([*SECTIONS, "sweep"]) | st.text(max_size=6),
        st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=8), values) | values,
        max_size=4,
    ),
)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return (
            "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
        )
    if isinstance(v, str):
        return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\U{ord(c):08x}" for c in v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{toml_value(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def check_config_outcome(load) -> None:
    """Either a valid config that survives strict JSON unchanged, or a one-line ConfigError."""
    try:
        cfg = load()
    except ConfigError as e:
        assert "\n" not in str(e) and str(e), repr(e)
        return
    assert cfg.validate() is cfg
    assert Config.from_dict(json.loads(json.dumps(cfg.to_dict(), allow_nan=False))) == cfg


@FAST
@given(doc=documents)
def test_config_files_load_or_one_line_error(doc, tmp_path_factory):
    f = tmp_path_factory.mktemp("cfg") / "c.toml"
    f.write_text("\n".join(f"{toml_value(k)} = {toml_value(v)}" for k, v in doc.items()), encoding="utf-8")
    check_config_outcome(lambda: Config.load(f))


@FAST
@given(
    key=st.sampled_from(
        [f"{s}.{f.name}" for s, c in SECTIONS.items() if s != "moe" for f in fields(c)]
        + ["model.preset", "model.moe.top_k", "model.moe"]
    )
    | st.text(max_size=15),
    value=st.text(max_size=15) | scalars.map(toml_value) | values.map(toml_value),
    sep=st.sampled_from(["=", "=", " = ", "", "=="]),
)
def test_set_values_load_or_one_line_error(key, value, sep):
    check_config_outcome(lambda: Config.load(overrides=[f"{key}{sep}{value}"]))


@FAST
@given(raw=st.binary(max_size=200))
def test_binary_config_files(raw, tmp_path_factory):
    f = tmp_path_factory.mktemp("bin") / "c.toml"
    f.write_bytes(raw)
    check_config_outcome(lambda: Config.load(f))


@pytest.mark.parametrize(
    "text,words",
    [
        ("a = " + "[" * 5000 + "]" * 5000, "not valid TOML"),
        ("[model]\nd_model = 4611686018427387904\nn_heads = 4\nn_kv_heads = 4", "too large"),
        ("[train]\nweight_decay = nan", "finite"),
        ("[train]\nadam_eps = -1.0", "adam_eps"),
        ('[data]\ncorpus = "\\u0000"\ntokenizer = "bytes"', "not found"),
        ('[model]\n"a\\nb" = 1', "unknown config key 'model.a\\nb'"),
    ],
)
def test_config_edge_cases_via_cli(text, words, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(text, encoding="utf-8")
    code, _, err = cli(["train", "--config", str(f), "--out", str(tmp_path / "run")])
    assert words in assert_one_line_error(code, err)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "values,words",
    [
        (["train.batch_size=1099511627776"], "is too large; use at most 2**24"),
        (["train.batch_size=4194304"], "lower train.batch_size"),  # the activations cannot fit
        (
            ["model.n_layers=100000000"],
            "choose a smaller model",
        ),  # the weights cannot fit; estimated without building
        (["model.d_model=1048576", "model.n_heads=4", "model.n_kv_heads=4"], "choose a smaller model"),
    ],
)
def test_configs_too_big_for_the_machine_are_refused_before_writing(values, words, tmp_path):
    code, _, err = cli(["train", "--out", str(tmp_path / "run"), *sets(*TINY, *values)])
    assert words in assert_one_line_error(code, err)
    assert not (tmp_path / "run").exists()


def test_out_of_memory_in_a_real_process_is_one_line(tmp_path):
    """An allocation the estimate allows but the process cannot get (address space capped at 1 GiB above what
    the process maps once torch is loaded; one matrix of the model needs 0.5 GB, the model 1.5 GB): one line,
    exit 2, no run folder. The cap is relative: a CUDA build of torch maps more than 2 GiB just to load."""
    argv = [
        "train",
        "--out",
        str(tmp_path / "run"),
        *sets(*TINY, "model.d_model=64", "model.d_ff=2000000", "model.n_layers=1"),
    ]
    capped = (
        "import re, resource, sys\n"
        "import smallinit.train  # torch and what training loads, before the cap\n"
        "from smallinit.cli import main\n"
        "mapped = int(re.search(r'VmSize:\\s+(\\d+) kB', open('/proc/self/status').read())[1]) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (mapped + 2**30, mapped + 2**30))\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    r = subprocess.run([sys.executable, "-c", capped, *argv], capture_output=True, text=True, timeout=120)
    assert "out of memory" in assert_one_line_error(r.returncode, r.stderr)
    assert not (tmp_path / "run").exists()


def test_deeply_nested_set_and_config_json(tmp_path):
    code, _, err = cli(["info", "--set", "model.gamma=" + "[" * 5000])
    assert "nests too deeply" in assert_one_line_error(code, err)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("[" * 100000)
    code, _, err = cli(["train", "--out", str(run), "--resume"])
    assert "not valid JSON" in assert_one_line_error(code, err)


# -- CLI arguments -----------------------------------------------------------------------------------------

ARG_POOL = [
    "--config",
    "--preset",
    "--set",
    "--out",
    "--resume",
    "--vocab-size",
    "--text-field",
    "--help",
    "-h",
    "--",
    "-",
    "--bogus",
    "x",
    "cpu-5m",
    "1.5b",
    "nope",
    "model.gamma=-1",
    "model.gate=headwise",
    "train.steps=abc",
    "=",
    "model.=1",
    "a.b.c=1",
    "/nonexistent.toml",
    "",
    "10",
    "-5",
    "é",
    "train",
    "info",
    "tokenizer",
]


@FAST
@given(
    command=st.sampled_from([["train"], ["info"], ["tokenizer"], ["tokenizer", "train"], ["nonsense"], []]),
    rest=st.lists(
        st.sampled_from(ARG_POOL) | st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=8),
        max_size=6,
    ),
)
def test_cli_arguments_exit_0_or_one_line_2(command, rest, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cli")
    argv = [*command, *rest]
    if command == ["train"]:
        argv += sets("train.steps=0")  # whatever else it says, never start a long training run
    with contextlib.chdir(cwd):
        code, out, err = cli(argv)
    if code == 0:
        assert "Traceback" not in err
    else:
        assert_one_line_error(code, err)
        assert not (cwd / "runs").exists()


def test_cli_errors_in_a_real_process(tmp_path):
    """Exit codes and stderr as a shell sees them: an argparse and a corpus error, one line each."""
    cases = [
        # refused by the command it was given to, with that command's help, where the flag would be listed
        (
            ["train", "--no-such-flag"],
            "smallinit train: error: unrecognized arguments: --no-such-flag; see smallinit train --help",
        ),
        (["tokenizer", "train", "c", "--out", "t", "--bogus"], "see smallinit tokenizer train --help"),
        (["--bogus"], "smallinit: error: unrecognized arguments: --bogus; see smallinit --help"),
        (["train", "--out", str(tmp_path / "r"), *sets(*TINY, f"data.corpus={tmp_path}")], "has no .txt"),
    ]
    for argv, words in cases:
        r = subprocess.run(
            [sys.executable, "-m", "smallinit", *argv], capture_output=True, text=True, timeout=120
        )
        assert words in assert_one_line_error(r.returncode, r.stderr)


# -- corpora -----------------------------------------------------------------------------------------------


def train_on(corpus: Path, tmp_path: Path, *extra: str) -> tuple[int, str, Path]:
    run = tmp_path / "run"
    code, _, err = cli(["train", "--out", str(run), *sets(*TINY, f"data.corpus={corpus}", *extra)])
    return code, err, run


def _two_docs_train_too_short(tmp_path: Path) -> tuple[Path, str]:
    """Two documents, the long one in the validation split and 5 tokens in training (split by hash)."""
    u = doc_uniform(0, [0, 1]).tolist()
    long_first = u[0] < u[1]  # the document with the smaller draw goes to val
    docs = ["x" * 2000, "tiny"] if long_first else ["tiny", "x" * 2000]
    f = tmp_path / "two.jsonl"
    f.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return f, f"data.val_fraction={(u[0] + u[1]) / 2}"


@pytest.mark.parametrize(
    "name,make,words",
    [
        ("empty.txt", lambda p: p.write_bytes(b""), "empty"),
        ("blank.jsonl", lambda p: p.write_text('{"text": "  "}\n\n{"text": null}\n'), "empty"),
        ("binary.txt", lambda p: p.write_bytes(bytes(range(256)) * 4), "NUL"),
        ("new\nline.txt", lambda p: p.write_bytes(b"\x00"), "new\\nline.txt contains NUL"),
        ("latin1.txt", lambda p: p.write_bytes("naïve café ".encode("latin-1") * 50), "UTF-8"),
        ("short.txt", lambda p: p.write_text("fewer tokens than one sequence"), "fewer than one sequence"),
        ("nested.jsonl", lambda p: p.write_text("[" * 100000 + "\n"), "nests JSON too deeply"),
        ("nocol.parquet", lambda p: pq.write_table(pa.table({"body": ["a" * 500]}), p), "no column 'text'"),
    ],
)
def test_bad_corpora_one_line_and_no_run_folder(name, make, words, tmp_path):
    corpus = tmp_path / name
    make(corpus)
    code, err, run = train_on(corpus, tmp_path)
    assert words in assert_one_line_error(code, err)
    assert not run.exists()


def test_train_split_too_short_is_caught_before_writing(tmp_path):
    corpus, val_fraction = _two_docs_train_too_short(tmp_path)
    code, err, run = train_on(corpus, tmp_path, val_fraction)
    assert "train split has 5 tokens" in assert_one_line_error(code, err)
    assert not run.exists()


def test_single_huge_line_trains(tmp_path):
    corpus = tmp_path / "huge.jsonl"
    corpus.write_text(json.dumps({"text": "the quick brown fox jumps over the lazy dog " * 50_000}))  # 2.2 MB
    code, err, run = train_on(corpus, tmp_path)
    assert code == 0, err
    assert ckpt.newest_checkpoint(run).step == 1


def test_no_hang_on_special_files(tmp_path):
    """A FIFO named like a corpus file, a symlink loop and /dev/zero: refused at once (a real process with a
    timeout, where a hang would show)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    os.mkfifo(folder / "pipe.txt")
    (folder / "loop").symlink_to(folder, target_is_directory=True)
    (folder / "zero.txt").symlink_to("/dev/zero")
    for spec, words in ((folder, "has no .txt"), (f"{folder}/**/*.txt", "matches no .txt")):
        argv = ["train", "--out", str(tmp_path / "run"), *sets(*TINY, f"data.corpus={spec}")]
        r = subprocess.run(
            [sys.executable, "-m", "smallinit", *argv], capture_output=True, text=True, timeout=120
        )
        assert words in assert_one_line_error(r.returncode, r.stderr)
    code, err, run = train_on(Path("/dev/zero"), tmp_path)
    assert "not found" in assert_one_line_error(code, err)
    assert not (tmp_path / "run").exists()


jsonl_lines = st.one_of(
    st.builds(lambda t: json.dumps({"text": t}), st.text(max_size=120)),
    st.builds(
        json.dumps,
        st.recursive(
            st.none() | st.integers() | st.text(max_size=5),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
        ),
    ),
    st.text(max_size=40),
)


@settings(FAST, max_examples=30)
@given(
    kind=st.sampled_from([".txt", ".jsonl"]),
    raw=st.binary(max_size=400),
    text=st.text(max_size=600),
    lines=st.lists(jsonl_lines, max_size=8),
    use=st.sampled_from("brl"),
)
def test_random_corpora_train_or_one_line_error(kind, raw, text, lines, use, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    corpus = tmp / f"c{kind}"
    content = {
        "b": raw,
        "r": text.encode("utf-8", "surrogatepass"),
        "l": "\n".join(lines).encode("utf-8", "surrogatepass"),
    }
    corpus.write_bytes(content[use])
    code, err, run = train_on(corpus, tmp)
    if code == 0:
        assert ckpt.newest_checkpoint(run).step == 1
    else:
        assert_one_line_error(code, err)
        assert not run.exists()


# -- sweep files -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,words",
    [  # the plain bad shapes are in test_sweep.py; these are the hostile ones
        ('[grid]\n"model.gamma" = [0.5, nan]', "finite"),
        ('[grid]\n"../../x" = [1]', "section.key=value"),
        ('[arms."../evil"]\n"model.gamma" = 1.0', "may hold only"),
        ('[sizes."/abs"]\n"model.preset" = "cpu-1m"', "may hold only"),
        ('[grid]\n"train.steps" = [{a = 1}]', "int"),
        ("grid = 3", "must be a table"),
    ],
)
def test_bad_sweep_files_one_line_nothing_written(text, words, tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(text, encoding="utf-8")
    with contextlib.chdir(tmp_path):
        code, _, err = cli(["sweep", str(f), "--out", str(tmp_path / "out")])
    assert words in assert_one_line_error(code, err)
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


grid_values = st.lists(
    st.one_of(st.floats(), st.integers(-5, 5), st.text(max_size=6), st.booleans()), max_size=3
)


@settings(FAST, max_examples=60)
@given(
    grid=st.dictionaries(
        st.sampled_from(["model.gamma", "train.seed", "model.norm_eps", "model.gate"]) | st.text(max_size=10),
        grid_values,
        max_size=3,
    ),
    arms=st.dictionaries(st.text(max_size=8), st.just({"model.gamma": 1.0}), max_size=2),
)
def test_sweep_grids_cells_or_one_line_error(grid, arms):
    raw = {"base": {"data.tokenizer": "bytes"}, "grid": grid, **({"arms": arms} if arms else {})}
    try:
        cells = Sweep.from_dict(raw).cells()
        for cell in cells:
            resolve_config(cell)
    except SmallinitError as e:
        assert "\n" not in str(e)
        return
    for cell in cells:  # a cell's id is its folder name: one plain path component, inside cells/
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", cell.id), cell.id


junk = values | st.just(3)
sweep_tables = st.fixed_dictionaries(
    {},
    optional={
        "grid": st.dictionaries(st.sampled_from(["model.gamma", "train.seed"]), grid_values, max_size=2)
        | junk,
        "base": st.dictionaries(st.sampled_from(["model.gamma", "train.steps"]), scalars, max_size=2) | junk,
        "arms": st.dictionaries(st.sampled_from(["a", "../b"]), st.just({"model.gamma": 1.0}), max_size=2)
        | junk,
    },
)
names = st.sampled_from(["cpu", "micro", "..", "../../evil", "a/b", "/abs", ".hidden", ""]) | st.text(
    max_size=4
)
recipe_docs = st.fixed_dictionaries(
    {"recipe": st.fixed_dictionaries({"findings": st.sampled_from(["fig1", "nope"]) | junk})},
    optional={
        "base": st.dictionaries(st.sampled_from(["model.gamma", "train.steps"]), scalars, max_size=2) | junk,
        "scales": st.dictionaries(
            names,
            st.fixed_dictionaries(
                {},
                optional={
                    "description": junk,
                    "base": junk,
                    "options": junk,
                    "sweeps": st.dictionaries(names, sweep_tables | junk, max_size=2) | junk,
                },
            )
            | junk,
            max_size=2,
        )
        | junk,
    },
)


@settings(FAST, max_examples=60)
@given(doc=recipe_docs)
def test_recipe_files_load_or_one_line_error(doc, tmp_path_factory):
    """A recipe from anywhere: scales and sweeps are checked, and their names (folder names) stay inside."""
    f = tmp_path_factory.mktemp("recipe") / "r.toml"
    f.write_text("\n".join(f"{toml_value(k)} = {toml_value(v)}" for k, v in doc.items()), encoding="utf-8")
    try:
        recipe = load_recipe(f)
    except SmallinitError as e:
        assert "\n" not in str(e)
        return
    for scale in recipe.scales.values():
        for name in (scale.name, *scale.sweeps):
            assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+-]*", name), name


@pytest.mark.parametrize(
    "text,words",
    [
        ('[scales."../../evil".sweeps.g.grid]\n"model.gamma" = [1.0]', "scale name '../../evil'"),
        ('[scales.cpu.sweeps."../../evil".grid]\n"model.gamma" = [1.0]', "sweep name '../../evil'"),
        ('[scales.cpu.sweeps."/abs".grid]\n"model.gamma" = [1.0]', "sweep name '/abs'"),
        (
            '[scales.cpu]\noptions = 3\n[scales.cpu.sweeps.g.grid]\n"model.gamma" = [1.0]',
            "options must be a table",
        ),
    ],
)
def test_recipe_names_cannot_leave_the_folder(text, words, tmp_path):
    f = tmp_path / "evil.toml"
    f.write_text('[recipe]\nfindings = "fig1"\n' + text, encoding="utf-8")
    with contextlib.chdir(tmp_path):
        # train.steps=0: were a name let through, every cell would be refused before any folder is made
        code, _, err = cli(
            [
                "recipe",
                str(f),
                "--scale",
                "cpu",
                "--out",
                str(tmp_path / "out" / "deep"),
                "--set",
                "train.steps=0",
            ]
        )
    assert words in assert_one_line_error(code, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.toml"]


# -- the HTML report -----------------------------------------------------------------------------------------

HOSTILE = [
    "<script>alert(1)</script>",
    "</code></td></tr></table><iframe src=//evil.example>",
    '"><img src=x onerror=alert(2)>',
    "<!-- open comment",
    "<![CDATA[x]]>",
    "<svg onload=alert(3)>",
    "<style>body{display:none}</style>",
    "&lt;pre-escaped&gt;",
    "javascript:alert(4)",
]
ACTIVE_TAGS = {
    "script",
    "iframe",
    "frame",
    "svg",
    "math",
    "object",
    "embed",
    "link",
    "base",
    "form",
    "input",
    "button",
    "a",
    "audio",
    "video",
    "source",
    "template",
}  # what could run, load or navigate


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.text, self.comments = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs

    def handle_data(self, data):
        self.text.append(data)

    def handle_comment(self, data):
        self.comments.append(data)

    def unknown_decl(self, data):
        self.comments.append(data)


def test_hostile_corpus_and_names_cannot_inject_into_the_report(tmp_path):
    """Corpus text (decoded tokens and contexts), labels and folder names reach the page only as text."""
    root = tmp_path / 'r"><img src=x onerror=alert(5)>'
    corpus = root / "corpus.txt"
    root.mkdir()
    corpus.write_text(" ".join(HOSTILE) * 60, encoding="utf-8")
    for gamma in (0.5, 1.0):
        cfg = Config.load(
            overrides=[
                *TINY,
                f"data.corpus={json.dumps(str(corpus))}",
                "train.steps=2",
                f"model.gamma={gamma}",
            ]
        )
        Trainer(cfg, root / f"g{gamma}", callbacks=[]).fit()
    code, _, err = cli(
        [
            "compare",
            str(root / "g1.0"),
            str(root / "g0.5"),
            "--out",
            str(root / "cmp"),
            "--data",
            str(corpus),
            "--top-k",
            "5",
            "--set",
            "train.batch_size=2",
            "--bins",
            "2",
            "--max-tokens",
            "600",
            "--labels",
            '<b onmouseover=alert(6)>A</b>,"B<script>"',
        ]
    )
    assert code == 0, err
    code, _, err = cli(["report", str(root)])
    assert code == 0, err
    page = (root / "report.html").read_text(encoding="utf-8")
    parsed = _Tags()
    parsed.feed(page)
    assert not set(parsed.tags) & ACTIVE_TAGS, set(parsed.tags) & ACTIVE_TAGS
    assert parsed.tags.count("style") == 1 and parsed.tags.count("meta") == 1 and parsed.comments == []
    assert not [a for a, _ in parsed.attrs if a.startswith("on") or a in ("href", "srcdoc", "action")]
    assert all(v.startswith("data:image/png;base64,") for a, v in parsed.attrs if a == "src")
    text = "".join(parsed.text)
    assert root.name in text and "B<script>" in text  # shown, as text
    assert any(h[:12] in text for h in HOSTILE)  # corpus contexts were shown, as text


def test_eval_never_runs_code_planted_in_a_run_folder(finished_run, tmp_path):
    """``smallinit eval`` reuses RUN/eval/hf-step_N-<sha>; a downloaded run folder could plant remote code
    there, which trust_remote_code would import. Only smallinit's own code is ever trusted."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("transformers")
    from smallinit.export.hf import REMOTE_CLASS

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    found = ckpt.newest_checkpoint(run)
    planted = (
        run / "eval" / f"hf-step_{found.step:07d}-{found.state['files']['model.safetensors']['sha256'][:12]}"
    )
    planted.mkdir(parents=True)
    marker = tmp_path / "PWNED"
    (planted / "modeling_smallinit.py").write_text(f"open({str(marker)!r}, 'w')\n")
    (planted / "config.json").write_text(
        json.dumps(
            {
                "architectures": [REMOTE_CLASS],
                "model_type": "smallinit",
                "auto_map": {
                    "AutoConfig": "modeling_smallinit.C",
                    "AutoModelForCausalLM": "modeling_smallinit.M",
                },
            }
        )
    )
    tasks = Path(__file__).resolve().parents[1] / "lmeval_tasks"
    with contextlib.chdir(Path(__file__).resolve().parents[2]):
        code, _, err = cli(
            ["eval", str(run), "--tasks", "smallinit_tiny_mc", "--limit", "1", "--include-path", str(tasks)]
        )
    assert "code smallinit did not write" in assert_one_line_error(code, err)
    assert not marker.exists()
