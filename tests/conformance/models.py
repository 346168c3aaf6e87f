#!/usr/bin/env python
"""Conformance sweep: every transformers model architecture on the tpu device vs the CPU.

For each model type known to transformers' auto mappings, build the model offline from its
config class (random weights, nothing is downloaded), shrunk to a few million parameters,
run forward (and backward on a scalar made from the float outputs) on the CPU and on tpu,
and compare. Each architecture runs in its own subprocess (timeout per arch), one at a time.

    python tests/conformance/models.py [--only llama,bert] [--limit N] [--skip N]
                                       [--json out.json] [--timeout 60] [-v]

Per architecture the record holds: built (and the shrink level used, or the reason it could
not be built), forward match (max abs diff vs CPU, tolerance rtol*max(1,|cpu|max)), backward
ran (and gradient match), the CPU-fallback ops used (torch_tpu.fallback_counts()), and any
exception (type + first line) with the stage it happened in.

Categories: native (match, zero fallbacks), fallback (match, some fallbacks), mismatch,
raise (tpu side raised), crash / timeout (subprocess died / hung), cannot_build.
"""
import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
RTOL = 1e-3
MAX_PARAMS = 60_000_000          # above this a level is skipped (too slow for the per-arch timeout)
BATCH, SEQ, DEC_SEQ = 2, 16, 8

# --------------------------------------------------------------------------------------------
# architecture list (main process)
# --------------------------------------------------------------------------------------------

# head mappings, in order of preference, for model types that have no base-model mapping
_HEAD_PREF = ["MODEL_FOR_CAUSAL_LM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM", "MODEL_FOR_IMAGE_TEXT_TO_TEXT",
              "MODEL_FOR_MULTIMODAL_LM", "MODEL_FOR_BACKBONE", "MODEL_FOR_IMAGE_CLASSIFICATION",
              "MODEL_FOR_DEPTH_ESTIMATION", "MODEL_FOR_SPEECH_SEQ_2_SEQ", "MODEL_FOR_PRETRAINING"]


def arch_table():
    """model_type -> (model class name, mapping it came from)."""
    import transformers.models.auto.modeling_auto as ma
    names = [n[:-len("_MAPPING_NAMES")] for n in dir(ma) if n.startswith("MODEL") and n.endswith("_MAPPING_NAMES")]
    order = ["MODEL"] + [n for n in _HEAD_PREF if n in names] + sorted(n for n in names if n != "MODEL"
                                                                      and n not in _HEAD_PREF)
    table = {}
    for n in order:
        m = getattr(ma, n + "_MAPPING_NAMES")
        if not isinstance(m, dict):
            continue
        for mt, cls in m.items():
            if mt in table:
                continue
            if isinstance(cls, (tuple, list)):
                cls = cls[0]
            table[mt] = (cls, n)
    return dict(sorted(table.items()))


# --------------------------------------------------------------------------------------------
# worker (one architecture, in a subprocess)
# --------------------------------------------------------------------------------------------

def _err(e):
    msg = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    first = msg[0] if msg else ""
    if first.endswith(":") and len(msg) > 1:     # e.g. "Class validation error for validator 'x':" + reason
        first += " " + msg[1]
    return f"{type(e).__name__}: {first[:300]}"


WIDTH_KEYS = ["hidden_size", "d_model", "n_embd", "embed_dim", "model_dim", "dim", "embedding_dim",
              "word_embed_proj_dim", "text_embed_dim", "vision_embed_dim", "encoder_hidden_size",
              "decoder_hidden_size", "projection_dim", "hidden_dim_model"]
HEAD_KEYS = ["num_attention_heads", "num_heads", "n_head", "n_heads", "encoder_attention_heads",
             "decoder_attention_heads", "attention_heads", "num_attention_heads_text"]
FFN_KEYS = ["intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner", "ffn_dim",
            "ff_dim", "decoder_intermediate_size", "encoder_intermediate_size", "hidden_dim", "mlp_dim"]
SMALL_FFN_KEYS = ["moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
                  "moe_ffn_hidden_size", "intermediate_size_mlp"]
LAYER_KEYS = ["num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers", "num_encoder_layers", "depth", "num_text_layers", "num_vision_layers",
              "text_layers", "vision_layers"]
EXPERT_KEYS = ["num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"]
TOPK_KEYS = ["num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "num_selected_experts",
             "experts_per_token"]
INDEX_LIST_RE = re.compile(r"(index|indices|indexes|idx|idxs|_layers|layer_ids)$")
INT_INDEX_RE = re.compile(r"(layer_index|layer_idx|feature_layer|select_layer)$")
TOKEN_KEY_RE = re.compile(r"(token_id|token_ids|token_index|_token)$")


def _is_sub(v):
    return isinstance(v, dict) and "model_type" in v


def _collect_token_ids(d, out):
    for k, v in d.items():
        if _is_sub(v):
            _collect_token_ids(v, out)
        elif TOKEN_KEY_RE.search(k) and "vocab" not in k:
            vals = v if isinstance(v, list) else [v]
            for x in vals:
                if isinstance(x, int) and not isinstance(x, bool) and x >= 0:
                    out.add(x)


