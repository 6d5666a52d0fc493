"""Shared test fixtures: where the shared spec lives, deterministic torch settings, and the test tiers."""
import fnmatch
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RECSTREAM_SHARED", REPO.parent / "shared"))


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


# --- Test tiers (docs/index.md, "Running the tests"). Tier 1, the README's `python -m pytest`
# (pyproject's addopts select `-m "not e2e"`), is the units and doctests of every package, minutes
# on 2 cores. Tier 2, `python -m pytest -m e2e`, is what starts processes or brokers (CLI
# subprocesses, servers, torchrun jobs, the Kafka broker, the examples) and the slowest in-process
# tests. `.ci/run` runs both. A test joins tier 2 by `@pytest.mark.e2e` or by a line here: a file,
# or a file and a glob of test names ("Class::test_*" for methods), optionally with a glob of
# parameters ("test_x[*onnx*]"). tests/test_tiers.py fails when a test that starts a process is in
# neither, or when a line names a file or test that is not there.
E2E = (
    # subprocesses: the command line, run as a user runs it
    "tests/cli/test_cli_errors.py",
    "tests/cli/test_config_commands.py",
    "tests/cli/test_config_errors.py",
    "tests/cli/test_divergence.py",
    "tests/cli/test_export_cli.py",
    "tests/cli/test_online_cmd.py",
    "tests/cli/test_plot.py",
    "tests/cli/test_produce.py::test_a_file_into_kafka_with_ids_and_times",
    "tests/cli/test_produce.py::test_rate_paces_from_the_first_event",
    "tests/cli/test_publish.py",
    "tests/cli/test_train_resume.py",
    "tests/serving/server/test_cli_serve.py::test_an_unloadable_newest_version_is_skipped_not_fatal",
    "tests/serving/server/test_dynamic_features.py::test_recstream_serve_answers_a_never_seen_id",
    "tests/serving/server/test_hot_swap.py",
    "tests/serving/server/test_http_hardening.py::test_listen_backlog_is_not_five",
    "tests/serving/server/test_version_retry.py::test_serve_starts_on_the_good_version_past_bad_manifests",
    # subprocesses: a fresh interpreter (imports, a missing extra, a full disk, signals)
    "tests/callbacks/test_mlflow_logger.py::test_missing_mlflow_names_the_extra_and_importing_recstream_does_not_import_it",
    "tests/callbacks/test_model_checkpoint.py::test_full_disk_gives_a_clear_error_and_keeps_the_last_checkpoint",
    "tests/data/streams/test_optional_kafka.py",
    "tests/test_benchmarks.py::test_the_cuda_test_plugin_keeps_exactly_the_tests_that_mention_cuda",
    "tests/test_benchmarks.py::test_the_freshness_benchmark_runs_the_whole_chain_and_reports_staleness",
    "tests/test_docs.py::test_docs_block_runs",
    "tests/test_docs.py::test_a_docstring_example_of_a_missing_extra_is_skipped_with_its_install_line",
    "tests/test_readme.py::test_readme_block_runs",
    "tests/train/test_exactly_once_kill.py",
    "tests/train/test_prequential_resume.py::test_sigkill_*",
    "tests/checkpoint/test_leftovers.py::test_a_save_killed_by_sigkill_leaves_a_tmp_file_that_retention_removes",
    "tests/cli/test_run_log.py::test_a_process_killed_mid_write_leaves_a_file_the_next_run_continues",
    "tests/train/test_rec_model.py::test_signal_stops_cleanly_with_a_final_checkpoint",
    # the examples (the online one starts a trainer and a server)
    "tests/test_examples.py",
    # the Kafka broker (recstream.testing.TansuBroker) and PostgreSQL
    "tests/data/streams/test_deadletter_producer.py",
    "tests/data/streams/test_kafka.py",
    "tests/data/streams/test_kafka_durable.py",
    "tests/data/streams/test_kafka_frozen_commit.py",
    "tests/data/streams/test_kafka_outage.py",
    "tests/data/streams/test_kafka_ranks.py",
    "tests/data/streams/test_max_delay.py::test_a_slow_kafka_stream_*",
    "tests/data/streams/test_poison.py",
    "tests/train/test_finite_streams.py::test_*kafka*",
    "tests/train/test_online_stop.py",
    # export through torch.export (ONNX, ExportedProgram): seconds each; TorchScript stays in tier 1
    "tests/serving/export/test_export.py::*[*onnx*]",
    "tests/serving/export/test_export.py::*[*exported-program*]",
    # torchrun jobs of several ranks
    "tests/distributed/test_data_parallel.py",
    "tests/distributed/test_hash_sharding.py::test_two_ranks_*",
    "tests/distributed/test_online.py",
    "tests/distributed/test_resharding.py",
    "tests/distributed/test_sharded_checkpoint.py::test_two_ranks_*",
    "tests/distributed/test_sharded_checkpoint.py::test_rank_killed_*",
)


def split_entry(entry: str) -> tuple[str, str, str | None]:
    """`file::name_glob[param_glob]` -> (file, name glob, parameters glob or None)."""
    file, _, pattern = entry.partition("::")
    name, bracket, params = pattern.partition("[")
    return file, name or "*", params.removesuffix("]") if bracket else None


def in_tier2(nodeid: str) -> bool:
    """Whether the test `path::name[params]` (rootdir-relative, as pytest names it) is in `E2E`."""
    file, _, name = nodeid.partition("::")
    name, bracket, params = name.partition("[")
    for entry in E2E:
        entry_file, name_glob, params_glob = split_entry(entry)
        if file == entry_file and fnmatch.fnmatchcase(name, name_glob) and (
                params_glob is None or (bracket and fnmatch.fnmatchcase(params.removesuffix("]"), params_glob))):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # marked before `-m` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if in_tier2(item.nodeid):
            item.add_marker(pytest.mark.e2e)
