"""Training: `Model`, `RecModel`, the step cells, sink execution and mixed precision.

Where things live: `model.py` (the API and the train/eval loops), `rec_model.py` (online
training and resume), `sink.py` (`DatasetHelper`, `Sink` and the sink loop), `cells.py` (step
cells: the `train_step` extension point), `amp.py` / `loss_scale.py` (mixed precision),
`signals.py` (clean stop on SIGINT/SIGTERM). What a dataset and a batch may be is defined once,
in `recstream.data.protocol`.
"""
from ..data.channel import DataChannel
from .cells import TrainOneStepCell, WithEvalCell, WithLossCell
from .model import Model
from .rec_model import RecModel
from .sink import DatasetHelper, connect_network_with_dataset

__all__ = ["Model", "RecModel", "TrainOneStepCell", "WithEvalCell", "WithLossCell", "DatasetHelper",
           "DataChannel", "connect_network_with_dataset"]
