"""Comparison systems for `bench_boost`: DeepCTR-Torch and TorchRec on the very same data.

Each system trains on bench_boost's training batches (same rows, same order, batch size, embedding
dim, Adam at the same lr but for the fused tables below, one epoch) and is scored on the same test
split, so its samples/s, test AUC and peak memory sit in one table with the hand loop's. They are
optional: `available()` says which import, `runners(...)` builds the runs of those that do.
Install (in an environment with torch 2.13):

    pip install deepctr-torch==0.3.0
    pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0
    pip install tensordict==0.15.3 pyre-extensions==0.0.32

(``--no-deps``: torchrec's wheel asks for the CUDA ``fbgemm-gpu``; fbgemm-gpu-cpu 1.9.0's ops do not
load with torch 2.13.0, 1.8.0's do.) Runs, each timed like bench_boost's (model built outside the
clock, the epoch inside it):

- ``deepctr_wdl`` / ``deepctr_deepfm``: DeepCTR-Torch's WDL (dnn = bench_boost's ``--hidden``) and
  DeepFM (dnn 400-400-400, the DeepFM paper's), trained with its own ``.fit()`` (batch size, one
  epoch, no shuffling: bench_boost's batches in its order; verbose 0; the clock includes fit's own
  packing of the columns into one float tensor) and scored with ``.predict()``.
  Its L2 terms are set to 0: the hand loop's objective has none (and the embedding one would add a
  pass over every table row per step).
- ``torchrec``: an ``EmbeddingBagCollection`` (one table per field) + the same MLP, ``torch.optim.Adam``
  over all parameters (dense gradients, as the hand loop), fed ``KeyedJaggedTensor``s made before
  the clock starts.
- ``torchrec_fused``: ``FusedEmbeddingBagCollection``: FBGEMM's batched table kernel with its optimizer
  fused into the backward pass (on the CPU, no process group needed) + ``torch.optim.Adam`` on the MLP.
  FBGEMM's CPU kernels have no Adam (exact Adagrad, row-wise Adagrad and SGD only), so the tables use
  row-wise Adagrad at lr 0.05, the optimizer and lr of recstream's ``default_optimizer`` (the
  ``widedeep`` variants' tables).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import sys
import time
import types

import torch
from bench_boost import DENSE, FIELDS, _auc, _hand, _mlp, _plain, _sync
from torch import nn

DEEPFM_HIDDEN = (400, 400, 400)
FUSED_TABLE_LR = 0.05  # row-wise Adagrad's, as recstream's default_optimizer
VARIANTS = {"DeepCTR-Torch": ("deepctr_wdl", "deepctr_deepfm"), "TorchRec": ("torchrec", "torchrec_fused")}
SYSTEMS = {  # name: (modules its runner imports, how to install it)
    "DeepCTR-Torch": (("deepctr_torch",), "pip install deepctr-torch==0.3.0"),
    "TorchRec": (("torchrec", "fbgemm_gpu"), "pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0 "
                                             "&& pip install tensordict==0.15.3 pyre-extensions==0.0.32"),
}


def _no_version_check() -> None:
    """deepctr_torch's __init__ starts a thread that asks PyPI for a newer release (no timeout, and it
    needs `requests`): a benchmark sends no traffic, so that module, the version check, is stood in for."""
    if "deepctr_torch" not in sys.modules and importlib.util.find_spec("deepctr_torch") is not None:
        stub = types.ModuleType("deepctr_torch.utils")
        stub.check_version = lambda version: None
        sys.modules.setdefault("deepctr_torch.utils", stub)


def available(device: str = "cpu") -> dict[str, str | None]:
    """Each system: None if it imports (and runs on `device`), else the error that says why not."""
    _no_version_check()
    found = {}
    for name, (modules, _) in SYSTEMS.items():
        try:
            for module in modules:
                importlib.import_module(module)
            if name == "TorchRec" and torch.device(device).type == "cuda":  # fbgemm-gpu-cpu has no CUDA kernels
                try:
                    torch.ops.fbgemm.asynchronous_complete_cumsum(torch.ones(1, dtype=torch.int64, device=device))
                except Exception as exc:
                    raise RuntimeError(f"--device {device} needs fbgemm-gpu's CUDA build: {exc}") from exc
            found[name] = None
        except Exception as exc:  # a half-installed system fails in many ways (OSError: its ops)
            found[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return found


def runners(args, data, systems=("DeepCTR-Torch", "TorchRec")) -> dict:
    """``{variant: run() -> (seconds, auc)}`` of `systems` on bench_boost's `data`; their inputs are
    converted here, once, so neither the clock nor the peak memory of a run counts the conversion."""
    out = {}
    if "DeepCTR-Torch" in systems:
        arrays = _deepctr_arrays(data[1]), _deepctr_arrays(data[2])
        out["deepctr_wdl"] = lambda: run_deepctr(args, *arrays, "WDL")
        out["deepctr_deepfm"] = lambda: run_deepctr(args, *arrays, "DeepFM")
    if "TorchRec" in systems:
        kjts = _kjt_batches(data[1]), _kjt_batches(data[2])
        out["torchrec"] = lambda: run_torchrec(args, *kjts, fused=False)
        out["torchrec_fused"] = lambda: run_torchrec(args, *kjts, fused=True)
    return out


# --- DeepCTR-Torch --------------------------------------------------------------------------------
def _deepctr_arrays(batches):
    """({feature name: column}, labels): the input `.fit()` / `.predict()` take, rows in batch order."""
    plain = _plain(batches)
    dense = torch.cat([d for d, _, _ in plain]).cpu().numpy()
    ids = torch.cat([i for _, i, _ in plain], dim=1).cpu().numpy()
    columns = {f"d{i}": dense[:, i] for i in range(DENSE)} | {f"c{i}": ids[i] for i in range(FIELDS)}
    return columns, torch.cat([y for _, _, y in plain]).cpu().numpy()


def run_deepctr(args, train, test, model_name: str) -> tuple[float, float]:
    """DeepCTR-Torch's `model_name` ("WDL" / "DeepFM"), its own fit: (seconds of the epoch, test AUC)."""
    _no_version_check()
    from deepctr_torch.inputs import DenseFeat, SparseFeat
    from deepctr_torch.models import WDL, DeepFM

    from recstream.data.synthetic import roc_auc

    columns = ([DenseFeat(f"d{i}", 1) for i in range(DENSE)]
               + [SparseFeat(f"c{i}", vocabulary_size=args.vocab, embedding_dim=args.dim) for i in range(FIELDS)])
    torch.manual_seed(0)
    hidden = tuple(args.hidden) if model_name == "WDL" else DEEPFM_HIDDEN
    model = (WDL if model_name == "WDL" else DeepFM)(
        columns, columns, dnn_hidden_units=hidden, l2_reg_linear=0.0, l2_reg_embedding=0.0, seed=0,
        task="binary", device=str(torch.device(args.device)))
    model.compile(torch.optim.Adam(model.parameters(), lr=args.lr), "binary_crossentropy")
    device = torch.device(args.device)
    x, y = train
    with contextlib.redirect_stdout(io.StringIO()):  # fit prints the device and the sample count even at verbose 0
        _sync(device)
        start = time.perf_counter()
        model.fit(dict(x), y, batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False)
        _sync(device)
        seconds = time.perf_counter() - start
    scores = model.predict(dict(test[0]), batch_size=8192)
    return seconds, roc_auc(scores.reshape(-1), test[1])


