"""The model table: KV-cache bytes per token, kept as data in ``data/models.toml``."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kvstored.tools.errors import UsageProblem

PRECISIONS = ("bf16", "fp8", "fp4")
_FIELDS = {
    "gqa": ("layers", "kv_heads", "head_dim"),
    "mla": ("layers", "kv_lora_rank", "rope_dim"),
    "mla_indexer": ("layers", "kv_lora_rank", "rope_dim", "indexer_layers", "index_head_dim"),
}


@dataclass(frozen=True)
class Model:
    id: str
    label: str
    formula: str
    shape: dict[str, int]
    source: str

    def elements_per_token(self) -> int:
        """Cached elements per token, summed over the layers."""
        s = self.shape
        if self.formula == "gqa":
            return s["layers"] * 2 * s["kv_heads"] * s["head_dim"]
        elements = s["layers"] * (s["kv_lora_rank"] + s["rope_dim"])
        if self.formula == "mla_indexer":
            elements += s["indexer_layers"] * s["index_head_dim"]
        return elements


@dataclass(frozen=True)
class ModelTable:
    models: dict[str, Model]
    precisions: dict[str, float]

    def bytes_per_token(self, model_id: str, precision: str = "bf16") -> float:
        """KV bytes per token of a model at a precision; UsageProblem names what is known."""
        model = self.models.get(model_id)
        if model is None:
            raise UsageProblem(f"unknown model {model_id!r}; see `kvstore sim --list-models`, "
                               "or give --bytes-per-token")
        if precision not in self.precisions:
            raise UsageProblem(f"unknown precision {precision!r}; use one of "
                               f"{', '.join(self.precisions)}")
        value = model.elements_per_token() * self.precisions[precision]
        return int(value) if value == int(value) else value

    def rows(self) -> list[dict]:
        """One row per model with its bytes per token at every precision."""
        return [{"id": m.id, "label": m.label, "formula": m.formula, "shape": m.shape,
                 "source": m.source,
                 "bytesPerToken": {p: self.bytes_per_token(m.id, p) for p in self.precisions}}
                for m in self.models.values()]


def _parse(data: dict, origin: str) -> tuple[dict[str, Model], dict[str, float]]:
    precisions = {str(k): float(v) for k, v in data.get("precisions", {}).items()}
    models = {}
    for model_id, entry in data.get("models", {}).items():
        formula = entry.get("formula")
        if formula not in _FIELDS:
            raise UsageProblem(f"{origin}: model {model_id!r} has formula {formula!r}; use "
                               f"one of {', '.join(_FIELDS)}")
        shape = {}
        for name in _FIELDS[formula]:
            value = entry.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageProblem(f"{origin}: model {model_id!r} needs a positive integer "
                                   f"{name}")
            shape[name] = value
        models[model_id] = Model(model_id, str(entry.get("label", model_id)), formula, shape,
                                 str(entry.get("source", "")))
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
    return ModelTable(models, precisions)
