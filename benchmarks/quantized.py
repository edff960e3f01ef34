"""Quantized models and adapters (rows 22-24): a quantized pull against torchao's own load of
the same weights, an adapter pull against its base's, and what an adapter version stores against
its tensors."""

from __future__ import annotations

import shutil
import warnings
from typing import Any

import torch

from registry.formats.peft import replay as peftreplay

from .helpers import FACTORY, Bench, Case, build, duration, interleaved, kwargs, meta_module, touch
from .report import Row


def touch_quantized(module: torch.nn.Module) -> int:
    """Read every byte of a module whose weights may be tensor subclasses: each torchao
    tensor through its plain components (``qdata``, ``scale``...), the same for both sides."""
    plain: list[torch.Tensor] = []
    for value in module.state_dict().values():
        names = getattr(value, "tensor_data_names", None)
        if names is None:
            plain.append(value)
            continue
        optional = list(getattr(value, "optional_tensor_data_names", None) or [])
        plain += [getattr(value, n) for n in [*names, *optional]
                  if getattr(value, n, None) is not None]
    return touch(plain)


def quantized_rows(b: Bench) -> list[Row]:
    rows: list[Row] = []
    try:
        rows.append(_int8_pull(b))
    except ImportError as exc:
        row = Row(22, "pull of an int8 weight-only model to CPU", "torchao's own load", "")
        row.notes.append(f"torchao is not installed ({exc}): pip install 'registry[quant]'.")
        rows.append(row)
    try:
        rows += _adapter_rows(b)
    except ImportError as exc:
        for n in (23, 24):
            row = Row(n, "LoRA adapter", "", "")
            row.notes.append(f"peft is not installed ({exc}): pip install 'registry[peft]'.")
            rows.append(row)
    return rows


def _int8_pull(b: Bench) -> Row:
    from safetensors.torch import load_file, save_file
    from torchao.prototype.safetensors.safetensors_support import (
        flatten_tensor_state_dict,
        unflatten_tensor_state_dict,
    )
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    net = build(b.size)
    quantize_(net, Int8WeightOnlyConfig())
    mv = b.reg.push(net, "bench-int8", factory=FACTORY, factory_kwargs=kwargs(b.size))
    flat, metadata = flatten_tensor_state_dict(net.state_dict())
    path = b.scratch("int8.safetensors")
    save_file(flat, str(path), metadata=metadata)

    def torchao_load() -> int:
        # What torchao's safetensors support gives a user: load, unflatten, assign on meta.
        target = meta_module(b.size)
        state, _ = unflatten_tensor_state_dict(load_file(str(path)), metadata)
        target.load_state_dict(state, assign=True)
        return touch_quantized(target)

    t = interleaved({
        "torchao": Case(torchao_load),
        "pull": Case(lambda: touch_quantized(b.reg.pull(mv.ref, device="cpu"))),
    }, runs=b.runs)
    path.unlink()
    pull, peer = t["pull"].median, t["torchao"].median
    stored = mv.metadata["source"]["size_bytes"]
    row = Row(22, "pull of an int8 weight-only model to CPU, module ready, every byte read",
              "torchao's own load of the same weights from safetensors (load_file + "
              "unflatten_tensor_state_dict + assign on meta)", "<= 1.1x")
    row.measured = f"pull {duration(pull)}, torchao {duration(peer)} ({stored / 1e6:.0f} MB stored)"
    row.ratio = f"{pull / peer:.2f}x"
    row.ok = pull / peer <= 1.1
    row.notes.append(f"Samples (s): pull {t['pull'].spread()}, torchao {t['torchao'].spread()}.")
    return row


