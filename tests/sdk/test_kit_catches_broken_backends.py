"""The kit is only worth something if it fails bad backends: each broken backend below
(tests/sdk/broken_backends.py: a built-in with one realistic defect) must fail the checks
aimed at its clause, and the honest built-in must pass the same checks. Every clause of
the contract has at least one such backend."""

import pytest

from kvstored.sdk.testing import CHECKS, CheckStatus, check_backend, run_kit
from kvstored.sdk.testing.checks._common import Clause
from tests.sdk import broken_backends

MODULE = "tests.sdk.broken_backends"

#: Broken backend -> the checks that must fail on it.
CASES = {
    "SkipsChecksum": {"flipped_value_byte", "flipped_header_byte"},
    "StaleCache": {"delete_then_rewrite"},
    "ResurrectsDeletes": {"delete_stays_deleted"},
    "IgnoresCapacity": {"capacity_never_exceeded"},
    "LosesAcknowledgedWrites": {"reopen_keeps_everything", "torn_write_process_killed"},
    "ClaimsKeyByKey": {"opposite_order_batches"},
    "TidiesWhenReadOnly": {"read_only_open_writes_nothing"},
    "TakesNoLock": {"second_open_is_refused"},
    "ChecksumFirstReadOnly": {"checksum_every_read"},
    "CacheKeptOnEviction": {"rewrite_after_delete_or_evict"},
    "TruncatedFileNames": {"long_keys_sharing_prefix"},
    "LazyDeletes": {"deletes_survive_kill"},
    "PinsIgnoredWhenFull": {"pins_hold_against_capacity_eviction"},
    "UncountedHeaders": {"disk_use_measured"},
    "LogicalDriftsOnEviction": {"counters_match_model"},
    "EvictsEverything": {"evict_frees_what_was_asked"},
    "EvictsOneObject": {"evict_frees_what_was_asked"},
    "AdmitsShortRecords": {"torn_write_truncated"},
    "DropsShortRecordsSilently": {"check_reports_dropped_record"},
    "RepairDeletesEvidence": {"repair_keeps_evidence"},
    "StatAfterClose": {"close_refuses_every_method"},
    "UsageStatsFiles": {"memory_only_calls_do_no_io"},
    "StatReadsHeader": {"memory_only_calls_do_no_io"},
    "FailsWholeBatch": {"batch_fails_per_item"},
    "TooLargeOnlyAlone": {"too_large_refused_in_any_batch"},
    "KeepsWriteBuffers": {"write_buffers_may_be_reused"},
    "ReadOnlyBufferUnchecked": {"read_only_buffer_refused"},
    "LeavesCorruptBytes": {"failed_read_leaves_no_value_bytes"},
    "SeqRestartsAtOpen": {"seq_grows_across_reopen"},
    "ScanPagesByPosition": {"scan_yields_each_once"},
    "NoSdkVersion": {"sdk_version_declared"},
    "TargetsNextMajor": {"sdk_version_declared"},
    "OverwritesExisting": {"put_existing_key"},
    "IgnoresMaxValueOption": {"capabilities_well_formed"},
    "SharedLocationOffByHeader": {"shared_objects_readable_elsewhere"},
    "StreamRepeatsIndex": {"read_stream_matches_batch_read", "read_stream_missing_and_bad_buffers"},
    "StreamBadIndex": {"read_stream_matches_batch_read", "read_stream_missing_and_bad_buffers"},
    "StreamLeaksPins": {"read_stream_closed_early_releases_pins"},
    "StreamSkipsChecksum": {"read_stream_corrupt_is_miss"},
}

#: The honest backend each broken one is derived from.
HONEST = {"SharedLocationOffByHeader": "3fs"}


@pytest.mark.parametrize("broken", sorted(CASES))
def test_kit_catches(broken, tmp_path):
    expected = CASES[broken]
    run = run_kit(f"{MODULE}:{broken}", directory=tmp_path, names=expected)
    outcomes = {o.name: o for o in run}
    assert set(outcomes) == expected
    not_failed = {name: o.status.value for name, o in outcomes.items()
                  if o.status is not CheckStatus.FAILED}
    assert not not_failed, f"the kit let {broken} through: {not_failed}"


@pytest.mark.parametrize("honest", sorted({HONEST.get(b, "file-per-key") for b in CASES}))
def test_honest_backend_passes_the_same_checks(honest, tmp_path):
    targets = set().union(*(c for b, c in CASES.items()
                            if HONEST.get(b, "file-per-key") == honest))
    outcomes = run_kit(honest, directory=tmp_path, names=targets)
    assert {o.name for o in outcomes} == targets
    assert all(o.status is CheckStatus.PASSED for o in outcomes), \
        [(o.name, o.error) for o in outcomes if o.status is not CheckStatus.PASSED]


def test_every_clause_has_a_broken_backend_the_kit_catches():
    clause_of = {c.name: c.clause for c in CHECKS}
    caught = {clause_of[name] for names in CASES.values() for name in names}
    assert caught == {c.value for c in Clause}, \
        f"clauses no broken backend exercises: {sorted({c.value for c in Clause} - caught)}"


def test_every_check_names_a_clause():
    assert all(c.clause in {cl.value for cl in Clause} for c in CHECKS)
    assert len({c.name for c in CHECKS}) == len(CHECKS)


def test_checks_needing_a_capability_are_not_applicable(tmp_path):
    """A backend that is not persistent (or not shared) gets those checks reported
    NOT_APPLICABLE, with the reason, and passes the rest it is given."""
    names = {"reopen_keeps_everything", "deletes_survive_kill", "torn_write_truncated",
             "shared_objects_readable_elsewhere", "roundtrip_4096", "checksum_every_read"}
    report = check_backend(broken_backends.ClaimsNotPersistent, directory=tmp_path,
                           names=names)
    status = {o.name: o.status for o in report.outcomes}
    assert status == {
        "reopen_keeps_everything": CheckStatus.NOT_APPLICABLE,
        "deletes_survive_kill": CheckStatus.NOT_APPLICABLE,
        "torn_write_truncated": CheckStatus.NOT_APPLICABLE,
        "shared_objects_readable_elsewhere": CheckStatus.NOT_APPLICABLE,
        "roundtrip_4096": CheckStatus.PASSED,
        "checksum_every_read": CheckStatus.PASSED,
    }, status
    reasons = {o.name: o.error for o in report.outcomes}
    assert "not persistent" in reasons["reopen_keeps_everything"]
    assert "not shared" in reasons["shared_objects_readable_elsewhere"]
    assert report.ok


def test_check_backend_takes_any_factory(tmp_path):
    """check_backend runs on a callable: a module-level factory reaches the checks that
    kill a child process; a lambda cannot, and those are reported not applicable."""
    names = {"deletes_survive_kill", "roundtrip_1mib"}
    report = check_backend(broken_backends.make_file_per_key, directory=tmp_path,
                           names=names)
    assert all(o.status is CheckStatus.PASSED for o in report.outcomes), report.outcomes
    report = check_backend(lambda path, **o: broken_backends.make_file_per_key(path, **o),
                           directory=tmp_path, names=names)
    status = {o.name: o.status for o in report.outcomes}
    assert status == {"deletes_survive_kill": CheckStatus.NOT_APPLICABLE,
                      "roundtrip_1mib": CheckStatus.PASSED}, report.outcomes
    broken = check_backend(broken_backends.LazyDeletes, directory=tmp_path,
                           names={"deletes_survive_kill"})
    assert not broken.ok
