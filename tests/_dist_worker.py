"""Run by tests/train/test_distributed.py under torchrun: real Trainers, with what the CLI cannot do.

    python -m torch.distributed.run --nproc_per_node 2 tests/_dist_worker.py JOB RUN [JOB RUN ...] -- KEY=VALUE ...

Jobs, run one after another in the same processes (JOB@LAYOUT sets train.parallel=LAYOUT for that job):
  init     new run; save a checkpoint at step 0 (the initial weights, gathered from every rank), then fit
  resume   continue the run in RUN (written by any number of ranks) to train.steps
  resave   restore the newest checkpoint of RUN and write it again (over itself), without training
  refuse   resume RUN expecting a CheckpointError; each rank writes its message to RUN/refused-RANK.txt
  crash    new run in which rank 1 raises at step 2
  dtypes   new run; rank 0 writes RUN/dtypes.json: the dtypes each block received and returned
"""

import gc
import json
import sys
from pathlib import Path

import torch.distributed as dist

from smallinit import Config
from smallinit.errors import CheckpointError
from smallinit.train import Callback, Trainer
from smallinit.train.distributed import shutdown


class CrashOnRank1(Callback):
    def on_step_end(self, trainer: Trainer, record: dict) -> None:
        if trainer.runtime.rank == 1 and trainer.step == 2:
            raise RuntimeError("rank 1 fails on purpose at step 2")


def record_dtypes(trainer: Trainer) -> dict[str, set[str]]:
    """Hooks on every block: the dtypes of the residual stream in and out, and of the RoPE tables."""
    seen: dict[str, set[str]] = {"h_in": set(), "rope": set(), "h_out": set()}

    def hook(_module, args, out) -> None:
        seen["h_in"].add(str(args[0].dtype))
        seen["rope"].update({str(args[1].dtype), str(args[2].dtype)})
        seen["h_out"].add(str(out[0].dtype))

    for block in trainer.model.blocks:
        block.register_forward_hook(hook)
    return seen


def main(argv: list[str]) -> None:
    split = argv.index("--")
    jobs, sets = argv[:split], argv[split + 1 :]
    for spec, run in zip(jobs[::2], jobs[1::2]):
        job, _, layout = spec.partition("@")
        run_job(
            job, Path(run), Config.load(overrides=[*sets, *([f"train.parallel={layout}"] if layout else [])])
        )
    # every trainer, its sharded model and the device mesh's groups are gone before the groups are destroyed:
    # a gloo group freed only at interpreter exit can abort the process ("terminate called without an active
    # exception") after all the work is done
    gc.collect()
    shutdown()


def run_job(job: str, run: Path, cfg: Config) -> None:
    if job == "init":
        trainer = Trainer(cfg, run, callbacks=[])
        trainer.save()
        trainer.fit()
    elif job == "resume":
        Trainer(cfg, run, resume=True, callbacks=[]).fit()
    elif job == "resave":
        trainer = Trainer(cfg, run, resume=True, callbacks=[])
        trainer.save()
        trainer.close()
    elif job == "refuse":
        try:
            Trainer(cfg, run, resume=True, callbacks=[]).fit()
        except CheckpointError as e:
            Path(run, f"refused-{dist.get_rank()}.txt").write_text(str(e))
        else:
            raise SystemExit(f"resuming {run} was not refused")
    elif job == "dtypes":
        trainer = Trainer(cfg, run, callbacks=[])
        seen = record_dtypes(trainer)
        trainer.fit()
        if trainer.runtime.is_main:
            (trainer.run_dir / "dtypes.json").write_text(json.dumps({k: sorted(v) for k, v in seen.items()}))
    elif job == "crash":
        Trainer(cfg, run, callbacks=[CrashOnRank1()]).fit()
    else:
        raise SystemExit(f"unknown job {job!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
