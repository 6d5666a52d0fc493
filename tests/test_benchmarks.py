"""The benchmark command's pipeline runs (tiny sizes: a smoke run, not a measurement)."""
import argparse
import copy
import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_the_benchmark_command_writes_its_tables_and_plots(tmp_path, monkeypatch):
    main = _load("__main__")
    boost = main.bench_boost.main(["--rows", "1024", "--test-rows", "2000", "--reps", "1", "--threads", "1",
                                   "--vocab", "500", "--hidden", "16", "--variants", "hand", "ceiling", "O0", "O1"])
    assert set(boost) == {"hand", "ceiling", "O0", "O1"} and boost["hand"]["vs_hand"] == 1.0
    # every figure is also a ratio to the ceiling of the same run; on a CPU the ceiling says it ran eagerly
    assert boost["ceiling"]["vs_ceiling"] == 1.0 and boost["ceiling"]["mode"].startswith("eager")
    assert all(r["vs_ceiling"] == pytest.approx(r["samples_per_s"] / boost["ceiling"]["samples_per_s"])
               for r in boost.values())
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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (the ceiling's CUDA graph)"))])
def test_the_ceiling_step_trains_exactly_like_a_textbook_adam_loop(device):
    """Its warm-up, capture and replays (CUDA) or eager steps (CPU) give the parameters of the plain loop."""
    boost = _load("bench_boost")
    torch.manual_seed(0)
    net = boost.FusedTable(50, 4, (8,), sparse=False).to(device)
    reference, initial = copy.deepcopy(net), copy.deepcopy(net)
    g = torch.Generator().manual_seed(0)
    batches = [tuple(t.to(device) for t in (torch.randn(32, boost.DENSE, generator=g),
                                            torch.randint(0, 50, (boost.FIELDS, 32), generator=g),
                                            torch.randint(0, 2, (32,), generator=g).float())) for _ in range(8)]
    seconds, how = boost._ceiling(net, batches, torch.device(device), lr=0.01)
    assert seconds > 0 and how.startswith("CUDA graph (3 eager warm-up steps, then 5 replays)" if device == "cuda"
                                          else "eager (a CUDA graph needs CUDA)"), how
    opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    for dense, ids, y in batches:
        opt.zero_grad()
        torch.nn.BCEWithLogitsLoss()(reference(dense, ids), y).backward()
        opt.step()
    for (name, got), want, before in zip(net.named_parameters(), reference.parameters(), initial.parameters(),
                                         strict=True):
        assert not torch.equal(got, before), f"{name} did not train"
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=name)


def test_the_time_budget_stops_before_a_repetition_that_would_overrun_it(capsys):
    boost = _load("bench_boost")
    results = boost.main(["--rows", "512", "--test-rows", "2000", "--reps", "3", "--threads", "1", "--vocab", "100",
                          "--hidden", "8", "--batch-size", "128", "--variants", "hand", "--time-budget", "1e-6"])
    assert "--time-budget 1e-06s: stopping after 1 of 3 repetitions" in capsys.readouterr().out
    assert results["hand"]["samples_per_s"] > 0  # the one repetition's table


def test_sync_debug_check_runs_the_steps_on_cpu_and_counts_them(tmp_path):
    check = _load("sync_debug_check")
    out = tmp_path / "sync.json"
    rc = check.main(["--device", "cpu", "--steps", "2", "--warm", "1", "--batch-size", "32", "--vocab", "50",
                     "--hidden", "8", "--cases", "widedeep_O0", "idiomatic_O1", "--out", str(out)])
    results = json.loads(out.read_text())["results"]
    assert rc == 0 and [r["case"] for r in results] == ["widedeep_O0", "idiomatic_O1"]
    assert all(r["passed"] and r["steady_steps"] == 2 and r["ops_per_step"] > 10 for r in results)
    assert all(r["sync_forcing_ops_per_step"] is not None for r in results)
    with pytest.raises(SystemExit):  # a case that does not exist is named, not skipped
        check.main(["--device", "cpu", "--cases", "nosuch_O0"])


