"""Why stored keys do not fit a module's: the sentence a pull's ``StateDictMismatchError`` ends
with. A prefix or suffix that maps one key set onto the other is named before another
architecture is suggested, because a wrapper (DataParallel's ``module.``, ``torch.compile``'s
``_orig_mod.``), a model nested under an attribute, or a parametrization renaming ``weight``
causes most mismatches, and each has a one-line fix.
"""

from __future__ import annotations

from collections import Counter

_WRAPPERS = (
    ("module.", "DataParallel/DistributedDataParallel", "model.module"),
    ("_orig_mod.", "torch.compile", "model._orig_mod (compile after pulling)"),
    ("_fsdp_wrapped_module.", "FullyShardedDataParallel", "the unwrapped model"),
    ("_checkpoint_wrapped_module.", "activation checkpointing", "the unwrapped model"),
)


def likely_cause(model_keys: list[str], stored_keys: list[str]) -> str:
    """One sentence on what explains the difference between the two key sets."""
    for prefix, wrapper, fix in _WRAPPERS:
        if model_keys and all(k.startswith(prefix) for k in model_keys):
            return (f"Likely cause: the model you passed is wrapped in {wrapper} (its keys start "
                    f"with {prefix!r}); pass {fix} instead")
    model, stored = set(model_keys), set(stored_keys)
    missing = [k for k in model_keys if k not in stored]
    unexpected = [k for k in stored_keys if k not in model]
    extra = _prefix(missing, stored)
    if extra:
        prefix, example = extra
        head = prefix.rstrip(".")
        return (f"Likely cause: the model you passed nests the network under {head!r} "
                f"(e.g. {prefix + example!r} vs stored {example!r}); pass model.{head}")
    extra = _prefix(unexpected, model)
    if extra:
        prefix, example = extra
        return (f"Likely cause: the stored keys carry the prefix {prefix!r} that the model's "
                f"lack (e.g. stored {prefix + example!r} vs model {example!r}): they were "
                "pushed from a wrapper or a parent module; push the unwrapped model again, or "
                f"pull with pull_state_dict and strip {prefix!r}")
    ends = _suffix(missing, unexpected)
    if ends:
        model_end, stored_end, example = ends
        return (f"Likely cause: the keys differ at their ends: the model has {model_end!r} where "
                f"the stored weights have {stored_end!r} (e.g. {example!r}); a parametrization "
                "(weight_norm, spectral_norm, parametrize) or a renamed attribute: build the "
                "model as it was when pushed")
    return "Likely cause: the model's architecture or configuration differs from the one pushed"


def _prefix(keys: list[str], others: set[str]) -> tuple[str, str] | None:
    """The leading parts whose removal turns most of ``keys`` into keys of ``others``, with
    an example key (after removal); None when no prefix explains at least half of them."""
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for key in keys:
        parts = key.split(".")
        for cut in range(1, len(parts)):
            rest = ".".join(parts[cut:])
            if rest in others:
                prefix = ".".join(parts[:cut]) + "."
                counts[prefix] += 1
                examples.setdefault(prefix, rest)
    if not counts:
        return None
    prefix, hits = counts.most_common(1)[0]
    return (prefix, examples[prefix]) if hits * 2 >= len(keys) else None


def _suffix(missing: list[str], unexpected: list[str]) -> tuple[str, str, str] | None:
    """The ends (after the longest common module path) that most missing and unexpected keys
    of one module differ by: ``("weight_orig", "weight", "fc.weight")``."""
    by_module: dict[str, list[str]] = {}
    for key in unexpected:
        by_module.setdefault(key.rpartition(".")[0], []).append(key)
    counts: Counter[tuple[str, str]] = Counter()
    examples: dict[tuple[str, str], str] = {}
    for key in missing:
        parts = key.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            if module in by_module:
                model_end = ".".join(parts[cut:])
                for stored in by_module[module]:
                    pair = (model_end, stored[len(module) + 1:])
                    counts[pair] += 1
                    examples.setdefault(pair, stored)
                break
    if not counts:
        return None
    (model_end, stored_end), hits = counts.most_common(1)[0]
    if hits * 2 < max(len(missing), len(unexpected)):
        return None
    return model_end, stored_end, examples[(model_end, stored_end)]
