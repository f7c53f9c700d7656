"""The model table: KV-cache bytes per token, kept as data in ``data/models.toml``.

Each model names a *formula* and carries the attention shape the formula reads, under
the field names of the model's public ``config.json``. This module holds the formulas
and the precision rules; it is not a model loader and knows nothing of weights.

Bytes per token = KV elements per token x the KV precision's bytes per element, plus the
sparse-attention indexer's elements x the indexer precision's bytes (plus a fixed number
of scale bytes where a format stores them). Per-sequence state (linear-attention and
convolution state) does not grow with the prefix and is not counted: a prefix cache
stores tokens. For formulas with sliding-window or compressed layers the bytes per token
depend on the sequence length; the simulator uses the trace's mean input length, as the
reference simulator does.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from kvstored.tools.errors import UsageProblem

DEFAULT_TOKENS = 4096
# The reference simulator's precision ids, accepted as they are.
PRECISION_ALIASES = {"bf16_fp16": "bf16", "fp16": "bf16", "fp8_int8": "fp8", "int8": "fp8",
                     "fp4_int4": "fp4", "int4": "fp4"}

# Short names of the original table, still accepted in a user's --models-file.
_ALIASES = {"layers": "num_hidden_layers", "kv_heads": "num_key_value_heads",
            "rope_dim": "qk_rope_head_dim", "indexer_layers": "indexer_full_layers"}


@dataclass(frozen=True)
class Elements:
    """What one token of a sequence of ``tokens`` costs: elements at the KV precision,
    elements at the indexer precision, and bytes that no precision changes."""

    kv: float
    indexer: float = 0.0
    fixed_bytes: float = 0.0


class Shape:
    """A model's fields, read with the formula's name for what is missing."""

    def __init__(self, model_id: str, fields: dict):
        self.model_id = model_id
        self.fields = fields

    def __call__(self, name: str, default: float | None = None) -> float:
        value = self.fields.get(name, default)
        if value is None:
            raise UsageProblem(f"model {self.model_id!r} needs the field {name}")
        return value

    def has(self, name: str) -> bool:
        return name in self.fields

    def ratios(self) -> list[float]:
        ratios = self.fields.get("compress_ratios")
        if not isinstance(ratios, list) or not ratios:
            raise UsageProblem(f"model {self.model_id!r} needs compress_ratios (one per layer)")
        return [float(r) for r in ratios]

    def draft_layers(self) -> int:
        """Layers of the draft (MTP / next-n) model, whose KV a speculative engine keeps."""
        if self.fields.get("disable_draft_kv_cache"):
            return 0
        nextn = int(self.fields.get("num_nextn_predict_layers", 0))
        if nextn > 0:
            return nextn
        if self.fields.get("use_mtp"):
            return int(self.fields.get("num_mtp_modules", 0)
                       * self.fields.get("mtp_transformer_layers", 0))
        return 0


def _gqa(s: Shape, tokens: int, draft: bool) -> Elements:
    layers = s("num_hidden_layers") + (s.draft_layers() if draft else 0)
    return Elements(layers * 2 * s("num_key_value_heads") * s("head_dim"))


def _mla(s: Shape, tokens: int, draft: bool) -> Elements:
    layers = s("num_hidden_layers") + (s.draft_layers() if draft else 0)
    return Elements(layers * (s("kv_lora_rank") + s("qk_rope_head_dim")))


def _indexer_layers(s: Shape, main_layers: float, draft: bool) -> float:
    """Layers that keep indexer keys: the main model's, plus the draft's."""
    main = s("indexer_full_layers", main_layers)
    if not draft or not s.draft_layers():
        return main
    return main + s("draft_indexer_layers", s.draft_layers())


def _mla_indexer(s: Shape, tokens: int, draft: bool) -> Elements:
    kv = _mla(s, tokens, draft).kv
    return Elements(kv, _indexer_layers(s, s("num_hidden_layers"), draft) * s("index_head_dim"))


def _sliding_gqa(s: Shape, tokens: int, draft: bool) -> Elements:
    # Full layers keep every token's K and V; sliding layers at most `sliding_window`
    # tokens. Each kind may have its own head count and K / V widths.
    heads, dim = s("num_key_value_heads"), s("head_dim")
    full_heads = s("num_global_key_value_heads", heads)
    full_k = s("global_head_dim", dim)
    full_v = s("global_v_head_dim", s("v_head_dim", full_k))
    swa_heads = s("swa_num_key_value_heads", heads)
    swa_k = s("swa_head_dim", dim)
    swa_v = s("swa_v_head_dim", s("v_head_dim", swa_k))
    kept = min(tokens, int(s("sliding_window")))
    full = tokens * s("full_attention_layers") * full_heads * (full_k + full_v)
    sliding = kept * s("sliding_attention_layers") * swa_heads * (swa_k + swa_v)
    return Elements((full + sliding) / tokens)


def _linear_gqa_hybrid(s: Shape, tokens: int, draft: bool) -> Elements:
    # Linear-attention layers keep a fixed-size state per sequence, not per token.
    return Elements(s("full_attention_layers") * 2 * s("num_key_value_heads") * s("head_dim"))


def _linear_mla_hybrid(s: Shape, tokens: int, draft: bool) -> Elements:
    return Elements(s("full_attention_layers") * (s("kv_lora_rank") + s("qk_rope_head_dim")))


def _linear_mla_indexer_hybrid(s: Shape, tokens: int, draft: bool) -> Elements:
    # Not computed by the reference: its MLA layers as linear_mla_hybrid, plus the
    # indexer keys of the layers that keep them, with the draft as in mla_indexer.
    extra = s.draft_layers() if draft else 0
    kv = (s("full_attention_layers") + extra) * (s("kv_lora_rank") + s("qk_rope_head_dim"))
    return Elements(kv, _indexer_layers(s, s("full_attention_layers"), draft)
                    * s("index_head_dim"))


def _gqa_indexer(s: Shape, tokens: int, draft: bool) -> Elements:
    kv = s("num_hidden_layers") * 2 * s("num_key_value_heads") * s("head_dim")
    return Elements(kv, s("sparse_attention_layers") * s("index_head_dim"))


def _compressed_hybrid(s: Shape, tokens: int, draft: bool) -> Elements:
    # Every layer keeps a window of `sliding_window` uncompressed entries; a layer with
    # compress ratio r > 0 also keeps floor(tokens / r) compressed entries, and ratio-4
    # layers keep indexer keys for floor(tokens / 4) entries. Ratios past the main
    # layers belong to the draft model.
    layers = int(s("num_hidden_layers"))
    ratios = s.ratios()
    active = ratios[:layers] + (ratios[layers:] if draft else [])
    dim, window = s("head_dim"), s("sliding_window")
    kv = indexer = 0.0
    for ratio in active:
        kv += window * dim
        if ratio > 0:
            kv += math.floor(tokens / ratio) * dim
        if ratio == 4:
            indexer += math.floor(tokens / 4) * s("index_head_dim")
    return Elements(kv / tokens, indexer / tokens)


def _compressed_shared(s: Shape, tokens: int, draft: bool) -> Elements:
    # Not computed by the reference: compressed KV is stored only by the layers in
    # kv_source_layer_ids (the others read it), indexer keys only by those in
    # index_source_layer_ids, each at floor(tokens / ratio) entries of its layer; the
    # window cache is left out (default_include_swa_cache is false). Quantised formats
    # add their scale bytes per group of elements.
    ratios = s.ratios()
    layers = int(s("num_hidden_layers"))
    allowed = len(ratios) if draft else layers

    def entries(ids_field: str) -> float:
        ids = s.fields.get(ids_field) or []
        return sum(math.floor(tokens / ratios[i]) for i in ids
                   if i < allowed and ratios[i] > 0)

    kv = entries("kv_source_layer_ids") * s("head_dim")
    indexer = entries("index_source_layer_ids") * s("index_head_dim")
    scales = (kv / s("kv_quant_group_size", math.inf) * s("kv_scale_bytes", 0)
              + indexer / s("indexer_quant_group_size", math.inf)
              * s("indexer_scale_bytes", 0))
    return Elements(kv / tokens, indexer / tokens, scales / tokens)


def _sliding_mla_indexer(s: Shape, tokens: int, draft: bool) -> Elements:
    # Not computed by the reference: full layers keep an MLA latent per token, sliding
    # layers a wider one for at most `sliding_window` tokens; the full layers keep
    # indexer keys plus `indexer_scale_bytes` of scale per token.
    kept = min(tokens, int(s("sliding_window")))
    full = s("full_attention_layers") * (s("kv_lora_rank") + s("qk_rope_head_dim"))
    sliding = s("sliding_attention_layers") * (s("swa_kv_lora_rank")
                                               + s("swa_qk_rope_head_dim"))
    return Elements(full + sliding * kept / tokens,
                    s("full_attention_layers") * s("index_head_dim"),
                    s("full_attention_layers") * s("indexer_scale_bytes", 0))


def _sliding_gqa_conv(s: Shape, tokens: int, draft: bool) -> Elements:
    # Not computed by the reference: full layers keep K and V per token, sliding layers
    # for at most `sliding_window` tokens (with their own head count and width); the
    # draft model adds layers of both kinds. Convolution state is per sequence.
    kept = min(tokens, int(s("sliding_window")))
    full_layers = s("full_attention_layers") + (s("draft_full_attention_layers", 0)
                                                if draft else 0)
    swa_layers = s("sliding_attention_layers") + (s("draft_sliding_attention_layers", 0)
                                                  if draft else 0)
    full = full_layers * 2 * s("num_key_value_heads") * s("head_dim")
    sliding = swa_layers * 2 * s("swa_num_key_value_heads") * s("swa_head_dim")
    return Elements(full + sliding * kept / tokens)


@dataclass(frozen=True)
class Formula:
    name: str
    summary: str
    compute: Callable[[Shape, int, bool], Elements]
    required: tuple[str, ...]
    reference: str | None           # the reference simulator's name, when it computes it
    uses_tokens: bool = False       # bytes per token depend on the sequence length
    has_indexer: bool = False


FORMULAS: dict[str, Formula] = {f.name: f for f in (
    Formula("gqa", "layers x 2 x kv_heads x head_dim", _gqa,
            ("num_hidden_layers", "num_key_value_heads", "head_dim"), "standard_gqa"),
    Formula("mla", "layers x (kv_lora_rank + rope_dim)", _mla,
            ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim"), "mla"),
    Formula("mla_indexer", "mla + indexer_layers x index_head_dim (DSA)", _mla_indexer,
            ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "index_head_dim"),
            "dsa_mla", has_indexer=True),
    Formula("sliding_gqa", "full layers x 2 x heads x dim + sliding layers over a window",
            _sliding_gqa, ("full_attention_layers", "sliding_attention_layers",
                           "num_key_value_heads", "head_dim", "sliding_window"),
            "mixed_full_sliding_gqa", uses_tokens=True),
    Formula("linear_gqa_hybrid", "full-attention layers only (linear layers: state)",
            _linear_gqa_hybrid, ("full_attention_layers", "num_key_value_heads", "head_dim"),
            "qwen_linear_full_hybrid"),
    Formula("linear_mla_hybrid", "MLA layers only (KDA layers: state)", _linear_mla_hybrid,
            ("full_attention_layers", "kv_lora_rank", "qk_rope_head_dim"),
            "kimi_kda_mla_hybrid"),
    Formula("linear_mla_indexer_hybrid", "MLA layers + their indexer (KDA layers: state)",
            _linear_mla_indexer_hybrid, ("full_attention_layers", "kv_lora_rank",
                                         "qk_rope_head_dim", "index_head_dim"),
            None, has_indexer=True),
    Formula("gqa_indexer", "gqa + sparse layers x index_head_dim", _gqa_indexer,
            ("num_hidden_layers", "num_key_value_heads", "head_dim",
             "sparse_attention_layers", "index_head_dim"), "minimax_msa", has_indexer=True),
    Formula("compressed_hybrid", "window + floor(tokens/ratio) entries per layer",
            _compressed_hybrid, ("num_hidden_layers", "head_dim", "sliding_window",
                                 "index_head_dim", "compress_ratios"),
            "deepseek_v4_hybrid", uses_tokens=True, has_indexer=True),
    Formula("compressed_shared", "compressed entries of the KV / indexer source layers",
            _compressed_shared, ("num_hidden_layers", "head_dim", "index_head_dim",
                                 "compress_ratios"), None, uses_tokens=True,
            has_indexer=True),
    Formula("sliding_mla_indexer", "full MLA + windowed MLA + indexer", _sliding_mla_indexer,
            ("full_attention_layers", "sliding_attention_layers", "kv_lora_rank",
             "qk_rope_head_dim", "swa_kv_lora_rank", "swa_qk_rope_head_dim",
             "sliding_window", "index_head_dim"), None, uses_tokens=True, has_indexer=True),
    Formula("sliding_gqa_conv", "full + windowed GQA (convolution layers: state)",
            _sliding_gqa_conv, ("full_attention_layers", "sliding_attention_layers",
                                "num_key_value_heads", "head_dim", "swa_num_key_value_heads",
                                "swa_head_dim", "sliding_window"), None, uses_tokens=True),
)}


@dataclass(frozen=True)
class Model:
    id: str
    label: str
    formula: str
    fields: dict
    source: str
    family: str = ""
    default_precision: str = "bf16"
    kv_precision_fixed: str | None = None        # a format the model only ships in
    indexer_precision: str | None = None         # default indexer precision
    indexer_precision_fixed: str | None = None
    default_tokens: int = DEFAULT_TOKENS

    @property
    def spec(self) -> Formula:
        return FORMULAS[self.formula]

    def elements(self, tokens: int | None = None, draft: bool = False) -> Elements:
        """Per-token elements for sequences of ``tokens`` (default: the model's)."""
        tokens = max(1, int(tokens)) if tokens else self.default_tokens
        return self.spec.compute(Shape(self.id, self.fields), tokens, draft)

    def has_draft(self) -> bool:
        s = Shape(self.id, self.fields)
        if self.formula == "compressed_hybrid":
            return len(s.ratios()) > int(s("num_hidden_layers"))
        return s.draft_layers() > 0


@dataclass(frozen=True)
class Sizing:
    """The bytes per token of one model at one configuration, and how it was reached."""

    model: str
    bytes_per_token: float
    precision: str
    indexer_precision: str | None
    tokens: int | None
    draft: bool
    kv_bytes_per_token: float
    indexer_bytes_per_token: float

    def to_dict(self) -> dict:
        return {"id": self.model, "precision": self.precision,
                "indexerPrecision": self.indexer_precision, "estimateTokens": self.tokens,
                "includeDraftKv": self.draft, "bytesPerToken": self.bytes_per_token,
                "kvBytesPerToken": self.kv_bytes_per_token,
                "indexerBytesPerToken": self.indexer_bytes_per_token}


@dataclass(frozen=True)
class ModelTable:
    models: dict[str, Model]
    precisions: dict[str, float] = field(default_factory=dict)

    def get(self, model_id: str) -> Model:
        model = self.models.get(model_id)
        if model is None:
            raise UsageProblem(f"unknown model {model_id!r}; see `kvstore sim --list-models`, "
                               "or give --bytes-per-token")
        return model

    def _precision(self, name: str, what: str) -> float:
        name = PRECISION_ALIASES.get(name, name)
        if name not in self.precisions:
            raise UsageProblem(f"unknown {what} {name!r}; use one of "
                               f"{', '.join(self.precisions)}")
        return self.precisions[name]

    def sizing(self, model_id: str, precision: str | None = None, *,
               indexer_precision: str | None = None, tokens: int | None = None,
               draft: bool = False) -> Sizing:
        """Bytes per token of a model. ``precision`` defaults to the model's; a model
        that ships in one format only keeps it. ``tokens`` matters only to formulas with
        sliding-window or compressed layers. ``draft`` adds the draft model's KV."""
        model = self.get(model_id)
        precision = PRECISION_ALIASES.get(precision, precision)
        indexer_precision = PRECISION_ALIASES.get(indexer_precision, indexer_precision)
        kv_name = model.kv_precision_fixed or precision or model.default_precision
        kv = self._precision(kv_name, "precision")
        idx_name = None
        idx = 0.0
        if model.spec.has_indexer:
            idx_name = (model.indexer_precision_fixed or indexer_precision
                        or model.indexer_precision or kv_name)
            idx = self._precision(idx_name, "indexer precision")
        used_tokens = (max(1, int(tokens)) if tokens else model.default_tokens) \
            if model.spec.uses_tokens else None
        draft = draft and model.has_draft()
        e = model.elements(used_tokens, draft)
        kv_bytes = e.kv * kv
        idx_bytes = e.indexer * idx + e.fixed_bytes
        return Sizing(model.id, _tidy(kv_bytes + idx_bytes), kv_name, idx_name, used_tokens,
                      draft, _tidy(kv_bytes), _tidy(idx_bytes))

    def bytes_per_token(self, model_id: str, precision: str | None = None, **kw) -> float:
        return self.sizing(model_id, precision, **kw).bytes_per_token

    def rows(self) -> list[dict]:
        """One row per model with its bytes per token at every precision."""
        out = []
        for m in self.models.values():
            precisions = [m.kv_precision_fixed] if m.kv_precision_fixed else list(
                self.precisions)
            out.append({
                "id": m.id, "label": m.label, "family": m.family, "formula": m.formula,
                "shape": {k: v for k, v in m.fields.items() if k in m.spec.required},
                "source": m.source, "defaultPrecision": m.default_precision,
                "tokenDependent": m.spec.uses_tokens,
                "bytesPerToken": {p: self.bytes_per_token(m.id, p) for p in precisions}})
        return out


def _tidy(value: float) -> float:
    return int(value) if value == int(value) else value


_META = {"label", "family", "formula", "source", "default_precision", "kv_precision_fixed",
         "indexer_precision", "indexer_precision_fixed", "default_tokens"}


def _field_value(value: object) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return value >= 0
    return isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)


