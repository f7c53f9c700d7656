"""Every model of the reference simulator (PyPI ``kvcache-simulator``), at every precision
it knows, against our table: bytes per token to the last bit.

The reference is a test peer (the dev extra installs it); where it is missing the module
is skipped, and the rest of the model tests still run.
"""

from __future__ import annotations

import pytest

from kvstored.tools import models

calculator = pytest.importorskip("kvcache_sim.calculator")

REF = calculator.load_models_data()
REF_MODELS = {m["id"]: m for m in REF["models"]}
OUR_PRECISION = {"bf16_fp16": "bf16", "fp8_int8": "fp8", "fp4_int4": "fp4"}
TOKENS = (1, 37, 512, 1000, 4096, 12035, 262_144)
TABLE = models.load()
FORMULA_OF_REFERENCE = {f.reference: f.name for f in models.FORMULAS.values() if f.reference}


def _reference(model, **kw):
    try:
        return calculator.calculate_cache_size(model, models_data=REF, **kw)
    except ValueError as exc:
        if "Unsupported formula" in str(exc):
            return None
        raise


def test_every_reference_model_and_formula_is_in_the_table():
    assert len(REF_MODELS) == 62
    assert len({m["formula"] for m in REF_MODELS.values()}) == 12
    assert set(REF_MODELS) <= set(TABLE.models)
    for model_id, ref in REF_MODELS.items():
        ours = TABLE.models[model_id]
        if ref["formula"] in FORMULA_OF_REFERENCE:
            assert ours.formula == FORMULA_OF_REFERENCE[ref["formula"]], model_id
        else:  # a formula the reference lists but does not compute
            assert ours.spec.reference is None, model_id
            assert _reference(ref, tokens=4096) is None, (
                f"the reference now computes {ref['formula']}: cross-check {model_id}")
    assert len(models.FORMULAS) == 12


_COMPUTED = [m for m in REF_MODELS if _reference(REF_MODELS[m], tokens=4096) is not None]


def test_the_reference_computes_57_models():
    assert len(_COMPUTED) == 57


@pytest.mark.parametrize("model_id", _COMPUTED)
def test_bytes_per_token_match_the_reference(model_id):
    ref_model = REF_MODELS[model_id]
    indexer_choices = [None, *calculator.indexer_precision_options(REF)]
    checked = 0
    for precision in [None, *calculator.precision_options(REF)]:
        for indexer in indexer_choices:
            for draft in (False, True):
                for tokens in TOKENS:
                    want = _reference(ref_model, tokens=tokens, precision=precision,
                                      indexer_precision=indexer,
                                      include_draft_kv_cache=draft)
                    got = TABLE.sizing(model_id, OUR_PRECISION.get(precision),
                                       indexer_precision=OUR_PRECISION.get(indexer),
                                       tokens=tokens, draft=draft)
                    where = (model_id, precision, indexer, draft, tokens)
                    assert got.bytes_per_token == pytest.approx(want.bytes_per_token,
                                                                rel=1e-12), where
                    assert got.precision == OUR_PRECISION[want.precision], where
                    assert got.indexer_precision == (
                        OUR_PRECISION[want.indexer_precision] if want.indexer_precision
                        else None), where
                    checked += 1
    assert checked == 4 * 4 * 2 * len(TOKENS)


@pytest.mark.parametrize("model_id", sorted(set(REF_MODELS) - set(_COMPUTED)))
def test_models_the_reference_cannot_size_get_a_positive_size(model_id):
    for draft in (False, True):
        sizing = TABLE.sizing(model_id, tokens=4096, draft=draft)
        assert sizing.bytes_per_token > 0
    # a longer sequence never costs more per token (windows and compression only help)
    assert TABLE.bytes_per_token(model_id, tokens=100_000) <= \
        TABLE.bytes_per_token(model_id, tokens=100)
