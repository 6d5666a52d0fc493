"""Export a network as one self-contained file for other runtimes (`.exporter`).

`.signature` (the flat inputs of the exported graph), `.frozen_hash_lookup` and
`.frozen_dynamic_tables` (hash tables frozen into sorted keys for export), `.torchscript`
and `.onnx` (the formats beyond ``torch.export``), `.inputs` (raw instances -> the
export's inputs, as the server builds them: `instances_to_inputs`).
"""
from .exporter import ExportError, export_model, export_published, find_publish_dir, load_export, read_signature
from .inputs import instances_to_inputs

__all__ = ["ExportError", "export_model", "export_published", "find_publish_dir", "instances_to_inputs",
           "load_export", "read_signature"]