def test_the_cuda_test_plugin_keeps_exactly_the_tests_that_mention_cuda(tmp_path):
    (tmp_path / "test_sample.py").write_text('''
import pytest
import torch

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_marked(): pass

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_param(device): pass

def test_body():
    torch.zeros(1, device="cuda")

def test_plain():
    """A docstring example the plugin drops.

    >>> 1
    1
    """
''')
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "cuda_tests", "-p", "no:cacheprovider", "-o",
                           "addopts=", "--doctest-modules", "--collect-only", "-q", str(tmp_path / "test_sample.py")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(BENCH)})
    ids = [line.split("::", 1)[1] for line in done.stdout.splitlines() if "::" in line]
    # test_param[cpu] too: its source (the decorator) names cuda; the plain test and the doctest are dropped
    assert ids == ["test_marked", "test_param[cpu]", "test_param[cuda]", "test_body"], done.stdout + done.stderr
    assert "4/6 tests collected (2 deselected)" in done.stdout, done.stdout


def test_the_micro_steps_benchmark_compares_the_same_stream_with_and_without(capsys):
    rows = _load("bench_micro_steps").main(["--batches", "5", "--batch-size", "40", "--micro", "none", "16",
                                            "--table", "hashed", "--table-size", "256"])
    assert [r["micro"] for r in rows] == [None, 16] and all(r["events"] == 4 * 40 for r in rows)
    assert all(0.0 <= r["auc"] <= 1.0 and r["events_per_s"] > 0 for r in rows)
    assert "micro_batch_size" in capsys.readouterr().out


def test_the_tiered_table_benchmark_quick_mode_measures_both_variants_and_restores():
    results = _load("bench_tiered").main(["--quick"])
    tiered, memory = results["tiered"], results["memory"]
    assert tiered["cache_rows"] == 2_000 and tiered["rows"] == memory["rows"] == 20_000
    assert 0 < tiered["hit_rate"] < 1  # a tiny cache on Zipf ids: hits and misses
    assert tiered["tier_read_bytes_per_step"] > 0 and tiered["tier_written_bytes_per_step"] > 0
    assert tiered["rows_read_per_step"] > 0
    assert tiered["page_faults_per_step"] >= 0 and memory["page_faults_per_step"] >= 0
    assert tiered["checkpoint_s"] > 0 and tiered["restore_s"] > 0  # the restore is checked against the commit
    assert tiered["restore_equal"] and tiered["rows_checked"] > 0 and tiered["store_disk_bytes"] > 0
    assert 0 < tiered["peak_rss_anon_mib"] <= tiered["peak_rss_mib"]
    assert results["tiered_vs_memory"] == tiered["samples_per_s"] / memory["samples_per_s"]
    assert set(_load("bench_tiered").parse(["--rows", "100", "--cache-rows", "7"]).__dict__) >= {"rows", "cache_rows"}
    # which thread bounds a step: each one's CPU, the prefetch's kernel share within its own
    assert 0 < tiered["train_cpu_ms_per_step"] and 0 < memory["train_cpu_ms_per_step"]
    assert 0 < tiered["prefetch_cpu_ms_per_step"] and 0 <= tiered["prefetch_kernel_ms_per_step"]
    assert tiered["prefetch_kernel_ms_per_step"] <= tiered["prefetch_cpu_ms_per_step"] + 1  # (clock granularity)
    assert tiered["head"] == memory["head"] == "linear"


def test_the_tiered_table_benchmark_puts_an_mlp_over_the_table_with_head_mlp():
    bench = _load("bench_tiered")
    net = bench.Net(bench.parse(["--quick", "--head", "mlp"]), None)
    assert [type(m).__name__ for m in net.head] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert [m.out_features for m in net.head if hasattr(m, "out_features")] == [256, 128, 1]


