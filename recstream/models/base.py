"""The common base of the CTR models: logits out, probabilities on request.

Convention (all models of `recstream.models`): ``forward(features)`` returns one
LOGIT per example, shape ``[B]``, float32. Train with ``torch.nn.BCEWithLogitsLoss``
(numerically stable, and the fused sigmoid+log avoids a separate pass); evaluate with
`recstream.models.ctr_metrics` (AUC on logits, log loss on sigmoid(logits)); call
`CTRModel.predict_proba` for click probabilities in [0, 1].

>>> import torch
>>> from recstream.data import CategoricalFeature, Schema
>>> from recstream.data import Features
>>> from recstream.models import WideDeep
>>> net = WideDeep(Schema(["x"], [CategoricalFeature("c", vocab_size=5)]), hidden=(8,))
>>> x = Features.from_lengths(torch.randn(4, 1), torch.tensor([0, 1, 2, 3]), torch.ones(1, 4))
>>> net(x).shape, bool(((net.predict_proba(x) > 0) & (net.predict_proba(x) < 1)).all())
(torch.Size([4]), True)
"""
from __future__ import annotations

import torch
from torch import nn

from ..data.schema import Schema
from ..features import Features


class CTRModel(nn.Module):
    """Base class: subclasses set ``self.schema`` and implement ``forward -> logits [B]``."""

    schema: Schema

    def forward(self, features: Features) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def predict_proba(self, features: Features) -> torch.Tensor:
        """Click probabilities ``sigmoid(logits)``, ``[B]``, in eval mode without gradients."""
        was_training = self.training
        self.eval()
        try:
            return torch.sigmoid(self(features))
        finally:
            self.train(was_training)