def _adapter_rows(b: Bench) -> list[Row]:
    import peft

    base = build(b.size)
    config = peft.LoraConfig(r=8, target_modules=["up", "down"], init_lora_weights=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned: Any = peft.get_peft_model(base, config)
    mv = b.reg.push(tuned, "bench-lora", base=b.ref)
    # PEFT's own load of the same adapter, over the same base pull: the directory the registry
    # writes for PeftModel.from_pretrained (adapter_config.json, adapter_model.safetensors).
    adapter_dir = b.reg.save_pretrained(mv.ref, b.scratch("bench-lora"))

    def peft_load() -> int:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = peft.PeftModel.from_pretrained(b.reg.pull(b.ref, device="cpu"),
                                                   str(adapter_dir), low_cpu_mem_usage=True)
        return touch_quantized(model)

    def first_pull() -> int:
        # The first pull of the adapter in a process: PEFT attaches it (the second pull
        # records that, and the later ones replay it: registry/formats/peft/replay.py).
        peftreplay.forget()
        return touch_quantized(b.reg.pull(mv.ref, device="cpu"))

    b.reg.pull(b.ref, device="cpu")  # the base is in the store and the page cache
    t = interleaved({
        "base": Case(lambda: touch_quantized(b.reg.pull(b.ref, device="cpu"))),
        "adapter": Case(lambda: touch_quantized(b.reg.pull(mv.ref, device="cpu"))),
        "peft": Case(peft_load),
    }, runs=b.runs)
    # Apart: forgetting the recipe would make the next adapter pull above record it again.
    once = interleaved({
        "base": Case(lambda: touch_quantized(b.reg.pull(b.ref, device="cpu"))),
        "first": Case(first_pull),
    }, runs=b.runs)
    shutil.rmtree(adapter_dir)
    pull, alone, own = t["adapter"].median, t["base"].median, t["peft"].median
    row23 = Row(23, "pull of base + LoRA adapter (base cached), every byte read",
                "pull of the base alone", "<= 1.1x")
    first, base_then = once["first"].median, once["base"].median
    row23.measured = (f"base + adapter {duration(pull)}, base {duration(alone)}; the first pull "
                      f"of the adapter in a process {duration(first)} against the base's "
                      f"{duration(base_then)} ({first / base_then:.2f}x); "
                      f"PEFT's own load over the base pull: {duration(own)} (adapter pull / "
                      f"that = {pull / own:.2f}x)")
    row23.ratio = f"{pull / alone:.2f}x"
    row23.ok = pull / alone <= 1.1
    row23.notes.append(f"Samples (s): base + adapter {t['adapter'].spread()}, base "
                       f"{t['base'].spread()}, first in a process {once['first'].spread()}, PEFT's "
                       f"own load {t['peft'].spread()}. r=8 on "
                       f"every up/down Linear ({2 * b.size.blocks}). PEFT's own load is the "
                       "base pull plus `PeftModel.from_pretrained(base, dir, "
                       "low_cpu_mem_usage=True)` of the directory `save_pretrained` writes for "
                       "the adapter version, read the same way: what a user gets from PEFT "
                       "itself, which also runs the layers' init and loads through walks of "
                       "the whole state dict that the pull skips. The difference to the base "
                       "alone is attaching the adapter: PEFT's `get_peft_model` on the first "
                       "pull (on meta, init skipped, one LoRA layer built per kind and copied "
                       "for the rest: peft/copies.py), recorded then and replayed on every "
                       "later pull of the same base and adapter (peft/replay.py: 4.3 -> 0.9 ms "
                       "for the 12 Linears), then the registry's own work (resolving the base, "
                       "reading the 3.9 MB adapter shard, checks, assigning the tensors, eval "
                       "mode, ~1.5 ms): Python on the pulling thread, while reading the 806 MB "
                       "after it (30-70 ms here, by the day) is bound by memory bandwidth. The "
                       "base's prefault waits until the adapter is attached (prefault.held). "
                       "The adapter's bytes are read as the base's are.")

    lora = peft.get_peft_model_state_dict(tuned)
    tensor_bytes = sum(v.numel() * v.element_size() for v in lora.values())
    stored = sum(f["size"] for f in mv.metadata["files"])
    row24 = Row(24, "stored bytes of an adapter version", "its adapter tensors' bytes",
                "<= 1.05x")
    row24.measured = f"stored {stored:,} B, tensors {tensor_bytes:,} B"
    row24.ratio = f"{stored / tensor_bytes:.3f}x"
    row24.ok = stored / tensor_bytes <= 1.05
    return [row23, row24]
