"""Run by tests/integrations/test_engines.py under torchrun (gloo, 2 ranks) or alone: γ-init inside the pretraining
engines on sharded parameters, checked against the draw of one process on the unsharded model.

    torchrun --nproc_per_node 2 tests/_engines_worker.py titan OUT   # torchtitan, fully_shard and not
    torchrun --nproc_per_node 2 tests/_engines_worker.py olmo OUT        # OLMo-core's Trainer + the callback
    torchrun --nproc_per_node 2 tests/_engines_worker.py titan_gate OUT  # torchtitan gated, trained sharded
    torchrun --nproc_per_node 2 tests/_engines_worker.py titan_monitor_order OUT  # the Monitor before the optimizer
    torchrun --nproc_per_node 2 tests/_engines_worker.py litgpt_meta_fsdp OUT  # litgpt gated on meta, FSDP1

Each writes OUT/ok.json on rank 0: the parameters that, gathered, differ from the unsharded draw."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from smallinit import add_attention_gate_, gamma_init_


def titan_model(shard: bool, gate: bool = False):
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    from smallinit.integrations.titan import gamma_param_init

    config = model_registry("debugmodel").model
    config.layers = config.layers[:2]
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    gamma_param_init(config, gamma=1.0, seed=0)
    with torch.device("meta"):
        model = config.build()
    if gate:  # before sharding: W_θ is one more weight of each block, sharded with it
        add_attention_gate_(model, "elementwise", 1.0, generator=torch.Generator().manual_seed(2))
    if shard:
        fully_shard_all(model, list(model.layers.values()))
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights()
    return model


def fully_shard_all(model, blocks) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def params(model) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for n, p in model.named_parameters()
    }


def titan(out: Path) -> None:
    """torchtitan's init_weights() through gamma_param_init, then gamma_init_ after it, on 2 ranks: both
    equal the draws of the unsharded model (built in the same process, on no mesh)."""
    dist.init_process_group("gloo")
    draws, sharded = {}, []
    for shard in (True, False):
        model = titan_model(shard)
        draws[shard, "param_init"] = params(model)
        gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
        draws[shard, "gamma_init"] = params(model)
        sharded += [n for n, p in model.named_parameters() if hasattr(p, "full_tensor")]
    differ = [
        f"{way}:{n}"
        for way in ("param_init", "gamma_init")
        for n, p in draws[True, way].items()
        if not torch.equal(p, draws[False, way][n])
    ]
    if dist.get_rank() == 0:
        torch.save(draws[False, "param_init"], out / "titan.pt")
        (out / "ok.json").write_text(json.dumps({"differ": differ, "sharded": sharded}))
    dist.destroy_process_group()


def olmo(out: Path) -> None:
    """OLMo-core's Trainer, FSDP on 2 ranks, with SmallinitCallback: the weights at the start of the fresh
    run (read by a callback that runs after it) equal gamma_init_ of the unsharded model in one process."""
    import numpy as np
    from olmo_core.data import NumpyDataLoaderConfig, NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.distributed.parallel import DataParallelType
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig
    from olmo_core.train import Duration, TrainerConfig
    from olmo_core.train.callbacks import Callback
    from olmo_core.train.train_module import TransformerDataParallelConfig, TransformerTrainModuleConfig

    from smallinit.integrations.olmo import SmallinitCallback

    dist.init_process_group("gloo")
    data = np.random.default_rng(0).integers(2, 256, size=(40, 16)).astype(np.uint16)
    if dist.get_rank() == 0:
        data.tofile(out / "train.npy")
    dist.barrier()
    config = TransformerConfig.olmo2_1M(vocab_size=256)
    tokenizer = TokenizerConfig(vocab_size=256, eos_token_id=0, pad_token_id=1)
    dataset = NumpyFSLDatasetConfig(
        paths=[str(out / "train.npy")], tokenizer=tokenizer, sequence_length=16, work_dir=str(out / "work")
    ).build()
    loader = NumpyDataLoaderConfig(global_batch_size=4 * 16, seed=0, work_dir=str(out / "work")).build(
        dataset, dp_process_group=dist.group.WORLD
    )
    train_module = TransformerTrainModuleConfig(
        rank_microbatch_size=2 * 16,
        max_sequence_length=16,
        optim=AdamWConfig(lr=3e-3),
        dp_config=TransformerDataParallelConfig(name=DataParallelType.fsdp),
    ).build(config.build(init_device="meta"), device=torch.device("cpu"))
    seen = {}

    class Weights(Callback):
        priority = -1  # after SmallinitCallback's pre_train

        def pre_train(self):
            seen.update(params(self.trainer.train_module.model))

    callback = SmallinitCallback(
        gamma=1.0, seed=0, every=1, batch=torch.from_numpy(data[:2].astype(np.int64))
    )
    TrainerConfig(
        save_folder=str(out / "run"),
        save_overwrite=True,
        no_checkpoints=True,
        max_duration=Duration.steps(2),
        callbacks={"smallinit": callback, "weights": Weights()},
    ).build(train_module, loader).fit()
    one = config.build(init_device="cpu")
    gamma_init_(one, 1.0, generator=torch.Generator().manual_seed(0))
    differ = [n for n, p in one.named_parameters() if not torch.equal(p.detach(), seen[n])]
    sharded = [n for n, p in train_module.model.named_parameters() if hasattr(p, "full_tensor")]
    if dist.get_rank() == 0:
        (out / "ok.json").write_text(json.dumps({"differ": differ, "sharded": sharded}))
    dist.destroy_process_group()


def titan_gate(out: Path) -> None:
    """torchtitan's model with the paper's gate, built on meta, fully_shard on 2 ranks, γ-initialised, 20
    AdamW steps on the same batches on every rank: the losses, and W_θ gathered, are those of the unsharded
    gated model trained in one process."""
    dist.init_process_group("gloo")
    losses, gates, documented = {}, {}, {}
    for shard in (True, False):
        model = titan_model(shard, gate=True)
        documented[shard] = {n: p for n, p in params(model).items() if ".g_proj." in n}  # init_weights() drew
        gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        x = torch.randint(0, 2048, (2, 17), generator=torch.Generator().manual_seed(1))  # one batch, learnt
        losses[shard] = []
        for _ in range(20):
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[shard].append(loss.item())
        gates[shard] = {n: p for n, p in params(model).items() if ".g_proj." in n}
    if dist.get_rank() == 0:
        torch.save({"losses": losses, "gates": gates, "documented": documented}, out / "titan_gate.pt")
    dist.destroy_process_group()


def titan_monitor_order(out: Path) -> None:
    """torchtitan's model under fully_shard trained 5 AdamW steps with no Monitor, with one built before the
    optimizer and with one built after it (each measuring at steps 0 and 5): the losses and the weights, gathered."""
    from smallinit import Monitor

    dist.init_process_group("gloo")
    x = torch.randint(0, 2048, (2, 17), generator=torch.Generator().manual_seed(1))
    runs = {}
    for order in ("none", "monitor-first", "optimizer-first"):
        model = titan_model(shard=True)
        monitor = None
        if order == "monitor-first":
            monitor = Monitor(model, every=5, batch=x[:1], out=out / order)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        if order == "optimizer-first":
            monitor = Monitor(model, every=5, batch=x[:1], out=out / order)
        losses = []
        for step in range(6):
            if monitor is not None:
                monitor(step)
            if step == 5:
                break
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        if monitor is not None:
            monitor.close()
        runs[order] = {"losses": losses, "weights": params(model)}
    if dist.get_rank() == 0:
        torch.save(runs, out / "titan_monitor_order.pt")
    dist.destroy_process_group()


def litgpt_meta_fsdp(out: Path) -> None:
    """litgpt's GPT built on meta with both fixes, its reset_parameters hooked by the γ rule (what
    `initialize_weights` does under Fabric's FSDP, which needs a GPU), then materialised by torch's FSDP1 on 2 ranks,
    which calls them as Fabric's FSDP does: the weights gathered, and the losses of 5 AdamW steps."""
    from litgpt import GPT, Config
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from smallinit import set_norm_eps_
    from smallinit.integrations.litgpt import hook_reset_parameters

    dist.init_process_group("gloo")
    config = Config(
        block_size=64, vocab_size=256, padded_vocab_size=256, n_layer=2, n_head=4, n_query_groups=2, n_embd=32,
        intermediate_size=64, bias=False, norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP",
        parallel_residual=False,
    )  # fmt: skip
    with torch.device("meta"):
        model = GPT(config)
    set_norm_eps_(model, 1e-12)
    add_attention_gate_(model, "elementwise", 1.0, example_inputs=None)
    hook_reset_parameters(model, gamma=1.0, seed=0)
    model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    x = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    with FSDP.summon_full_params(model):
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if dist.get_rank() == 0:
        torch.save({"weights": weights, "losses": losses}, out / "litgpt_meta_fsdp.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    what, folder = sys.argv[1], Path(sys.argv[2])
    {
        "olmo": olmo,
        "titan": titan,
        "titan_gate": titan_gate,
        "titan_monitor_order": titan_monitor_order,
        "litgpt_meta_fsdp": litgpt_meta_fsdp,
    }[what](folder)