def test_the_tier_layout_benchmark_times_both_layouts_and_counts_the_faults_of_pages_written_back(tmp_path):
    """With --clean, every page written back faults on its next write through a map: the faults show in
    each layout (three files dirty about three times the pages of one file of records), not in rows
    written by pwrite."""
    results = _load("tier_layout").main(["--rows", "65536", "--rows-per-step", "512", "--steps", "6",
                                         "--clean", "2", "--rounds", "1", "--pwrite", "--private", "--flush", "3",
                                         "--dir", str(tmp_path)])
    three, one = results["runs"]["three files"][0], results["runs"]["one record"][0]
    pwrite, private = results["runs"]["one record, pwrite"][0], results["runs"]["one record, private map"][0]
    assert min(r["ms_per_step"] for r in (three, one, pwrite, private)) > 0
    assert three["page_faults_per_step"] > one["page_faults_per_step"] > pwrite["page_faults_per_step"]
    assert list(tmp_path.iterdir()) == []  # its files removed


def test_the_dynamic_reads_benchmark_counts_the_steps_that_read_with_and_without_the_copies():
    """24 ids a step into each of two tables of 300 rows (ids over 300: they never evict): the
    worst-case bounds run out at step 12, and again soon after each read; copies that land at once
    leave nothing to read, nor here do copies that land 2 steps late."""
    reads = _load("dynamic_reads")
    args = argparse.Namespace(model="widedeep", rows=300, capacity=300, batch_size=24, steps=24, id_features=2,
                              lag=2, low_watermark=0.95)
    none, lagged, now = (reads.count_reads(args, copies) for copies in ("none", "lag", "now"))
    assert none and none[0] == 12, none
    assert now == [] and len(lagged) < len(none), (lagged, none)