def _parse(data: dict, origin: str) -> tuple[dict[str, Model], dict[str, float]]:
    precisions = {str(k): float(v) for k, v in data.get("precisions", {}).items()}
    models = {}
    for model_id, entry in data.get("models", {}).items():
        formula = entry.get("formula")
        if formula not in FORMULAS:
            raise UsageProblem(f"{origin}: model {model_id!r} has formula {formula!r}; use "
                               f"one of {', '.join(FORMULAS)}")
        fields = {}
        for name, value in entry.items():
            if name in _META:
                continue
            if not _field_value(value):
                raise UsageProblem(f"{origin}: model {model_id!r}: {name} must be a number "
                                   f">= 0 (or a list of numbers), got {value!r}")
            fields[_ALIASES.get(name, name)] = value
        for name in FORMULAS[formula].required:
            value = fields.get(name)
            if name == "compress_ratios":
                ok = isinstance(value, list) and bool(value)
            else:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok:
                short = next((k for k, v in _ALIASES.items() if v == name), None)
                also = f" (or {short})" if short else ""
                raise UsageProblem(f"{origin}: model {model_id!r} ({formula}) needs "
                                   f"{name}{also}, a number >= 0")
        models[model_id] = Model(
            model_id, str(entry.get("label", model_id)), formula, fields,
            str(entry.get("source", "")), str(entry.get("family", "")),
            str(entry.get("default_precision", "bf16")), entry.get("kv_precision_fixed"),
            entry.get("indexer_precision"), entry.get("indexer_precision_fixed"),
            int(entry.get("default_tokens", DEFAULT_TOKENS)))
    return models, precisions


def load(extra: Path | None = None) -> ModelTable:
    """The packaged table, with the entries of ``extra`` added or overriding."""
    packaged = resources.files("kvstored.tools").joinpath("data/models.toml").read_text()
    models, precisions = _parse(tomllib.loads(packaged), "models.toml")
    if extra is not None:
        try:
            data = tomllib.loads(Path(extra).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise UsageProblem(f"{extra}: cannot read the model file ({exc})") from None
        more_models, more_precisions = _parse(data, str(extra))
        models.update(more_models)
        precisions.update(more_precisions)
    for model in models.values():
        for name in (model.default_precision, model.kv_precision_fixed,
                     model.indexer_precision, model.indexer_precision_fixed):
            if name is not None and name not in precisions:
                raise UsageProblem(f"model {model.id!r} names precision {name!r}, which the "
                                   f"table does not define ({', '.join(precisions)})")
    return ModelTable(models, precisions)
