"""torchrun with DDP and FSDP2: real processes (gloo, 2 ranks, CPU) checked against single-process training.

The global batch of every step is the same whatever the number of ranks, so a 2-rank run must reproduce
the single-process run up to the order of floating-point reductions. Tolerance: losses and weights agree
to 1e-5 (relative for losses, absolute for weights); measured differences are ~1e-7.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import smallinit
from smallinit import Config, Transformer
from smallinit.errors import CheckpointError, ConfigError
from smallinit.train import Trainer
from smallinit.train import checkpoint as ckpt
from smallinit.train.distributed import Runtime, check_layout, eval_pieces, parallelize, with_layout_of
from support.distributed import cut_at, records, same, torchrun
from support.runs import TINY_MODEL, tensors_of

WORKER = str(Path(__file__).parents[1] / "_dist_worker.py")
TINY = [
    *TINY_MODEL,
    "data.corpus=shakespeare",
    "train.batch_size=8",
    "train.grad_accum=2",
    "train.warmup_steps=2",
    "train.steps=6",
    "train.log_every=1",
    "train.eval_every=3",
    "train.eval_batches=2",
    "train.checkpoint_every=3",
    "train.keep_checkpoints=10",
]
RTOL = 1e-5  # losses, relative
ATOL = 1e-5  # weights and optimizer state, absolute


def sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def final(run: Path) -> dict[str, torch.Tensor]:
    return tensors_of(ckpt.newest_checkpoint(run).path)


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Run folders: single (in this process); ddp (the CLI under torchrun); then one 2-rank job of the
    worker that writes fsdp (step-0 checkpoint, then fit), single-to-fsdp (the single run cut at step 3,
    resumed with FSDP) and ddp-resumed (the ddp run cut at step 3, resumed with DDP); then a second job on
    the fsdp run's sharded checkpoint of step 3: fsdp-resumed (resumed with FSDP), fsdp-resaved and
    fsdp-resaved@ddp (restored on 2 ranks and written again), fsdp-corrupt (a shard altered: refused)."""
    root = tmp_path_factory.mktemp("dist")
    Trainer(Config.load(overrides=TINY), root / "single", callbacks=[]).fit()
    r = torchrun("-m", "smallinit", "train", "--out", root / "ddp", *sets(*TINY, "train.parallel=ddp"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("done: step 6") == 1  # only rank 0 reports
    cut_at(root / "single", root / "single-to-fsdp", 3)
    cut_at(root / "ddp", root / "ddp-resumed", 3)
    r = torchrun(
        WORKER,
        "init",
        root / "fsdp",
        "resume",
        root / "single-to-fsdp",
        "resume@ddp",
        root / "ddp-resumed",
        "--",
        *TINY,
        "train.parallel=fsdp",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("fsdp-resumed", "fsdp-resaved", "fsdp-resaved@ddp", "fsdp-corrupt"):
        cut_at(root / "fsdp", root / name, 3)
    corrupt(root / "fsdp-corrupt")
    jobs = [
        "resume",
        "fsdp-resumed",
        "resave",
        "fsdp-resaved",
        "resave@ddp",
        "fsdp-resaved@ddp",
        "refuse",
        "fsdp-corrupt",
    ]
    r = torchrun(
        WORKER, *[root / j if i % 2 else j for i, j in enumerate(jobs)], "--", *TINY, "train.parallel=fsdp"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return root


def corrupt(run: Path) -> Path:
    """Flip one byte in the middle of rank 2's shard of the newest checkpoint; return that file."""
    shard = next((ckpt.newest_checkpoint(run).path / ckpt.SHARDS).glob("shard-00002-*"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard


def test_initial_weights_do_not_depend_on_the_layout(runs):
    """The FSDP shards of both ranks, gathered at step 0, are the weights one process draws from the seed."""
    cfg = Config.load(overrides=TINY)
    cfg.model.vocab_size = 257  # the byte tokenizer
    unique, _ = ckpt.split_aliases(Transformer(cfg.model, seed=cfg.train.seed).state_dict())
    saved, _ = ckpt.read_tensors(ckpt.read_checkpoint(ckpt.checkpoint_dir(runs / "fsdp", 0)), optimizer=False)
    assert saved.keys() == unique.keys()
    assert all(torch.equal(saved[k], unique[k]) for k in unique)


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_two_ranks_match_one_process(runs, layout):
    single, multi = records(runs / "single"), records(runs / layout)
    assert [r["step"] for r in multi] == [r["step"] for r in single]  # each record once: only rank 0 logs
    for key in ("loss", "val_loss", "grad_norm"):
        a = [r[key] for r in single if key in r]
        b = [r[key] for r in multi if key in r]
        assert len(a) == len(b) > 0
        assert b == pytest.approx(a, rel=RTOL), key
    assert max_abs_diff(final(runs / "single"), final(runs / layout)) < ATOL


def test_only_rank_zero_writes_but_every_rank_its_shard(runs):
    def listing(run: Path) -> list[str]:
        return sorted(str(p.relative_to(run)) for p in run.rglob("*") if ckpt.CKPT_DIR not in p.parts)

    assert listing(runs / "ddp") == listing(runs / "single")
    assert json.loads((runs / "ddp" / "config.json").read_text())["train"]["parallel"] == "ddp"
    for path in ckpt.list_checkpoints(runs / "fsdp"):
        found = ckpt.read_checkpoint(path)
        assert found.sharded and sorted(p.name for p in path.iterdir()) == [ckpt.SHARDS, "state.json"]
        shards = sorted(p.name for p in (path / ckpt.SHARDS).iterdir())
        assert [s[:12] for s in shards] == ["shard-00001-", "shard-00002-"]  # one file per rank
        assert sorted(found.state["files"]) == [f"{ckpt.SHARDS}/{s}" for s in shards]


def test_a_sharded_checkpoint_is_restored_bit_for_bit_on_any_number_of_ranks(runs, tmp_path):
    """The 2-rank FSDP checkpoint of step 3, restored on 2 FSDP ranks, on 2 DDP ranks and in one process and
    written again, holds the same tensors, bit for bit (the 2-rank ones as shards again)."""
    original = tensors_of(ckpt.checkpoint_dir(runs / "fsdp", 3))
    assert original.keys() == final(runs / "single").keys()  # every weight and every AdamW tensor
    one = cut_at(runs / "fsdp", tmp_path / "one", 3)
    trainer = Trainer(Config.from_json_file(one / "config.json"), one, resume=True, callbacks=[])
    trainer.save()
    trainer.close()
    assert not ckpt.newest_checkpoint(one).sharded
    written = (ckpt.checkpoint_dir(runs / "fsdp", 3) / "state.json").stat().st_mtime_ns  # copies keep it
    for run in (runs / "fsdp-resaved", runs / "fsdp-resaved@ddp", one):
        found = ckpt.newest_checkpoint(run)
        assert found.step == 3 and found.sharded == (run != one)
        assert (found.path / "state.json").stat().st_mtime_ns != written  # written again, not left as copied
        assert same(final(run), original), run.name


def test_sharded_resume_is_exact(runs):
    """A 2-rank FSDP run cut after its sharded checkpoint and resumed on 2 ranks ends bit-identical."""
    assert ckpt.newest_checkpoint(runs / "fsdp-resumed").sharded
    assert same(final(runs / "fsdp-resumed"), final(runs / "fsdp"))
    assert [r["step"] for r in records(runs / "fsdp-resumed")] == [r["step"] for r in records(runs / "fsdp")]


def test_an_altered_shard_is_refused_on_every_rank_with_one_line(runs):
    run = runs / "fsdp-corrupt"
    messages = {(run / f"refused-{r}.txt").read_text() for r in range(2)}
    assert len(messages) == 1  # the same line on both ranks
    shard = next((ckpt.checkpoint_dir(run, 3) / ckpt.SHARDS).glob("shard-00002-*"))
    assert f"{shard} does not match its checksum" in messages.pop()
    assert ckpt.newest_checkpoint(run, verify=False).step == 3  # refused, not skipped: nothing was removed
    with pytest.raises(CheckpointError, match="shard-00002-.* does not match its checksum"):
        smallinit.load_model(run)  # one process too


def test_resume_two_ranks_on_one(runs, tmp_path):
    """A DDP checkpoint continues in one process (which ignores train.parallel) to the same result."""
    run = cut_at(runs / "ddp", tmp_path / "run", 3)
    Trainer(Config.from_json_file(run / "config.json"), run, resume=True, callbacks=[]).fit()
    assert max_abs_diff(final(run), final(runs / "ddp")) < ATOL
    assert [r["step"] for r in records(run)] == [r["step"] for r in records(runs / "ddp")]


def test_resume_one_process_on_two_fsdp_ranks(runs):
    assert max_abs_diff(final(runs / "single-to-fsdp"), final(runs / "single")) < ATOL


def test_ddp_resume_is_exact(runs):
    """A 2-rank DDP run killed after a checkpoint and resumed on 2 ranks ends bit-identical, same log."""
    run = runs / "ddp-resumed"
    a, b = final(run), final(runs / "ddp")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def without_speed(run: Path) -> list[dict]:  # tokens/s is a wall-clock measurement
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records(run)]

    assert without_speed(run) == without_speed(runs / "ddp")


def test_crash_of_one_rank_ends_the_job(tmp_path):
    start = time.monotonic()
    r = torchrun(
        WORKER, "crash", tmp_path / "run", "--", *TINY, "train.steps=50", "train.parallel=ddp", timeout=180
    )
    elapsed = time.monotonic() - start
    assert r.returncode != 0
    assert "rank 1 fails on purpose" in r.stderr
    assert elapsed < 120, f"the job took {elapsed:.0f} s to end after rank 1 crashed"


def test_bad_input_fails_on_every_rank_with_one_line(tmp_path):
    run = tmp_path / "run"
    r = torchrun(
        "-m", "smallinit", "train", "--out", run, *sets(*TINY, "train.batch_size=6", "train.parallel=fsdp")
    )
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if "smallinit: error:" in line]
    assert len(errors) == 2 and errors[0] == errors[1], r.stderr[-3000:]
    assert "train.batch_size=6" in errors[0]
    assert (
        str(Path(smallinit.__file__).parent) not in r.stderr
    )  # no traceback from the ranks (torchrun prints its own)
    assert not run.exists()


@pytest.mark.parametrize("damage", ["extra shard", "missing shard", "path outside"])
def test_a_sharded_checkpoint_with_a_file_too_many_or_too_few_is_refused(runs, tmp_path, damage):
    """DCP's reader takes every safetensors file in the shard folder: the folder must hold what state.json lists."""
    run = cut_at(runs / "fsdp", tmp_path / "run", 3)
    path = ckpt.checkpoint_dir(run, 3)
    first = next((path / ckpt.SHARDS).glob("shard-00001-*"))
    if damage == "extra shard":
        shutil.copy(first, path / ckpt.SHARDS / "shard-00003-model-00001-of-00001.safetensors")
        expected = "shard-00003-.* which its state.json does not list"
    elif damage == "missing shard":
        first.unlink()
        expected = f"lacks {ckpt.SHARDS}/{first.name}; it is incomplete"
    else:
        state = json.loads((path / "state.json").read_text())
        state["files"]["../x.safetensors"] = state["files"].pop(f"{ckpt.SHARDS}/{first.name}")
        (path / "state.json").write_text(json.dumps(state))
        expected = "lists files outside shards/"
    with pytest.raises(CheckpointError, match=expected):
        smallinit.load_model(run)


# -- in-process checks of the pieces ------------------------------------------------------------------------


def test_layout_checks():
    tc = Config.load(overrides=TINY).train
    with pytest.raises(ConfigError, match="train.parallel=none"):
        check_layout(tc, 2)
    tc.parallel = "ddp"
    check_layout(tc, 2)  # 8 rows = 2 ranks × 2 micro-batches × 2
    with pytest.raises(ConfigError, match="multiple of 6"):
        check_layout(tc, 3)


def test_one_process_without_torchrun_trains_locally(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    tc = Config.load(overrides=[*TINY, "train.parallel=fsdp", "train.device=cpu"]).train
    assert Runtime.from_env(tc) == Runtime(torch.device("cpu"))


def test_layout_keys_may_change_on_resume():
    a = Config.load(overrides=TINY).to_dict()
    b = Config.load(overrides=[*TINY, "train.parallel=fsdp", "train.activation_checkpointing=true"]).to_dict()
    assert with_layout_of(b, a) == a
    c = Config.load(overrides=[*TINY, "train.parallel=fsdp", "train.lr=1e-2"]).to_dict()
    assert with_layout_of(c, a) != a


@pytest.mark.parametrize("rows", [8, 3])
def test_eval_pieces_cover_each_row_once(rows):
    x = torch.arange(rows)[:, None].repeat(1, 4)
    seen, forwards = [], []
    for rank in range(2):
        pieces = list(eval_pieces(x, x + 1, Runtime(torch.device("cpu"), rank, 2), 2))
        forwards.append(len(pieces))
        seen += [int(v) for xp, _, n in pieces if n for v in xp[:, 0]]
    assert forwards == [2, 2]  # every rank runs the same number of forwards
    assert sorted(seen) == list(range(rows))


def test_activation_checkpointing_gives_the_same_gradients():
    cfg = Config.load(overrides=TINY)
    cfg.model.vocab_size = 257
    grads = []
    for ac in (False, True):
        cfg.train.activation_checkpointing = ac
        model = Transformer(cfg.model, seed=0)
        engine = parallelize(model, Runtime(torch.device("cpu")), cfg.train)
        x = torch.randint(0, 257, (2, 16), generator=torch.Generator().manual_seed(0))
        engine(x, x).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-7, msg=n)


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc; zombies count as gone)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (name)": state, ppid, ...
        except (OSError, IndexError):
            continue  # ended meanwhile
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_killing_the_launcher_stops_the_workers_and_leaves_a_resumable_run(tmp_path):
    """kill -9 of torchrun: each worker notices its parent is gone, checkpoints the step in flight and exits;
    the run folder holds intact checkpoints and nothing half-written, and resumes from that step."""
    run = tmp_path / "run"
    args = sets(
        *TINY,
        "train.parallel=ddp",
        "train.steps=100000",
        "train.checkpoint_every=0",
        "train.eval_every=0",
        "train.schedule=constant",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    with open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(
            [*launcher, "-m", "smallinit", "train", "--out", str(run), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    workers: list[int] = []
    try:
        deadline = time.time() + 300
        while not (run / "metrics.jsonl").exists() or len(records(run)) < 3:
            assert time.time() < deadline and proc.poll() is None, (tmp_path / "err.txt").read_text()[-3000:]
            time.sleep(0.05)
        workers = children(proc.pid)
        assert len(workers) == 2
        proc.kill()  # SIGKILL: the launcher forwards nothing
        proc.wait()
        gone_by = time.time() + 60  # a step, a checkpoint, then exit; torchrun's own grace is 30 s
        while any(map(alive, workers)) and time.time() < gone_by:
            time.sleep(0.1)
        assert not any(map(alive, workers)), "the workers outlived their launcher"
    finally:
        for pid in filter(alive, workers):
            os.kill(pid, signal.SIGKILL)
    assert not list((run / ckpt.CKPT_DIR).glob(".*")), "a half-written checkpoint was left"
    kept = ckpt.list_checkpoints(run)
    for path in kept:
        ckpt.read_checkpoint(path)  # every file matches its checksum
    stopped = ckpt.newest_checkpoint(run).step
    assert stopped == max(r["step"] for r in records(run)) < 100000  # the step in flight was saved
    resumed = Trainer(Config.from_json_file(run / "config.json"), run, resume=True, callbacks=[])
    try:
        assert resumed.step == stopped
    finally:
        resumed.close()


# -- slow ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_the_same_step_then_resume_is_exact(tmp_path):
    """torchrun forwards SIGTERM; the ranks agree on the stop step, checkpoint it, and resume bit-exactly."""
    args = sets(
        *TINY,
        "train.parallel=ddp",
        "train.steps=300",
        "train.checkpoint_every=0",
        "train.eval_every=0",
        "train.schedule=constant",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    full = subprocess.run(
        [*launcher, "-m", "smallinit", "train", "--out", str(tmp_path / "full"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert full.returncode == 0, full.stderr[-3000:]
    run = tmp_path / "stopped"
    proc = subprocess.Popen(
        [*launcher, "-m", "smallinit", "train", "--out", str(run), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").exists() or len(records(run)) < 3:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    stopped = ckpt.newest_checkpoint(run).step
    assert stopped == max(r["step"] for r in records(run)) < 300  # the step in flight was finished and saved
    assert err.count(f"at step {stopped}, checkpoint") == 2, err[-3000:]  # both ranks stopped there
    r = subprocess.run(
        [*launcher, "-m", "smallinit", "train", "--out", str(run), "--resume"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = final(run), final(tmp_path / "full")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_compile_per_block_matches_eager(tmp_path):
    base = [*TINY, "train.steps=3", "train.eval_every=0", "train.checkpoint_every=0"]
    Trainer(Config.load(overrides=base), tmp_path / "eager", callbacks=[]).fit()
    Trainer(Config.load(overrides=[*base, "train.compile=true"]), tmp_path / "compiled", callbacks=[]).fit()

    def losses(run: Path) -> list[float]:
        return [r["loss"] for r in records(run) if "loss" in r]

    assert len(losses(tmp_path / "eager")) == 3
    assert losses(tmp_path / "compiled") == pytest.approx(losses(tmp_path / "eager"), rel=1e-4)


@pytest.mark.slow
def test_no_rank_holds_the_whole_state_while_saving(tmp_path):
    """2 FSDP2 ranks save a 60 M-parameter model: no rank's resident memory grows by more than a quarter of
    the whole state (fp32 weights and AdamW moments, 12 bytes per parameter) while it writes its shard."""
    script = Path(__file__).parents[2] / "benchmarks" / "checkpoint_memory.py"
    out = tmp_path / "memory.json"
    widen = sets("model.d_model=768", "model.d_ff=2048")
    r = torchrun(script, "--out", tmp_path / "run", *widen, "--json", out, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    whole_gib = 12 * result["params"] / 2**30
    grown = [rank["peak_gib"] - rank["rss_before_gib"] for rank in result["ranks"]]
    assert max(grown) < 0.25 * whole_gib, (grown, whole_gib)


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_on_one_rank_as_in_one_process(runs, tmp_path):
    """The 2-rank FSDP2 checkpoint of step 3 continued by torchrun with one process ends bit-identical to the
    same checkpoint continued in this process (one rank is one process), and near the 2-rank run."""
    one_rank, here = (
        cut_at(runs / "fsdp", tmp_path / "one-rank", 3),
        cut_at(runs / "fsdp", tmp_path / "here", 3),
    )
    r = torchrun("-m", "smallinit", "train", "--out", one_rank, "--resume", ranks=1)
    assert r.returncode == 0, r.stderr[-3000:]
    Trainer(Config.from_json_file(here / "config.json"), here, resume=True, callbacks=[]).fit()
    assert not ckpt.newest_checkpoint(one_rank).sharded
    assert same(final(one_rank), final(here))
    assert max_abs_diff(final(here), final(runs / "fsdp")) < ATOL


def test_bf16_is_one_numerical_model_in_every_layout(tmp_path):
    """Under bf16 autocast, FSDP2 on 2 ranks runs the model one process runs: the residual stream and the RoPE
    tables stay fp32 in every block, and the losses differ by the reduction order, far less than fp32 against
    bf16 in one process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dist_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    base = [*TINY, "train.steps=4", "train.eval_every=0", "train.checkpoint_every=0"]
    bf16 = [*base, "train.precision=bf16"]
    trainer = Trainer(Config.load(overrides=bf16), tmp_path / "single", callbacks=[])
    seen = worker.record_dtypes(trainer)
    trainer.fit()
    Trainer(Config.load(overrides=[*base, "train.precision=fp32"]), tmp_path / "fp32", callbacks=[]).fit()
    r = torchrun(WORKER, "dtypes", tmp_path / "fsdp", "--", *bf16, "train.parallel=fsdp")
    assert r.returncode == 0, r.stderr[-3000:]

    def losses(run: Path) -> list[float]:
        return [r["loss"] for r in records(run) if "loss" in r]

    single, layouts = losses(tmp_path / "single"), losses(tmp_path / "fsdp")
    precision_gap = max(abs(a - b) for a, b in zip(single, losses(tmp_path / "fp32")))
    layout_gap = max(abs(a - b) for a, b in zip(single, layouts))
    print(f"bf16 loss gap: FSDP2 × 2 vs one process {layout_gap:.2e}; fp32 vs bf16 {precision_gap:.2e}")
    fsdp = json.loads((tmp_path / "fsdp" / "dtypes.json").read_text())
    assert (
        fsdp
        == {k: sorted(v) for k, v in seen.items()}
        == {
            "h_in": ["torch.float32"],
            "rope": ["torch.float32"],
            "h_out": ["torch.float32"],
        }
    )

    assert len(single) == len(layouts) == 4
    assert layout_gap < precision_gap
