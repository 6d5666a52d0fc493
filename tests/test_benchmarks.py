"""The benchmark command's pipeline runs (tiny sizes: a smoke run, not a measurement)."""
import functools
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_the_benchmark_command_writes_its_tables_and_plots(tmp_path, monkeypatch):
    main = _load("__main__")
    boost = main.bench_boost.main(["--rows", "1024", "--test-rows", "2000", "--reps", "1", "--threads", "1",
                                   "--vocab", "500", "--hidden", "16", "--variants", "hand", "O0", "O1"])
    assert set(boost) == {"hand", "O0", "O1"} and boost["hand"]["vs_hand"] == 1.0
    rows = [_load("bench_rows").main(1000, kind, steps=2) for kind in ("fused", "hash")]
    assert all(r["ms_per_step"] > 0 and r["peak_rss_mib"] > 0 for r in rows)
    results = {"boost": boost, "batch_scaling": {256: {"hand": 1.0, "O1": 2.0}}, "rows_scaling": rows}
    text = main._markdown(results)
    assert "| O1 |" in text and "| 1,000 | hash |" in text
    assert main._plots(results, tmp_path) == ["boost.png", "batch_scaling.png", "rows_scaling.png"]
    assert all((tmp_path / name).stat().st_size > 1000 for name in ("boost.png", "rows_scaling.png"))


def test_comparison_systems_that_do_not_import_are_skipped_with_their_install_command(tmp_path, monkeypatch,
                                                                                        capsys):
    main = _load("__main__")
    for module in ("deepctr_torch", "torchrec"):  # absent here even where a developer installed them
        monkeypatch.setitem(sys.modules, module, None)
    results = main.main(["--skip", "boost", "batch", "rows", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "DeepCTR-Torch: not installed (pip install deepctr-torch==0.3.0), skipped" in out
    assert ("TorchRec: not installed (pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0 && pip install "
            "tensordict==0.15.3 pyre-extensions==0.0.32), skipped") in out
    assert all(why.startswith("not installed") for why in results["field"].values())
    text = (tmp_path / "results.md").read_text()
    assert "- DeepCTR-Torch: not installed (pip install deepctr-torch==0.3.0), skipped" in text


@pytest.mark.parametrize("system", ["DeepCTR-Torch", "TorchRec"])
def test_a_comparison_system_trains_on_the_benchmark_data_where_installed(system, tmp_path):
    main = _load("__main__")
    error = main.field_runners.available()[system]
    if error is not None:  # optional dependencies: benchmarks/field_runners.py says how to install them
        pytest.skip(f"{system} does not import here: {error}")
    field = functools.partial(main.field_runners.runners, systems=[system])
    boost = main.bench_boost.main(["--rows", "8192", "--test-rows", "4000", "--reps", "1", "--threads", "1",
                                   "--vocab", "500", "--hidden", "64", "--lr", "0.01", "--variants", "hand"],
                                  field=field)
    variants = main.field_runners.VARIANTS[system]
    assert list(boost) == ["hand", *variants]
    for v in variants:  # learnt from the data (the hand loop scores about 0.66 here), timed, memory measured
        assert boost[v]["auc"] > 0.6 and boost[v]["samples_per_s"] > 0 and boost[v]["vs_hand"] > 0
        assert boost[v]["peak_mib"] > 0
    results = {"boost": boost, "field": {system: "runs"}, "batch_scaling": {}, "rows_scaling": []}
    compared = main._markdown(results).split("## comparison systems")[1].split("## batch size")[0]
    assert all(f"| {v} |" in compared for v in ("hand", *variants))
    assert main._plots(results, tmp_path)[0] == "boost.png" and (tmp_path / "boost.png").stat().st_size > 1000


def test_the_directory_benchmark_runs_with_its_empty_directory_baseline():
    results = _load("bench_directory").main(["--consumed", "200", "--new", "20", "--rows-per-file", "3"])
    assert [r["consumed"] for r in results] == [0, 200] and results[0]["vs_empty"] == 1.0
    assert all(r["files_per_s"] > 0 and r["listings"] <= 3 for r in results)  # one listing, not two per file
