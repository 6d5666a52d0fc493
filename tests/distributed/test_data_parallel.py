"""data_parallel and hybrid_parallel on 2 gloo processes train exactly what 1 process trains with
the same global batch: the same losses, evaluation results (AUC over both ranks' data) and final
weights (sharded tables gathered back)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(out: Path, kind: str, ranks: int, mode: str = "data_parallel", *extra: str, device: str = "cpu") -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), RECSTREAM_TEST_DEVICE=device)
    if ranks == 1:
        cmd = [sys.executable, str(WORKER), str(out), kind, mode, *extra]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
               "--standalone", str(WORKER), str(out), kind, mode, *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    result["weights"] = load_file(out / "weights.safetensors")
    result["stdout"] = proc.stdout
    return result


@pytest.mark.parametrize("kind,mode", [("widedeep", "data_parallel"), ("mlp", "data_parallel"),
                                       ("widedeep", "hybrid_parallel")])
def test_two_ranks_match_one_process(tmp_path, kind, mode):
    one, two = _run(tmp_path / "one", kind, 1, mode), _run(tmp_path / "two", kind, 2, mode)
    assert one["cb_params"] == {"parallel_mode": "stand_alone", "device_number": 1, "rank": 0}
    assert two["cb_params"] == {"parallel_mode": mode, "device_number": 2, "rank": 0}
    sharded = {name for name, placement in two["placements"].items() if placement == "row_sharded"}
    if mode == "hybrid_parallel":
        assert sharded and all("fused_weight" in name for name in sharded)
        assert "row-sharded (rank 0: rows 0-" in two["stdout"]
    else:
        assert not sharded
    assert len(one["losses"]) == len(two["losses"]) == 12
    assert one["losses"] == pytest.approx(two["losses"], abs=1e-5)
    assert one["eval"] == pytest.approx(two["eval"], abs=1e-5)
    assert one["weights"].keys() == two["weights"].keys()
    for name, weight in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], weight, atol=1e-5, rtol=1e-5, msg=name)
    assert one["losses"][-1] < one["losses"][0]  # it trained


def test_model_checkpoint_under_hybrid_parallel_restores_in_one_process(tmp_path):
    """ModelCheckpoint on 2 hybrid_parallel ranks writes sharded checkpoints (every rank its rows),
    prunes them, and RecModel.restore loads the newest into a single process, every weight exact."""
    from recstream import RecModel
    from recstream.checkpoint import is_complete

    from .worker import build

    two = _run(tmp_path / "two", "widedeep", 2, "hybrid_parallel", str(tmp_path / "ckpt"))
    kept = sorted(os.listdir(tmp_path / "ckpt"))
    assert kept == ["w-2_4", "w-2_6"]  # saved at steps 5 (w-1_5), 10 and 12; 2 kept
    assert all(is_complete(tmp_path / "ckpt" / d) for d in kept)
    _, net, optimizer = build("widedeep")
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), optimizer, progress_bar=False)
    meta = model.restore(tmp_path / "ckpt")
    assert meta["cur_step_num"] == 12 and meta["epoch"] == 2
    for name, weight in two["weights"].items():
        torch.testing.assert_close(net.state_dict()[name], weight, rtol=0, atol=0, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind,mode", [("mlp", "data_parallel"), ("widedeep", "data_parallel"),
                                       ("widedeep", "hybrid_parallel")])
def test_two_ranks_on_cuda_match_one_process(tmp_path, kind, mode):
    """The same on the GPU (both ranks share it when there is one: gloo then carries the collectives)."""
    one = _run(tmp_path / "one", kind, 1, mode, device="cuda")
    two = _run(tmp_path / "two", kind, 2, mode, device="cuda")
    torch.testing.assert_close(two["losses"], one["losses"], rtol=1e-4, atol=1e-5)
    for name, weight in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], weight, rtol=1e-4, atol=1e-5)
