"""Training: `Model`, the training cells, dataset helper and sink execution, mixed precision.

Where things live: `model.py` (the API), `loop.py` (the train/eval loops), `sink.py` (sink
execution and `DatasetHelper`), `cells.py` (step cells), `amp.py` / `loss_scale.py` (mixed
precision), `data_adapter.py` (datasets and batches), `checks.py` (argument checks).
"""
from .cells import TrainOneStepCell, WithEvalCell, WithLossCell
from .model import Model
from .rec_model import RecModel
from .sink import DataChannel, DatasetHelper, connect_network_with_dataset

__all__ = ["Model", "RecModel", "TrainOneStepCell", "WithEvalCell", "WithLossCell", "DatasetHelper",
           "DataChannel", "connect_network_with_dataset"]
