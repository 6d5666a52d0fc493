"""The benchmark command's pipeline runs (tiny sizes: a smoke run, not a measurement)."""
import importlib.util
import sys
from pathlib import Path

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