# --- TorchRec -------------------------------------------------------------------------------------
class TorchRecNet(nn.Module):
    """The hand loop's network with TorchRec's tables: pooled embeddings of the KJT, the dense values, an MLP."""

    def __init__(self, tables: nn.Module, width: int, hidden: tuple[int, ...]):
        super().__init__()
        self.tables = tables
        self.mlp = _mlp(width, hidden)

    def forward(self, dense, kjt):
        return self.mlp(torch.cat([dense, self.tables(kjt).values()], dim=1)).squeeze(-1)


def _kjt_batches(batches):
    """(dense, KeyedJaggedTensor, label) per batch: one id per field and row, the field-major ids as they are."""
    from torchrec import KeyedJaggedTensor

    keys = [f"c{i}" for i in range(FIELDS)]
    out = []
    for dense, ids, y in _plain(batches):
        lengths = torch.ones(ids.numel(), dtype=torch.int64, device=ids.device)
        out.append((dense, KeyedJaggedTensor(keys=keys, values=ids.reshape(-1), lengths=lengths,
                                             offsets=torch.arange(ids.numel() + 1, device=ids.device)), y))
    return out


def run_torchrec(args, train, test, fused: bool) -> tuple[float, float]:
    """TorchRec's EmbeddingBagCollection (Adam, dense gradients) or its fused FBGEMM collection (row-wise
    Adagrad in the backward pass) + the MLP, in bench_boost's hand loop: (seconds of the epoch, test AUC)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.optim import RowWiseAdagrad

    device = torch.device(args.device)
    configs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=args.dim, num_embeddings=args.vocab,
                                  feature_names=[f"c{i}"]) for i in range(FIELDS)]
    torch.manual_seed(0)
    if fused:
        tables = FusedEmbeddingBagCollection(configs, optimizer_type=RowWiseAdagrad,
                                             optimizer_kwargs={"lr": FUSED_TABLE_LR}, device=device)
    else:
        tables = EmbeddingBagCollection(configs, device=device)
    net = TorchRecNet(tables, DENSE + FIELDS * args.dim, tuple(args.hidden)).to(device)
    # fused: the tables update themselves in backward; the optimizer here holds the MLP only
    params = net.mlp.parameters() if fused else net.parameters()
    seconds = _hand(net, [torch.optim.Adam(params, lr=args.lr)], train, device)
    return seconds, _auc(net, test, plain=True)

