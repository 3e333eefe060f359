"""transformers' Trainer on the tiny Qwen3, watched by smallinit."""

from __future__ import annotations

import pytest
import torch

from support.monitor import tiny_qwen3, tokens

transformers = pytest.importorskip("transformers")


class Rows(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def hf_trainer(out, max_steps: int, callbacks=()):
    from smallinit.integrations.hf import model_init, watch

    config = tiny_qwen3().config
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=3e-3,
        eval_strategy="steps",
        eval_steps=30,
        logging_steps=10,
        save_steps=50,
        report_to=["tensorboard"],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(
        model_init=model_init(config, gamma=1.0),
        args=args,
        train_dataset=Rows(tokens(2000, seed=2)),
        eval_dataset=Rows(tokens(8, seed=1)),
        callbacks=list(callbacks),
    )
    watch(trainer, every=20)
    return trainer