def _remap_token_ids(d, mapping):
    for k, v in d.items():
        if _is_sub(v):
            _remap_token_ids(v, mapping)
        elif TOKEN_KEY_RE.search(k) and "vocab" not in k:
            if isinstance(v, int) and not isinstance(v, bool) and v in mapping:
                d[k] = mapping[v]
            elif isinstance(v, list):
                d[k] = [mapping.get(x, x) if isinstance(x, int) else x for x in v]


def _shrink(d, level, vocab, windowed=False):
    """Shrink a config dict in place (recursively into sub-config dicts). level 0: everything;
    1: widths/depths/experts but not vocab/image/positions; 2: layer counts only."""
    for k, v in list(d.items()):
        if _is_sub(v):
            _shrink(v, level, vocab, windowed)
        elif isinstance(v, list) and v and all(_is_sub(x) for x in v):
            for x in v:
                _shrink(x, level, vocab, windowed)
    isint = lambda k: isinstance(d.get(k), int) and not isinstance(d.get(k), bool)  # noqa: E731

    # ---- layers (all levels); per-layer lists are subset with the same indices
    old_n = next((d[k] for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers") if isint(k)), None)
    keep = None
    if old_n and old_n > 2:
        per_layer = [k for k, v in d.items() if isinstance(v, list) and len(v) == old_n
                     and not INDEX_LIST_RE.search(k)]
        idx = {0, 1}
        for k in per_layer:
            seen = {}
            for i, x in enumerate(d[k]):
                try:
                    seen.setdefault(json.dumps(x, sort_keys=True), i)
                except TypeError:
                    pass
            idx |= set(seen.values())
        keep = sorted(idx)[:4]
        for k in per_layer:
            d[k] = [d[k][i] for i in keep]
    new_n = len(keep) if keep else None
    for k in LAYER_KEYS:
        if isint(k) and d[k] > 2:
            d[k] = new_n if (new_n and d[k] == old_n) else 2
    n = next((d[k] for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers") if isint(k)), None)
    if n and old_n and n < old_n:
        for k, v in list(d.items()):
            if (INDEX_LIST_RE.search(k) and not TOKEN_KEY_RE.search(k) and isinstance(v, list) and v
                    and all(isinstance(x, int) for x in v)):
                d[k] = [min(x, n - 1) if x >= 0 else max(x, -n) for x in v]
            elif INT_INDEX_RE.search(k) and isint(k) and not TOKEN_KEY_RE.search(k):
                d[k] = min(d[k], n - 1) if d[k] >= 0 else max(d[k], -n)
        if isinstance(d.get("out_features"), list) and any(
                isinstance(x, str) and x.startswith("stage") and x[5:].isdigit() and int(x[5:]) > n
                for x in d["out_features"]):
            d["out_features"], d["out_indices"] = None, None      # backbone: default = last stage
        for k in ("first_k_dense_replace", "num_dense_layers"):
            if isint(k):
                d[k] = min(d[k], 1)
    if isinstance(d.get("depths"), list) and all(isinstance(x, int) for x in d["depths"]):
        d["depths"] = [1] * len(d["depths"])
    if level >= 2:
        return

    # ---- widths, heads, FFN, experts
    heads = None
    for k in HEAD_KEYS:
        if isint(k) and d[k] > 4:
            old_h = d[k]
            d[k] = 4
            heads = 4
            for kv in ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"):
                if isint(kv):
                    d[kv] = 4 if d[kv] == old_h else min(d[kv], 2)
        elif isint(k):
            heads = heads or d[k]
    list_heads = next((d[k] for k in HEAD_KEYS if isinstance(d.get(k), list)), None)
    for k in WIDTH_KEYS:
        if isint(k) and d[k] > 64:
            if list_heads and all(isinstance(h, int) for h in list_heads) and d[k] % list_heads[0] == 0:
                d[k] = max(list_heads[0] * 16, 16)
            else:
                d[k] = 64
    width = next((d[k] for k in WIDTH_KEYS if isint(k)), 64)
    for k in ("head_dim", "d_kv", "kv_channels", "attention_head_dim", "attention_head_size"):
        if isint(k) and d[k] > 16:
            d[k] = max(width // (heads or 4), 8)
    for k in FFN_KEYS:
        if isint(k) and d[k] > 128:
            d[k] = 128
        elif isinstance(d.get(k), list) and d[k] and all(isinstance(x, int) for x in d[k]):
            d[k] = [min(x, 128) for x in d[k]]
    for k in SMALL_FFN_KEYS:
        if isint(k) and d[k] > 64:
            d[k] = 64
    for k in ("hidden_sizes", "embed_dims", "dims", "embedding_dims"):
        if isinstance(d.get(k), list) and d[k] and all(isinstance(x, int) for x in d[k]):
            d[k] = [x // 4 if x >= 64 and x % 4 == 0 else x for x in d[k]]
    for k in EXPERT_KEYS:
        if isint(k) and d[k] > 4:
            d[k] = 4
    for k in TOPK_KEYS:
        if isint(k) and d[k] > 2:
            d[k] = 2
    for k in ("n_group", "topk_group", "num_expert_group", "topk_groups"):
        if isint(k) and d[k] > 1:
            d[k] = 1
    # MLA / linear attention / state-space
    for k, val in (("kv_lora_rank", 32), ("q_lora_rank", 32), ("qk_rope_head_dim", 8), ("qk_nope_head_dim", 8),
                   ("v_head_dim", 16), ("linear_key_head_dim", 16), ("linear_value_head_dim", 16),
                   ("linear_num_key_heads", 2), ("linear_num_value_heads", 4), ("state_size", 16),
                   ("ssm_state_size", 16), ("mamba_d_state", 16), ("time_step_rank", 8), ("n_groups", 1),
                   ("mamba_n_groups", 1), ("mamba_n_heads", 4), ("mamba_d_head", 16), ("num_codebooks", 2)):
        if isint(k) and d[k] > val:
            d[k] = val
    for k in ("codebook_dim",):
        if isint(k) and d[k] > 64:
            d[k] = width
    for k in ("width_coefficient", "depth_coefficient"):
        if isinstance(d.get(k), float) and d[k] > 1.0:
            d[k] = 1.0
    if isinstance(d.get("num_block_repeats"), list):
        d["num_block_repeats"] = [1] * len(d["num_block_repeats"])
    if isint("mamba_expand") and isint("mamba_n_heads") and isint("mamba_d_head") and isint("hidden_size"):
        d["mamba_d_head"] = max(d["mamba_expand"] * d["hidden_size"] // d["mamba_n_heads"], 1)
    if isint("qk_rope_head_dim") and isint("head_dim"):
        d["head_dim"] = d["qk_rope_head_dim"]
    if isint("qk_head_dim") and isint("qk_rope_head_dim") and isint("qk_nope_head_dim"):
        d["qk_head_dim"] = d["qk_rope_head_dim"] + d["qk_nope_head_dim"]
    if isint("expand") and isint("num_heads") and isint("head_dim") and isint("hidden_size"):
        d["head_dim"] = max(d["expand"] * d["hidden_size"] // d["num_heads"], 1)
    if level >= 1:
        return

    # ---- vocab, images, audio positions
    for k in ("vocab_size", "text_vocab_size"):
        if isint(k) and d[k] > vocab:
            d[k] = vocab
    for k in () if windowed else ("image_size", "img_size", "input_size_image"):
        if isint(k) and d[k] > 64:
            d[k] = 64
        elif isinstance(d.get(k), list) and len(d[k]) == 2 and all(isinstance(x, int) and x > 64 for x in d[k]):
            d[k] = [64, 64]
    for k in () if windowed else ("patch_size",):
        if isint(k) and d[k] > 8:
            d[k] = 8
        elif isinstance(d.get(k), list) and len(d[k]) == 2 and all(isinstance(x, int) and x > 8 for x in d[k]):
            d[k] = [8, 8]
    for k in ("max_source_positions",):
        if isint(k) and d[k] > 64:
            d[k] = 64


def _fill_required(d):
    """Values every level needs: settings left None that the model cannot do without, and no timm."""
    from transformers import ResNetConfig
    for k, v in list(d.items()):
        if _is_sub(v):
            if v.get("model_type") == "timm_backbone":     # timm is not installed: use transformers' ResNet
                d[k] = ResNetConfig(out_features=["stage1", "stage2", "stage3", "stage4"]).to_dict()
            else:
                _fill_required(v)
    if "prediction_length" in d and d["prediction_length"] is None:
        d["prediction_length"] = 8
    if "context_length" in d and d["context_length"] is None:
        d["context_length"] = 16
    for k in ("use_pretrained_backbone", "use_timm_backbone"):
        if d.get(k) is True:
            d[k] = False


def _has_windowed_stages(d):
    if (isinstance(d.get("window_size"), (int, list)) and not isinstance(d.get("window_size"), bool)
            and isinstance(d.get("depths"), list)):
        return True
    return any(_has_windowed_stages(v) for v in d.values() if _is_sub(v))


def make_config(mt, level, vocab=1000):
    from transformers import CONFIG_MAPPING
    cls = CONFIG_MAPPING[mt]
    cfg = cls()
    d = cfg.to_dict()
    d.pop("transformers_version", None)
    _fill_required(d)
    if level >= 3:
        return cls.from_dict(d)
    d["_windowed"] = _has_windowed_stages(d)
    if level == 0:
        ids = set()
        _collect_token_ids(d, ids)
        big = sorted(x for x in ids if x >= vocab - 64)
        _remap_token_ids(d, {x: vocab - 1 - i for i, x in enumerate(big)})
    _shrink(d, level, vocab, d.pop("_windowed"))
    return cls.from_dict(d)


def _find(cfg, names, default=None):
    """First attribute among names on cfg or (breadth-first) its sub-configs."""
    from transformers import PretrainedConfig
    queue = [cfg]
    while queue:
        c = queue.pop(0)
        for n in names:
            v = getattr(c, n, None)
            if v is not None and not isinstance(v, bool):
                return v
        for k, v in vars(c).items():
            if isinstance(v, PretrainedConfig):
                queue.append(v)
    return default


def _special_ids(cfg):
    from transformers import PretrainedConfig
    out = set()
    queue = [cfg]
    while queue:
        c = queue.pop(0)
        for k, v in vars(c).items():
            if isinstance(v, PretrainedConfig):
                queue.append(v)
            elif TOKEN_KEY_RE.search(k) and "vocab" not in k:
                for x in (v if isinstance(v, list) else [v]):
                    if isinstance(x, int) and not isinstance(x, bool):
                        out.add(x)
    return out


def input_candidates(model, cfg):
    """Yield (description, kwargs) candidate inputs; the first that runs on the CPU is used."""
    import inspect
    import torch
    params = inspect.signature(model.forward).parameters
    accepts = lambda n: n in params or any(p.kind == p.VAR_KEYWORD for p in params.values())  # noqa: E731
    main = getattr(model, "main_input_name", "input_ids") or "input_ids"
    g = torch.Generator().manual_seed(1234)
    vocab = _find(cfg, ["vocab_size"], 1000)
    vocab = vocab if isinstance(vocab, int) and vocab > 8 else 1000

    def ids(b, s):
        bad = _special_ids(cfg)
        t = torch.randint(3, max(vocab, 4), (b, s), generator=g)
        ok = [i for i in range(3, min(vocab, 4000)) if i not in bad] or [3]
        mask = torch.zeros_like(t, dtype=torch.bool)
        for x in bad:
            mask |= t == x
        t[mask] = ok[0]
        return t

    def text_kwargs():
        kw = {"input_ids": ids(BATCH, SEQ)}
        if accepts("attention_mask") and "attention_mask" in params:
            m = torch.ones(BATCH, SEQ, dtype=torch.long)
            m[1, -5:] = 0
            kw["attention_mask"] = m
        return kw

    def image(c=None, hw=None):
        c = c or _find(cfg, ["num_channels", "in_channels", "in_chans"], 3)
        size = hw or _find(cfg, ["image_size", "img_size"], 64)
        if isinstance(size, dict):
            size = [size.get("height", 64), size.get("width", 64)]
        if isinstance(size, (list, tuple)):
            h, w = (size[0], size[-1])
        else:
            h = w = int(size)
        return torch.randn(BATCH, int(c), int(h), int(w), generator=g)

    extra = {}
    if "use_cache" in params:
        extra["use_cache"] = False
    dec = {}
    if "decoder_input_ids" in params and (getattr(cfg, "is_encoder_decoder", False)
                                          or params["decoder_input_ids"].default is inspect.Parameter.empty):
        dec["decoder_input_ids"] = ids(BATCH, DEC_SEQ)

    cands = []
    if main == "input_ids":
        cands.append(("ids+mask", {**text_kwargs(), **dec}))
        if "pixel_values" in params:
            cands.append(("ids+mask+pixels", {**text_kwargs(), **dec, "pixel_values": image()}))
        if "input_features" in params or "input_values" in params:
            pass
        cands.append(("ids", {"input_ids": ids(BATCH, SEQ), **dec}))
    elif main in ("pixel_values", "pixel_values_videos"):
        cands.append(("pixels", {main: image(), **dec}))
        nf = _find(cfg, ["num_frames", "frames_per_clip"], None)
        if isinstance(nf, int):
            x = image().unsqueeze(1).repeat(1, nf, 1, 1, 1)
            cands.append(("video BTCHW", {main: x, **dec}))
            cands.append(("video BCTHW", {main: x.transpose(1, 2).contiguous(), **dec}))
        cands.append(("pixels 224", {main: image(hw=224), **dec}))
        cands.append(("pixels 1ch", {main: image(c=1), **dec}))
    elif main == "input_values":
        cands.append(("wave B,T", {main: torch.randn(BATCH, 4000, generator=g), **dec}))
        cands.append(("wave B,1,T", {main: torch.randn(BATCH, 1, 4000, generator=g), **dec}))
        cands.append(("wave B,T,C", {main: torch.randn(BATCH, 4000, 1, generator=g), **dec}))
        fs = _find(cfg, ["feature_size", "num_mel_bins", "num_mel_filters"], 80)
        cands.append(("spec B,T,F", {main: torch.randn(BATCH, 64, int(fs), generator=g), **dec}))
        ml = _find(cfg, ["max_length"], None)
        if isinstance(ml, int) and 0 < ml <= 4096:
            cands.append(("spec B,max_length,F", {main: torch.randn(BATCH, ml, int(fs), generator=g), **dec}))
    elif main == "input_features":
        mel = _find(cfg, ["num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels"], 80)
        src = _find(cfg, ["max_source_positions"], 32)
        chans = _find(cfg, ["input_channels"], 1)
        t = 2 * src if isinstance(src, int) and src <= 1500 else 64
        cands.append(("feat B,F,T", {main: torch.randn(BATCH, int(mel), t, generator=g), **dec}))
        cands.append(("feat B,T,F", {main: torch.randn(BATCH, 64, int(mel) * int(chans), generator=g), **dec}))
        for mname in [n for n in params if "mask" in n and n not in ("head_mask", "decoder_attention_mask")][:2]:
            cands.append((f"feat B,F,T+{mname}", {main: torch.randn(BATCH, int(mel), t, generator=g),
                                                  mname: torch.ones(BATCH, t, dtype=torch.long), **dec}))
            cands.append((f"feat B,T,F+{mname}", {main: torch.randn(BATCH, 64, int(mel) * int(chans), generator=g),
                                                  mname: torch.ones(BATCH, 64, dtype=torch.long), **dec}))
    elif main == "past_values":
        ctx = _find(cfg, ["context_length"], 32)
        pred = _find(cfg, ["prediction_length"], 8)
        lags = _find(cfg, ["lags_sequence"], [1])
        nin = _find(cfg, ["input_size", "num_input_channels"], 1)
        ntf = _find(cfg, ["num_time_features"], 0)
        ntf = ntf if isinstance(ntf, int) else 0
        past = ctx + max(lags)
        shp = (BATCH, past) if nin == 1 else (BATCH, past, nin)
        fshp = (BATCH, pred) if nin == 1 else (BATCH, pred, nin)
        kw = {"past_values": torch.randn(*shp, generator=g),
              "past_time_features": torch.randn(BATCH, past, ntf, generator=g),
              "past_observed_mask": torch.ones(*shp)}
        if "future_values" in params:
            kw["future_values"] = torch.randn(*fshp, generator=g)
        if "future_time_features" in params:
            kw["future_time_features"] = torch.randn(BATCH, pred, ntf, generator=g)
        cands.append(("timeseries", {k: v for k, v in kw.items() if k in params}))
        cands.append(("past_values B,T,C", {"past_values": torch.randn(BATCH, ctx, nin, generator=g)}))
    else:
        cands.append((f"unsupported main_input_name {main!r}", None))
    hidden = _find(cfg, ["hidden_size", "d_model"], 64)

    def box():
        a = torch.randint(0, 500, (BATCH, SEQ, 2), generator=g)
        return torch.cat([a, a + torch.randint(1, 500, (BATCH, SEQ, 2), generator=g)], -1)

    builders = {"input_ids": lambda: ids(BATCH, SEQ), "pixel_values": image,
                "decoder_input_ids": lambda: ids(BATCH, DEC_SEQ), "bbox": box,
                "attention_mask": lambda: torch.ones(BATCH, SEQ, dtype=torch.long),
                "inputs_embeds": lambda: torch.randn(BATCH, SEQ, int(hidden), generator=g),
                "query_embeds": lambda: torch.randn(BATCH, 8, int(hidden), generator=g)}
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for desc, kw in cands:
        if kw is not None:
            kw = {**kw, **{k: v for k, v in extra.items() if k not in kw}}
            missing = [n for n in required if n not in kw]
            if missing and all(n in builders for n in missing):
                kw.update({n: builders[n]() for n in missing})
                desc += "+" + "+".join(missing)
        yield desc, kw
    if main != "input_ids" and "input_ids" in params and cands[0][1] and main in cands[0][1]:
        yield f"{main}+ids", {main: cands[0][1][main], "input_ids": ids(BATCH, SEQ), **extra}
    if "bbox" in params and "bbox" not in required:
        yield "ids+bbox", {**text_kwargs(), "bbox": box(), **extra}


def flatten(out, prefix="out"):
    import torch
    res = []
    if isinstance(out, torch.Tensor):
        res.append((prefix, out))
    elif hasattr(out, "to_tuple") and hasattr(out, "keys"):
        for k in out.keys():
            res += flatten(out[k], f"{prefix}.{k}")
    elif isinstance(out, dict):
        for k, v in out.items():
            res += flatten(v, f"{prefix}.{k}")
    elif isinstance(out, (list, tuple)):
        for i, v in enumerate(out):
            res += flatten(v, f"{prefix}[{i}]")
    return res


def scalar_loss(flat):
    import torch
    terms = [t.float().pow(2).mean() for _, t in flat
             if t.is_floating_point() and t.requires_grad and t.numel() > 0]
    return sum(terms) if terms else None


def compare(a, b):
    """(max_abs_diff, scaled_err, ok) between cpu tensor a and device tensor b (already on cpu)."""
    import torch
    if a.shape != b.shape:
        return float("inf"), float("inf"), False, f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if not a.is_floating_point() and not a.is_complex():
        ok = bool(torch.equal(a, b))
        return (0.0 if ok else float((a.double() - b.double()).abs().max())), (0.0 if ok else float("inf")), ok, ""
    a, b = a.double(), b.double()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return float("nan"), float("inf"), False, "nan pattern differs"
    fin = ~nan_a
    if a.numel() == 0 or not fin.any():
        return 0.0, 0.0, True, ""
    a, b = a[fin], b[fin]
    inf_mismatch = not torch.equal(torch.isinf(a), torch.isinf(b)) or not torch.equal(a[torch.isinf(a)],
                                                                                     b[torch.isinf(b)])
    if inf_mismatch:
        return float("inf"), float("inf"), False, "inf pattern differs"
    f = torch.isfinite(a)
    if not f.any():
        return 0.0, 0.0, True, ""
    diff = float((a[f] - b[f]).abs().max())
    scale = max(1.0, float(a[f].abs().max()))
    return diff, diff / scale, diff <= RTOL * scale, ""


def build_cpu(mt, model_cls, rec):
    """Build architecture mt on the CPU, trying shrink levels until config, model, inputs and a CPU
    forward all work. Returns (model, tpu_model, kw, cpu_flat, cpu_grads) - tpu_model a copy taken
    before any CPU forward - or None with rec["category"] = "cannot_build" and the reason."""
    import copy
    import torch
    attempts = []
    chosen = None
    rec["build_attempts"] = attempts
    for level in (0, 1, 2, 3):
        try:
            cfg = make_config(mt, level)
        except Exception as e:  # noqa: BLE001
            attempts.append(f"L{level} config: {_err(e)}")
            continue
        try:
            with torch.device("meta"):
                meta = model_cls._from_config(cfg)
            nparams = sum(p.numel() for p in meta.parameters())
            del meta
        except Exception as e:  # noqa: BLE001
            attempts.append(f"L{level} model: {_err(e)}")
            continue
        if nparams > MAX_PARAMS:
            attempts.append(f"L{level} too large: {nparams / 1e6:.1f}M params")
            continue
        try:
            torch.manual_seed(0)
            model = model_cls._from_config(cfg)
            model.eval()
        except Exception as e:  # noqa: BLE001
            attempts.append(f"L{level} model: {_err(e)}")
            continue
        tpu_model = copy.deepcopy(model)   # before any CPU forward/backward
        for desc, kw in input_candidates(model, model.config):
            if kw is None:
                attempts.append(f"L{level} inputs: {desc}")
                continue
            try:
                torch.manual_seed(1)
                out = model(**kw)
                flat = flatten(out)
                if not flat:
                    raise RuntimeError("forward returned no tensors")
                chosen = (level, model, tpu_model, desc, kw, out, flat, nparams)
                break
            except Exception as e:  # noqa: BLE001
                attempts.append(f"L{level} cpu forward [{desc}]: {_err(e)}")
                model.zero_grad(set_to_none=True)
        if chosen:
            break
    if not chosen:
        # report the most informative reason: the first one from the least-shrunk level that got furthest
        # the shrunk level's failure says why shrinking broke; the last one why defaults were not used
        reason = attempts[0] if attempts else "no attempt"
        if len(attempts) > 1 and attempts[-1][:2] != attempts[0][:2]:
            reason += " | " + attempts[-1]
        rec.update(built=False, category="cannot_build", reason=reason, stage="build")
        return None
    level, model, tpu_model, desc, kw, out, flat, nparams = chosen
    rec.update(built=True, level=level, params=nparams, inputs=desc,
               input_shapes={k: list(v.shape) for k, v in kw.items() if isinstance(v, torch.Tensor)},
               attn_impl=getattr(model.config, "_attn_implementation", None))
    loss = scalar_loss(flat)
    cpu_grads = None
    if loss is not None:
        try:
            loss.backward()
            cpu_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        except Exception as e:  # noqa: BLE001
            rec["cpu_backward_error"] = _err(e)
    cpu_flat = [(n, t.detach()) for n, t in flat]
    return model, tpu_model, kw, cpu_flat, cpu_grads


def run_tpu(tpu_model, kw, cpu_flat, cpu_grads, rec, save=lambda: None):
    """Forward (and backward, where the CPU ran one) of tpu_model on the tpu, compared with the CPU's
    results; fills rec (matches, worst errors, fallbacks, category) and returns it."""
    import time
    import torch
    import torch_tpu
    fb = {}
    try:
        rec["stage"] = "to_device"
        save()
        tpu_model = tpu_model.to("tpu")
        tkw = {k: (v.to("tpu") if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        torch_tpu.synchronize()
        torch_tpu.reset_fallback_counts()
        rec["stage"] = "forward"
        save()
        t1 = time.time()
        torch.manual_seed(1)
        tout = tpu_model(**tkw)
        tflat = flatten(tout)
        torch_tpu.synchronize()
        rec["fallbacks_forward"] = torch_tpu.fallback_counts()
        rec["t_forward"] = round(time.time() - t1, 2)
        rec["stage"] = "compare"
        save()
        names_t = {n: t for n, t in tflat}
        worst, worst_name, ok_all, notes = 0.0, None, True, []
        for n, a in cpu_flat:
            if n not in names_t:
                ok_all = False
                notes.append(f"{n} missing on tpu")
                continue
            b = names_t[n]
            if b.device.type != "tpu" and b.numel() > 0:
                notes.append(f"{n} on {b.device.type}")
            diff, scaled, ok, note = compare(a, b.detach().cpu())
            if not ok:
                ok_all = False
                if note:
                    notes.append(f"{n}: {note}")
            if not (scaled <= worst) and scaled == scaled:
                worst, worst_name = scaled, n
                rec["max_abs_diff"] = diff
        rec.update(forward_match=ok_all, worst_scaled_err=worst, worst_output=worst_name, compare_notes=notes[:5])
        if cpu_grads is not None:
            rec["stage"] = "backward"
            save()
            tloss = scalar_loss(tflat)
            if tloss is None:
                rec["backward"] = "no float output with grad on tpu"
            else:
                t1 = time.time()
                tloss.backward()
                torch_tpu.synchronize()
                rec["t_backward"] = round(time.time() - t1, 2)
                rec["backward"] = "ran"
                gworst, gname, gok, missing = 0.0, None, True, 0
                tparams = dict(tpu_model.named_parameters())
                for n, g in cpu_grads.items():
                    tg = tparams[n].grad if n in tparams else None
                    if tg is None:
                        missing += 1
                        gok = False
                        continue
                    diff, scaled, ok, _ = compare(g, tg.detach().cpu())
                    gok &= ok
                    if not (scaled <= gworst):
                        gworst, gname = scaled, n
                rec.update(grad_match=gok, grad_worst_scaled_err=gworst, grad_worst_param=gname,
                           grad_missing=missing)
        else:
            rec["backward"] = "skipped (" + (rec.get("cpu_backward_error") or "no float output with grad") + ")"
        rec["stage"] = "done"
    except Exception as e:  # noqa: BLE001
        rec["error"] = _err(e)
        rec["error_stage"] = rec["stage"]
        try:
            torch_tpu.synchronize()
        except Exception:  # noqa: BLE001
            pass
    try:
        fb = torch_tpu.fallback_counts()
    except Exception as e:  # noqa: BLE001
        rec["fallback_counts_error"] = _err(e)
    rec["fallbacks"] = fb
    if "error" in rec:
        rec["category"] = "raise"
    elif not rec.get("forward_match") or rec.get("grad_match") is False:
        rec["category"] = "mismatch"   # forward or gradients
    elif fb:
        rec["category"] = "fallback"
    else:
        rec["category"] = "native"
    return rec


def worker(mt, cls_name, out_path, dump_level=None):
    rec = {"arch": mt, "model_class": cls_name, "stage": "import"}

    def save():
        with open(out_path, "w") as f:
            json.dump(rec, f, default=str)

    save()
    t0 = time.time()
    import warnings
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401
    import torch_tpu  # noqa: F401
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    rec["t_import"] = round(time.time() - t0, 2)

    try:
        model_cls = getattr(transformers, cls_name, None)
        _ = model_cls is not None and model_cls.forward   # a class whose library is missing raises here
    except ImportError as e:     # e.g. needs torchaudio / timm: not installed here, so it cannot be built
        rec.update(category="cannot_build", reason=f"model: {_err(e)}")
        save()
        return
    if model_cls is None:
        rec.update(category="cannot_build", reason=f"class {cls_name} not exported by transformers")
        save()
        return
    if model_cls.forward is torch.nn.Module.forward:
        rec.update(category="cannot_build", reason=f"{cls_name} has no forward()")
        save()
        return
    rec["stage"] = "build"
    save()
    built = build_cpu(mt, model_cls, rec)
    if built is None:
        save()
        return
    rec["t_build"] = round(time.time() - t0, 2)
    save()
    _, tpu_model, kw, cpu_flat, cpu_grads = built
    run_tpu(tpu_model, kw, cpu_flat, cpu_grads, rec, save)
    rec["t_total"] = round(time.time() - t0, 2)
    save()


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------

def run_one(mt, cls_name, timeout, python):
    fd, path = tempfile.mkstemp(prefix=f"conf_{mt}_", suffix=".json", dir="/tmp")
    os.close(fd)
    env = dict(os.environ)
    for k in ("TORCH_TPU_DEFER_AND_FUSE", "TORCH_TPU_LAUNCH_BLOCKING", "TORCH_TPU_FUSED_DUMP"):
        env.pop(k, None)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore", TRANSFORMERS_VERBOSITY="error")
    t0 = time.time()
    p = subprocess.Popen([python, HERE, "--worker", mt, cls_name, path], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    status = None
    try:
        _, err = p.communicate(timeout=timeout)
        status = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        status = "timeout"
    try:
        with open(path) as f:
            rec = json.load(f)
    except Exception:  # noqa: BLE001
        rec = {"arch": mt, "model_class": cls_name, "stage": "start"}
    os.unlink(path)
    rec["wall"] = round(time.time() - t0, 1)
    if status == "timeout":
        rec.update(category="timeout", error=f"Timeout: no result after {timeout}s (stage {rec.get('stage')})",
                   error_stage=rec.get("stage"))
    elif status != 0 or "category" not in rec:
        tail = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()
                and "UserWarning" not in ln and "warnings.warn" not in ln][-3:]
        sig = f"signal {-status}" if isinstance(status, int) and status < 0 else f"exit {status}"
        rec.update(category="crash", error=f"Crash: {sig} in stage {rec.get('stage')}: "
                                           + (tail[-1][:300] if tail else ""),
                   error_stage=rec.get("stage"), stderr_tail=tail)
    return rec


def _norm(msg):
    msg = re.sub(r"0x[0-9a-f]+", "0x#", msg)
    msg = re.sub(r"\d+", "#", msg)
    return msg[:160]


CATS = ["native", "fallback", "mismatch", "raise", "crash", "timeout", "cannot_build"]


def summarize(recs, top_ops=15, top_errs=10, out=sys.stdout):
    p = lambda *a: print(*a, file=out)  # noqa: E731
    cnt = collections.Counter(r.get("category") for r in recs)
    built = [r for r in recs if r.get("built")]
    p(f"\n== {len(recs)} architectures ==")
    for c in CATS:
        p(f"  {c:13s} {cnt.get(c, 0):4d}")
    p(f"  built         {len(built):4d}   (shrink levels: "
      + ", ".join(f"L{k}={v}" for k, v in sorted(collections.Counter(r.get('level') for r in built).items())) + ")")
    bw = [r for r in built if r.get("backward") == "ran"]
    p(f"  backward ran  {len(bw):4d}   grad match {sum(1 for r in bw if r.get('grad_match'))}"
      f"   grad mismatch {sum(1 for r in bw if not r.get('grad_match'))}")
    ops_arch = collections.Counter()
    ops_calls = collections.Counter()
    for r in recs:
        for op, n in (r.get("fallbacks") or r.get("fallbacks_forward") or {}).items():
            ops_arch[op] += 1
            ops_calls[op] += n
    p(f"\n== top fallback ops (by #architectures; {len(ops_arch)} distinct ops) ==")
    for op, n in ops_arch.most_common(top_ops):
        p(f"  {n:4d} archs  {ops_calls[op]:7d} calls  {op}")
    errs = collections.Counter()
    ex = {}
    for r in recs:
        if r.get("category") in ("raise", "crash", "timeout") and r.get("error"):
            k = f"[{r.get('error_stage')}] " + _norm(r["error"])
            errs[k] += 1
            ex.setdefault(k, []).append(r["arch"])
    p(f"\n== top errors on tpu (raise/crash/timeout) ==")
    for k, n in errs.most_common(top_errs):
        p(f"  {n:4d}  {k}   e.g. {', '.join(ex[k][:3])}")
    mism = [r for r in recs if r.get("category") == "mismatch"]
    if mism:
        p(f"\n== mismatches ==")
        for r in mism[:20]:
            if r.get("forward_match"):
                p(f"  {r['arch']:28s} gradient scaled err {r.get('grad_worst_scaled_err')} at "
                  f"{r.get('grad_worst_param')}"[:200])
            else:
                p(f"  {r['arch']:28s} scaled err {r.get('worst_scaled_err')} at {r.get('worst_output')} "
                  f"{'; '.join(r.get('compare_notes') or [])}"[:200])
    berrs = collections.Counter()
    for r in recs:
        if r.get("category") == "cannot_build":
            att = r.get("build_attempts") or [r.get("reason", "")]
            berrs[_norm(re.sub(r"^L\d ", "", att[0].split(" | ")[0]))] += 1
    if berrs:
        p(f"\n== top cannot-build reasons ==")
        for k, n in berrs.most_common(top_errs):
            p(f"  {n:4d}  {k}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated model types")
    ap.add_argument("--limit", type=int, help="first N architectures (alphabetical, after --skip)")
    ap.add_argument("--skip", type=int, default=0, help="skip the first N architectures")
    ap.add_argument("--json", help="write all records here (rewritten after each architecture)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per architecture")
    ap.add_argument("--summary-from", help="only print the summary of existing --json file(s), comma-separated; "
                                           "a later file's record replaces an earlier one for the same arch")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if a.summary_from:
        merged = {}
        for path in a.summary_from.split(","):
            with open(path) as f:
                for r in json.load(f)["results"]:
                    merged[r["arch"]] = r
        recs = [merged[k] for k in sorted(merged)]
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rtol": RTOL, "merged_from": a.summary_from, "results": recs}, f, indent=1, default=str)
        summarize(recs)
        return
    table = arch_table()
    names = list(table)
    if a.only:
        want = [x.strip() for x in a.only.split(",") if x.strip()]
        unknown = [x for x in want if x not in table]
        if unknown:
            sys.exit(f"unknown model types: {unknown}")
        names = want
    names = names[a.skip:]
    if a.limit:
        names = names[:a.limit]
    recs = []
    t0 = time.time()
    print(f"{len(names)} of {len(table)} architectures, timeout {a.timeout:.0f}s each, 1 worker", flush=True)
    for i, mt in enumerate(names):
        rec = run_one(mt, table[mt][0], a.timeout, sys.executable)
        recs.append(rec)
        fb = rec.get("fallbacks") or {}
        extra = ""
        if rec.get("category") in ("raise", "crash", "timeout"):
            extra = rec.get("error", "")
        elif rec.get("category") == "cannot_build":
            extra = rec.get("reason", "")
        elif rec.get("category") == "mismatch":
            extra = f"err {rec.get('worst_scaled_err'):.3g} at {rec.get('worst_output')}"
        if fb and rec.get("category") != "cannot_build":
            extra += (" " if extra else "") + f"fallbacks: {','.join(sorted(fb))}"[:150]
        print(f"[{i + 1:3d}/{len(names)}] {mt:30s} {rec.get('category', '?'):12s} "
              f"L{rec.get('level', '-')} bw={'y' if rec.get('backward') == 'ran' else 'n'} "
              f"{rec['wall']:5.1f}s  {extra[:220]}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rtol": RTOL, "timeout": a.timeout, "elapsed": round(time.time() - t0, 1),
                           "results": recs}, f, indent=1, default=str)
    summarize(recs)
    print(f"\nelapsed {time.time() - t0:.0f}s")


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()
