"""The kit is only worth something if it fails bad backends: each broken backend below
must fail the checks that target its defect (and the honest one must pass them)."""

import pytest

from kvstored.sdk.testing import run_kit

MODULE = "tests.sdk.broken_backends"

CASES = {
    "SkipsChecksum": {"flipped_value_byte", "flipped_header_byte"},
    "StaleCache": {"delete_then_rewrite"},
    "ResurrectsDeletes": {"delete_stays_deleted"},
    "IgnoresCapacity": {"capacity_never_exceeded"},
    "LosesAcknowledgedWrites": {"reopen_keeps_everything", "torn_write_process_killed"},
    "ClaimsKeyByKey": {"opposite_order_batches"},
    "TidiesWhenReadOnly": {"read_only_open_writes_nothing"},
    "TakesNoLock": {"second_open_is_refused"},
}


@pytest.mark.parametrize("broken", sorted(CASES))
def test_kit_catches(broken, tmp_path):
    expected = CASES[broken]
    run = run_kit(f"{MODULE}:{broken}", directory=tmp_path, names=expected)
    outcomes = {o.name: o for o in run}
    assert set(outcomes) == expected
    passed = [name for name, o in outcomes.items() if o.passed]
    assert not passed, f"the kit let {broken} pass {passed}"


def test_honest_backend_passes_the_same_checks(tmp_path):
    targets = set().union(*CASES.values())
    outcomes = run_kit("file-per-key", directory=tmp_path, names=targets)
    assert {o.name for o in outcomes} == targets
    assert outcomes and all(o.passed for o in outcomes), [o for o in outcomes if not o.passed]
