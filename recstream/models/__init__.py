"""CTR models built from a [`Schema`][recstream.data.schema.Schema]: Wide&Deep, DeepFM, DCN-V2, DLRM.

Every model is a plain ``torch.nn.Module`` whose ``forward(features)`` takes a
`Features` and returns LOGITS ``[B]``: train with
``torch.nn.BCEWithLogitsLoss``, evaluate with `ctr_metrics` (AUC on logits, log
loss on sigmoid(logits)), get probabilities with ``model.predict_proba(features)``.
Embedding tables live in one fused `EmbeddingBagCollection` per
model part with sparse gradients; ``dynamic=True`` features (any int64 ids) get a
[`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] each instead (`recstream.models.dynamic`), in any mix.
`default_optimizer` pairs all tables with the row-sparse optimizers of
`recstream.optim` (FTRL for WideDeep's wide part).

>>> import torch
>>> from recstream import Model
>>> from recstream.data import SyntheticCTR
>>> from recstream.models import DeepFM, ctr_metrics, default_optimizer
>>> gen = SyntheticCTR(num_dense=2, num_categorical=3, vocab_sizes=[10, 20, 30], batch_size=64)
>>> net = DeepFM(gen.schema, hidden=(16,), embedding_dim=4)
>>> model = Model(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), metrics=ctr_metrics(),
...               progress_bar=False)
>>> history = model.train(1, gen.train_batches(4))
>>> 0.0 <= model.eval(gen.test_split(256))["auc"] <= 1.0
True
"""
from .base import CTRModel
from .cross import CrossNetwork
from .dcn_v2 import DCNv2
from .deepfm import DeepFM, fm_interaction
from .dlrm import DLRM
from .embedding import FeatureEmbedding
from .linear import LinearTerm
from .logit_metrics import OnProbabilities, ctr_metrics
from .mlp import MLP
from .recommended_optimizer import default_optimizer
from .wide_deep import WideDeep

__all__ = ["CTRModel", "CrossNetwork", "DCNv2", "DLRM", "DeepFM", "FeatureEmbedding", "LinearTerm", "MLP",
           "OnProbabilities", "WideDeep", "ctr_metrics", "default_optimizer", "fm_interaction"]
