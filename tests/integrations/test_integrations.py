"""smallinit inside the engines people train with, run for real: transformers' Trainer (gradient accumulation,
evaluations, TensorBoard, resume from its checkpoint) and Lightning, each followed by `smallinit report`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from smallinit.monitor.runs import find_runs
from smallinit.report import build_report
from support.monitor import records, tiny_qwen3, tokens
from support.trainers import hf_trainer

transformers = pytest.importorskip("transformers")


class StopAt(transformers.TrainerCallback):
    """An interruption: training ends at ``step``, after the last checkpoint."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def tensorboard_steps(folder, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = []
    for events in folder.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            steps += [e.step for e in acc.Scalars(tag)]
    return sorted(steps)


def test_transformers_trainer_with_accumulation_evaluations_and_a_resume(tmp_path):
    out = tmp_path / "hf"
    hf_trainer(out, 100, callbacks=[StopAt(70)]).train()  # checkpoint-50 is the last one written
    assert [r["step"] for r in records(out / "smallinit")] == [0, 20, 40, 60]
    hf_trainer(out, 100).train(resume_from_checkpoint=True)
    recs = records(out / "smallinit")
    assert [r["step"] for r in recs] == [0, 20, 40, 60, 80, 100]  # 60 measured again after the resume, once
    assert recs[-1]["loss"] < recs[0]["loss"] - 1 and recs[0]["norm_factor"] and recs[0]["sink"]
    # the scalars went through the Trainer's own logging, so report_to's TensorBoard has them
    assert set(tensorboard_steps(out, "train/smallinit/residual_flow")) >= {0, 20, 40, 80, 100}
    (run,) = find_runs(out)
    assert run.config["engine"] == "transformers" and run.config["model.gamma"] == 1.0
    html = build_report(out).read_text()
    assert "Residual flow" in html and "Attention sink" in html


def test_lightning_callback(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from smallinit.integrations.lightning import SmallinitCallback

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_qwen3()

        def training_step(self, batch, _):
            return self.model(input_ids=batch, labels=batch).loss

        def validation_step(self, batch, _):
            self.log("val_loss", self.model(input_ids=batch, labels=batch).loss)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    loader = torch.utils.data.DataLoader(tokens(1000, seed=2), batch_size=4)
    held_out = torch.utils.data.DataLoader(tokens(8, seed=1), batch_size=4)
    logger = L.loggers.CSVLogger(tmp_path, name="csv")
    trainer = L.Trainer(
        max_steps=100,
        accumulate_grad_batches=2,
        accelerator="cpu",
        devices=1,
        logger=logger,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[SmallinitCallback(every=20, settings={"model.gamma": 1.0})],
    )
    trainer.fit(LM(), loader, held_out)
    recs = records(tmp_path / "smallinit")
    assert [r["step"] for r in recs] == [0, 20, 40, 60, 80, 100]
    assert recs[-1]["loss"] < recs[0]["loss"] - 1
    csv = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text()
    assert "smallinit/residual_flow" in csv.splitlines()[0]
    assert "Residual flow" in build_report(tmp_path).read_text()


@pytest.mark.parametrize(
    ("module", "engine", "extra"),
    [
        ("smallinit.integrations.hf", "transformers", "hf"),
        ("smallinit.integrations.lightning", "lightning", "lightning"),
        ("smallinit.integrations.titan", "torchtitan", "titan"),
        ("smallinit.integrations.olmo", "olmo_core", "olmo"),
        ("smallinit.integrations.litgpt", "litgpt", "litgpt"),
    ],
)
def test_an_integration_without_its_engine_names_the_extra(module, engine, extra):
    code = (
        f"import sys; sys.modules[{engine!r}] = None\n"  # the engine is not installed
        f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)"
    )
    line = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert line == (f"{module} needs {engine}, which is not installed: pip install 'smallinit[{extra}]'")
    # and the core stays importable without it
    code = f"import sys; sys.modules[{engine!r}] = None\nimport smallinit, smallinit.train; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "ok"