def test_the_lru_benchmark_times_every_select_against_the_torch_ops(capsys):
    """Each variant's row, its ratio to the torch ops of the same run; a select that differs from
    the torch ops' stops the benchmark."""
    lru = _load("bench_lru")
    assert lru.main(["--rows", "3000", "--k", "200", "--reps", "1", "--spans", "5,100000"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and
            line[2].isdigit()]
    variants = {"torch_ops", "static"} | ({"compiled"} if lru.native.kernels is not None else set())
    for span in ("5", "100,000"):
        got = {name.strip(): ratio.strip() for s, name, _, ratio in rows if s.strip() == span}
        assert set(got) == variants and got["torch_ops"] == "1.00x", got


@pytest.mark.e2e
def test_the_tiered_table_benchmark_survives_a_sigkill_past_its_checkpoint(tmp_path):
    """--sigkill: the run is a child that SIGKILLs itself after writes past its checkpoint; the store
    reopened holds the checkpoint's rows (weights and optimizer state)."""
    argv = ["--quick", "--variant", "tiered", "--sigkill", "--dir", str(tmp_path)]
    tiered = _load("bench_tiered").main(argv)["tiered"]
    assert tiered["sigkill_restore_equal"] is True and tiered["restore_equal"] is True
    assert tiered["reopen_after_sigkill_s"] > 0 and tiered["rows_checked"] > 0


def test_the_anchors_benchmark_scores_every_system_test_then_train_on_both_streams(capsys):
    bench = _load("bench_anchors")
    results = bench.main(["--quick"])
    installed = {name: importlib.util.find_spec(module) is not None
                 for name, module in (("Vowpal Wabbit", "vowpalwabbit"), ("River", "river"))}
    assert 0.35 < results["coldstart"]["new_users"] < 0.55 and results["drifting"]["new_users"] < 0.2
    for stream, res in results.items():
        systems = [r["system"] for r in res["rows"]]
        assert systems[-4:] == [c.name for c in bench.DEFAULTS + bench.BEST]
        assert any(s.startswith("VW") for s in systems) == installed["Vowpal Wabbit"], systems
        assert any(s.startswith("River") for s in systems) == installed["River"], systems
        assert len(res["missing"]) == 2 - sum(installed.values())
        assert res["bayes_row"]["auc"] == pytest.approx(res["bayes"], abs=1e-12)  # the truth scored alike
        for r in res["rows"]:  # every system learns something even from 6,144 scored events
            assert 0.55 < r["auc"] < res["bayes"] and r["events_per_s"] > 0, (stream, r)
            assert r["auc_new_users"] is not None and r["auc_known_users"] is not None
        one_step = [r for r in res["rows"] if r["system"] in {c.name for c in bench.DEFAULTS}]
        # the benchmark's own scorer and recstream's PrequentialMonitor agree (checked inside, kept here)
        assert all(r["prequential_monitor_auc"] == pytest.approx(r["auc"], abs=1e-12) for r in one_step)
    out = capsys.readouterr().out
    assert "| system | prequential AUC | gap to Bayes |" in out and "coldstart: 30 batches x 256" in out


def test_the_anchors_benchmark_skips_absent_anchors_with_the_install_line(monkeypatch, capsys):
    for module in ("vowpalwabbit", "river"):  # absent here even where they are installed
        monkeypatch.setitem(sys.modules, module, None)
    results = _load("bench_anchors").main(["--quick", "--streams", "coldstart"])
    line = "pip install vowpalwabbit==9.11.9 river==0.26.1"
    assert results["coldstart"]["missing"] == [f"Vowpal Wabbit: not installed ({line}), skipped",
                                               f"River: not installed ({line}), skipped"]
    assert [r["system"] for r in results["coldstart"]["rows"]][0] == "recstream WideDeep, default_optimizer"
    assert f"- River: not installed ({line}), skipped" in capsys.readouterr().out


def test_the_anchors_benchmarks_crosses_rows_feed_the_streams_crosses_to_the_linear_part():
    bench = _load("bench_anchors")
    stream = bench.load("coldstart", argparse.Namespace(batches=4, batch_size=64, warmup=0.5, seed=0))
    crossed = bench.Config("c", bench.DeepFM, crosses=True)
    schema, batches = bench._crossed(crossed, stream)
    assert schema.cross_names == ("user_x_genres", "age_x_genres", "gender_x_genres", "occupation_x_genres")
    assert all(b.features.keys == schema.feature_names for b in batches) and len(batches) == 4
    assert bench._crossed(bench.Config("plain", bench.DeepFM), stream) == (stream.schema, stream.batches)
    schema, _ = bench._crossed(crossed, stream, (("occupation", "item"),))  # --crosses
    assert schema.cross_names == ("occupation_x_item",)
    rows = bench.main(["--quick", "--no-anchors", "--streams", "drifting", "--only", "DeepFM, crosses"])["drifting"]
    assert [r["system"] for r in rows["rows"]] == ["recstream DeepFM, crosses"] and 0.55 < rows["rows"][0]["auc"] < 1


def test_the_anchors_benchmarks_exact_only_selects_whole_rows():
    bench = _load("bench_anchors")
    names = [c.name for c in bench.DEFAULTS + bench.BEST + bench.SEARCH]
    assert "recstream WideDeep, crosses, micro 16" in names and "recstream DeepFM, crosses, micro 16" not in names
    only = ["WideDeep, crosses", "DeepFM, crosses, micro 64"]
    assert [n for n in names if bench.selected(n, only, exact=True)] == [
        "recstream WideDeep, crosses", "recstream DeepFM, crosses, micro 64"]
    substring = [n for n in names if bench.selected(n, only)]  # without --exact: every row containing a text
    assert "recstream WideDeep, crosses, micro 16" in substring and len(substring) > 2
    assert all(bench.selected(n, None) for n in names)
    rows = bench.main(["--quick", "--no-anchors", "--search", "--exact", "--streams", "drifting",
                       "--only", "WideDeep, crosses, micro 16"])["drifting"]["rows"]
    assert [r["system"] for r in rows] == ["recstream WideDeep, crosses, micro 16"] and 0.55 < rows[0]["auc"] < 1


def test_the_anchors_benchmark_runs_every_seed_and_states_the_spread(capsys):
    bench = _load("bench_anchors")
    res = bench.main(["--quick", "--no-anchors", "--streams", "drifting", "--only", "DeepFM, crosses",
                      "--seeds", "0", "1"])["drifting"]
    assert sorted(res["by_seed"]) == [0, 1] and res["rows"] == res["by_seed"][0]["rows"]
    aucs = [res["by_seed"][k]["rows"][0]["auc"] for k in (0, 1)]
    assert aucs[0] != aucs[1]  # another seed draws another stream
    (row,) = res["summary"]["systems"]
    assert row["aucs"] == aucs and row["spread"] == pytest.approx(abs(aucs[0] - aucs[1]), abs=1e-15)
    assert row["mean"] == pytest.approx(sum(aucs) / 2, abs=1e-15)
    out = capsys.readouterr().out
    assert "drifting: 30 batches x 256, seed 1," in out and "drifting, seeds 0, 1:" in out
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--seed", "0", "--seeds", "1"])


def test_the_anchors_summary_gives_recstreams_margin_over_each_anchors_best_per_seed(capsys):
    bench = _load("bench_anchors")

    def seed(*aucs):
        names = ["VW a", "VW b", "River c", "recstream d", "recstream e"]
        return {"rows": [{"system": n, "auc": a} for n, a in zip(names, aucs, strict=True)]}
    summary = bench.summarize("s", {0: seed(0.70, 0.72, 0.71, 0.73, 0.69), 1: seed(0.71, 0.70, 0.74, 0.72, 0.73)})
    assert summary["margins"]["VW"] == pytest.approx([0.01, 0.02]) and summary["margins"]["River"] == pytest.approx(
        [0.02, -0.01])
    assert "recstream's best row minus River's best, per seed: +0.0200, -0.0100" in capsys.readouterr().out


def test_the_anchors_river_rows_get_vws_quadratic_pairs_as_crossed_tokens():
    bench = _load("bench_anchors")
    spaces = {"u": ["user=1"], "g": ["genres=4", "genres=5"], "i": ["item=7"]}
    x = bench.river_dict(spaces, [0.5], (("u", "g"), ("a", "i")))  # no attributes here: no a x i tokens
    assert x == {"user=1": 1.0, "genres=4": 1.0, "genres=5": 1.0, "item=7": 1.0, "user=1*genres=4": 1.0,
                 "user=1*genres=5": 1.0, "x0": 0.5}
    assert bench.river_dict(spaces, []) == {"user=1": 1.0, "genres=4": 1.0, "genres=5": 1.0, "item=7": 1.0}


def test_the_cold_start_benchmark_answers_unseen_ids_with_each_mechanism(capsys):
    bench = _load("bench_cold_start")
    stream = bench.ba.load("coldstart", argparse.Namespace(batches=6, batch_size=64, warmup=0.5, seed=0))
    flagged = bench.with_unseen_flags(stream)  # 1 exactly where no earlier batch had the id
    seen = set()
    for plain, b in zip(stream.batches, flagged.batches, strict=True):
        users = plain.features.bag("user")[0].tolist()
        assert b.features.bag("user_new")[0].tolist() == [int(u not in seen) for u in users]
        seen.update(users)
    net = bench.with_mean_answer(bench.DeepFM(stream.schema), init_too=True)
    table = net.embedding.dynamic.tables["user"]
    net(stream.batches[0].features)  # training mode: rows admitted
    with torch.no_grad():  # as if trained: the rows' mean far from zero
        table.values[bench.table_entries(table.state_dict())["row"]] += 0.5
    first = table.values.detach().clone()
    net.eval()
    net(stream.batches[1].features)  # scoring: unseen keys answer the count-weighted mean of the rows
    assert torch.allclose(table.default_value, bench.seen_mean(table))
    assert (table.default_value - 0.5).abs().max() < 0.05
    e = bench.table_entries(table.state_dict())
    w = e["counts"].double() * e["admitted"]
    assert torch.allclose(table.default_value.double(), (e["values"].double() * w[:, None]).sum(0) / w.sum())
    net.train()
    net(stream.batches[1].features)  # new users' rows start at the mean (+ their N(0, 0.01^2) draw)
    new_rows = (table.values.detach() != first).any(1) & (first == 0).all(1)
    assert new_rows.any() and (table.values.detach()[new_rows].mean(0) - 0.5).abs().max() < 0.05
    rows = bench.main(["--quick", "--streams", "coldstart", "--models", "WideDeep"])
    assert [r["mechanism"] for r in rows] == list(bench.MECHANISMS) and rows[0]["delta"] == 0
    assert all(0.55 < r["auc"] < 1 and r["delta"] is not None for r in rows)
    assert "| coldstart | 0 | WideDeep | unseen flag |" in capsys.readouterr().out


def _raw_and_backed_off(net, features):
    """(the embedding's own output, the AttributeBackoff's) of `features`, in eval mode."""
    emb = net.net.embedding
    with torch.no_grad():
        return type(emb).with_first_order(emb, features), emb.with_first_order(features)


def test_the_cold_start_benchmark_backs_unseen_ids_off_to_their_attributes():
    bench = _load("bench_cold_start")
    stream = bench.ba.load("coldstart", argparse.Namespace(batches=6, batch_size=64, warmup=0.5, seed=0))
    attrs = ("age", "gender", "occupation")
    f0, f1 = stream.batches[0].features, stream.batches[1].features
    users0 = set(f0.bag("user")[0].tolist())
    unseen = torch.tensor([u not in users0 for u in f1.bag("user")[0].tolist()])
    assert unseen.any() and (~unseen).any()

    def backed_off(**kw):
        torch.manual_seed(0)
        net = bench.AttributeBackoff(bench.DeepFM(stream.schema), {"user": attrs}, **kw)
        with torch.no_grad():  # a generator far from its zero start
            net.generators["user"].weight.normal_(0, 1.0)
            net.generators["user"].bias.fill_(0.3)
        net(f0)  # training: batch 0's users get rows
        net.eval()
        return net, net.net.embedding.dynamic.tables["user"]

    def generated(net, out):
        return net.generators["user"](torch.cat([out[:, slice(*net._slices[a])] for a in attrs], dim=1))

    lo, hi = (0, 8)  # the user's slice of the embedding's output (the schema's first feature, width 8)
    net, table = backed_off(start=False)
    (raw, raw_first), (out, first) = _raw_and_backed_off(net, f1)
    g = generated(net, raw).detach()
    assert raw[unseen, lo:hi].abs().max() == 0  # the table's own answer for an unseen user: zeros
    assert torch.allclose(out[unseen, lo:hi], g[unseen, 1:])
    assert torch.allclose(first[unseen], raw_first[unseen] + g[unseen, 0])
    assert torch.equal(out[~unseen], raw[~unseen]) and torch.equal(first[~unseen], raw_first[~unseen])
    assert torch.equal(out[:, hi:], raw[:, hi:])  # the other features' vectors as they were

    net, table = backed_off(start=True)  # batch 0's rows started at their user's generated vector
    raw0 = _raw_and_backed_off(net, f0)[0][0]
    keys = f0.bag("user")[0]
    rows = table.values.detach()[table.table.rows[table.table.find(keys)]]
    draw = rows - generated(net, raw0).detach()  # what is left: the row's N(0, 0.01^2) draw
    assert 0 < draw.abs().max() < 0.05 and generated(net, raw0).abs().mean() > 0.2

    net, table = backed_off(start=False, fade=16)  # known users: the generated vector, fading with sightings
    (raw, raw_first), (out, first) = _raw_and_backed_off(net, f1)
    g = generated(net, raw).detach()
    count = table.table.counts[table.table.find(f1.bag("user")[0])].double()
    weight = torch.where(unseen, torch.ones_like(count), (1 - count / 16).clamp(min=0)).float()
    assert torch.allclose(out[:, lo:hi], raw[:, lo:hi] + weight[:, None] * g[:, 1:], atol=1e-6)
    assert torch.allclose(first, raw_first + weight * g[:, 0], atol=1e-6)
    assert ((weight > 0) & (weight < 1)).any()


def test_the_freshness_benchmark_runs_the_whole_chain_and_reports_staleness():
    """`bench_freshness.py --quick`: real processes (produce, online, serve) through a directory and the
    in-memory Kafka broker; it reports staleness quantiles and stages, and the served versions advance.
    A smoke run on a shared machine: the bound is loose (a chain that stopped would grow without end)."""
    bench = _load("bench_freshness")
    results = bench.main(["--quick", "--json"])
    assert [r["source"] for r in results] == ["directory", "kafka"]
    for r in results:
        assert r["samples"] > 10 and r["versions_served"] >= 2, r
        assert 0 < r["p50"] <= r["p95"] <= r["p99"] <= r["max"] < 60, r
        assert r["events_per_s"] > 0 and r["trained"] > 0, r
        stages = r["stages"]
        assert stages["load"] > 0 and stages["taken->visible"] > 0 and stages["visible->served"] > 0, r
