"""Export a network as one self-contained file for other runtimes (:mod:`.exporter`).

:mod:`.signature` (the flat inputs of the exported graph), :mod:`.frozen_hash_lookup` and
:mod:`.frozen_dynamic_tables` (hash tables frozen into sorted keys for export), :mod:`.torchscript`
and :mod:`.onnx` (the formats beyond ``torch.export``), :mod:`.inputs` (raw instances -> the
export's inputs, as the server builds them: :func:`instances_to_inputs`).
"""
from .exporter import ExportError, export_model, export_published, find_publish_dir, load_export, read_signature
from .inputs import instances_to_inputs

__all__ = ["ExportError", "export_model", "export_published", "find_publish_dir", "instances_to_inputs",
           "load_export", "read_signature"]
