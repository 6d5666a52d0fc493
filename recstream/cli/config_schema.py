"""The config schema of ``recstream train | eval | online``: pydantic models, one per section.

This module knows the fields; `config_document` reads the YAML text and places each mistake at
its ``file:line``; `run_command.load_config` puts the two together (this module imports neither).

Every section refuses unknown keys (naming the allowed ones) and wrong types (strict: ``"3"``
is not an int); values the library checks itself (a model's ``activation``, a reader's
options) are checked again when the objects are built, with the same ``file:line`` message.
The reference of every field is docs/cli.md; ``recstream init`` writes a commented example.

>>> cfg = Config.model_validate({"run_dir": "runs/x", "schema": {"criteo": {"hash_buckets": 1000}},
...                              "model": {"type": "deepfm", "hidden": [32]}})
>>> cfg.model.type, cfg.model.args(), cfg.train.epochs, cfg.optimizer.args()
('deepfm', {'hidden': [32]}, 1, {})
"""
from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

# = recstream.train.amp.AMP_LEVELS / recstream.train.model.BOOST_LEVELS (a test checks): validating a
# config must not wait for torch
AMP_LEVELS = ("O0", "O1", "O2", "O3", "auto")
BOOST_LEVELS = ("O0", "O1", "O2")
READER_FORMATS = ("criteo", "csv", "tsv", "parquet")
STREAM_FORMATS = ("criteo", "csv", "tsv", "jsonl", "parquet")
MAX_SEED = 2**64 - 1  # torch.manual_seed's largest
# Sizes of what the network allocates, bounded so that a slip (10**12 rows) is named at its field
# instead of ending in the allocator; build.py also checks that each table fits this machine's memory.
MAX_ROWS = 2**31 - 1  # rows of one embedding table (vocab_size, hash_buckets, capacity)
MAX_DIM = 4096  # an embedding's width
MAX_WIDTH = 65536  # a hidden layer's width (and low_rank, max_len)
MAX_LAYERS = 64  # hidden layers of one MLP, cross layers
Rows = Annotated[int, Field(gt=0, le=MAX_ROWS)]
Buckets = Annotated[int, Field(ge=2, le=MAX_ROWS)]
Dim = Annotated[int, Field(gt=0, le=MAX_DIM)]
Width = Annotated[int, Field(gt=0, le=MAX_WIDTH)]
Hidden = Annotated[list[Width], Field(max_length=MAX_LAYERS)]
# floats are finite: .inf / .nan in a config are mistakes, not settings
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0, lt=1)]


class Section(BaseModel):
    """A config section: strict types, and unknown keys named with the allowed ones."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if key not in cls.model_fields:
                    raise PydanticCustomError("unknown_key", "unknown key '{key}'; allowed keys: {allowed}",
                                              {"key": key, "value": value, "allowed": ", ".join(cls.model_fields)})
        return data

    def args(self, exclude: tuple[str, ...] = ()) -> dict:
        """The keys written in the file (the library's defaults apply to the others)."""
        return self.model_dump(exclude_unset=True, exclude=set(exclude))


def existing_path(value: str) -> str:
    """A file or directory that exists (relative paths are from the current directory)."""
    if not os.path.exists(value):
        raise PydanticCustomError("no_such_path", "no such file or directory: {path} (relative paths are read "
                                  "from the current directory, {cwd})", {"path": value, "cwd": os.getcwd()})
    return value


def _no_nul(value: str) -> str:
    if "\0" in value:
        raise PydanticCustomError("nul_in_path", "a path cannot hold a NUL character (\\0)")
    return value


# a file or directory name (lone surrogates are refused in every string by ConfigDocument)
PathStr = Annotated[str, AfterValidator(_no_nul)]


# --- schema ---------------------------------------------------------------------------------
class CriteoSchema(Section):
    """The Criteo columns (label, I1..I13, C1..C26), `recstream.data.criteo_schema`."""

    hash_buckets: Buckets = 100_000
    embedding_dim: Dim = 16


class CategoricalColumn(Section):
    """One categorical column (`recstream.data.CategoricalFeature`); one of vocab_size /
    hash_buckets / vocabulary / dynamic (any int64 or string id, in a hash table of capacity rows)."""

    name: str
    vocab_size: Rows | None = None
    hash_buckets: Buckets | None = None
    vocabulary: list[str] | None = None
    dynamic: bool = False
    capacity: Rows | None = None
    permit_filter_value: PositiveInt = 1
    evict_filter_value: PositiveInt | None = None
    table: str | None = None
    embedding_dim: Dim = 16
    multi_hot: bool = False
    max_len: Width | None = None
    pooling: Literal["sum", "mean"] = "sum"
    separator: str = "|"


class CrossColumn(Section):
    """One cross of categorical columns (`recstream.data.CrossFeature`): hashed, fed to the wide part
    unless ``deep: true``."""

    name: str
    features: list[str]
    hash_buckets: Buckets
    embedding_dim: Dim = 16
    deep: bool = False


class SchemaSection(Section):
    """Where the schema comes from: ``criteo:``, ``file:`` (Schema JSON) or ``dense:``/``categorical:``
    (with optional ``crosses:`` of the categorical columns)."""

    criteo: CriteoSchema | None = None
    file: PathStr | None = None
    dense: list[str] = []
    categorical: list[CategoricalColumn] = []
    crosses: list[CrossColumn] = []
    label: str = "label"

    @field_validator("file")
    @classmethod
    def _file_exists(cls, value: str | None) -> str | None:
        return value if value is None else existing_path(value)

    @model_validator(mode="after")
    def _one_source(self) -> SchemaSection:
        given = [name for name, set_ in (("criteo", self.criteo is not None), ("file", self.file is not None),
                                         ("dense/categorical", bool(self.dense or self.categorical))) if set_]
        if len(given) != 1:
            raise PydanticCustomError("schema_source", "give exactly one of criteo:, file: or dense:/categorical:, "
                                      "got {given}", {"given": ", ".join(given) or "none"})
        if self.crosses and not self.categorical:
            raise PydanticCustomError("crosses_source", "crosses: cross the columns of categorical: (a file: schema "
                                      "carries its own 'crosses'; criteo: has none)")
        return self


# --- data -----------------------------------------------------------------------------------
class FileData(Section):
    """Files read by a `recstream.data` reader (a file, a directory of files, or a list)."""

    format: Literal[READER_FORMATS]
    path: list[PathStr]
    batch_size: PositiveInt = 1024
    header: bool = True
    delimiter: str | None = None
    on_bad_row: Literal["raise", "skip"] = "raise"
    fill_missing_dense: Annotated[float, Field(allow_inf_nan=False)] | None = None
    log1p_dense: bool = False
    drop_remainder: bool = False

    _one_path = field_validator("path", mode="before")(classmethod(lambda cls, v: [v] if isinstance(v, str) else v))

    @field_validator("path")
    @classmethod
    def _paths_exist(cls, value: list[str]) -> list[str]:
        if not value:
            raise PydanticCustomError("no_path", "must name at least one file or directory")
        for item in value:
            existing_path(item)
        return value


class DataSection(Section):
    train: FileData | None = None
    eval: FileData | None = None


class DirectorySource(Section):
    """Files arriving in a directory, `recstream.data.streams.DirectoryStream`."""

    path: PathStr
    format: Literal[STREAM_FORMATS] = "csv"
    pattern: str | None = None
    header: bool = False
    poll_interval: PositiveFloat = 0.2

    @field_validator("path")
    @classmethod
    def _path_exists(cls, value: str) -> str:
        return existing_path(value)


class KafkaSource(Section):
    """A Kafka topic, `recstream.data.streams.KafkaStream` (``pip install 'recstream[kafka]'``)."""

    topics: list[str]
    bootstrap_servers: str
    group_id: str = "recstream"
    format: Literal["criteo", "csv", "jsonl"] = "csv"
    start: Literal["earliest", "latest"] = "earliest"
    partitions: list[NonNegativeInt] | None = None  # explicit assignment: no group membership, no rebalances
    consumer_config: dict[str, str | int | float | bool] | None = None  # librdkafka settings, e.g. security

    _one_topic = field_validator("topics", mode="before")(classmethod(lambda cls, v: [v] if isinstance(v, str) else v))


class StreamSection(Section):
    """The online source: exactly one of ``directory:`` / ``kafka:``, and how batches are cut."""

    directory: DirectorySource | None = None
    kafka: KafkaSource | None = None
    batch_size: PositiveInt = 1024
    micro_batch_size: PositiveInt | None = None  # train each batch as steps of this many rows (RecModel.online_train)
    id_column: str | None = None
    time_column: str | None = None
    idle_timeout: NonNegativeFloat | None = None
    # a short batch once its oldest row waited this long (seconds; none: wait until full): on a slow
    # stream, a step, hence a fresh version to publish, at least this often (docs/online.md)
    max_delay: NonNegativeFloat | None = None
    max_batches: NonNegativeInt | None = None
    dead_letter: PathStr | None = None

    @model_validator(mode="after")
    def _one_source(self) -> StreamSection:
        if (self.directory is None) == (self.kafka is None):
            raise PydanticCustomError("stream_source", "give exactly one of directory: or kafka:")
        return self


# --- model, optimizer -----------------------------------------------------------------------
Activation = Literal["relu", "gelu", "silu", "tanh", "sigmoid"]


class DiskTierSection(Section):
    """``model: disk_tier:`` -- tables kept on disk behind a cache (`recstream.nn.TierPlan`; a dynamic
    feature's HashEmbedding too): ``cache_rows`` maps feature names to the rows cached in memory; the
    stores go under ``directory`` (a relative one under ``run_dir``: the stores are part of the run's checkpoints)."""

    directory: PathStr
    cache_rows: dict[str, Rows]


class _Net(Section):
    embedding_dim: Dim | None = None
    dropout: Probability = 0.0
    batch_norm: bool = False
    activation: Activation = "relu"
    init_std: PositiveFloat = 0.01
    disk_tier: DiskTierSection | None = None

    def args(self, exclude: tuple[str, ...] = ("type",)) -> dict:
        return super().args(exclude)


class WideDeepArgs(_Net):
    type: Literal["widedeep"]
    hidden: Hidden = [256, 128]
    wide_dense: bool = True


class DeepFMArgs(_Net):
    type: Literal["deepfm"]
    hidden: Hidden = [256, 128]


class DCNv2Args(_Net):
    type: Literal["dcnv2"]
    num_cross_layers: Annotated[int, Field(gt=0, le=MAX_LAYERS)] = 3
    hidden: Hidden = [256, 128]
    structure: Literal["stacked", "parallel"] = "stacked"
    low_rank: Width | None = None


class DLRMArgs(_Net):
    type: Literal["dlrm"]
    bottom: Hidden = [64]
    top: Hidden = [256, 128]
    self_interaction: bool = False


ModelSection = Annotated[WideDeepArgs | DeepFMArgs | DCNv2Args | DLRMArgs, Field(discriminator="type")]
MODEL_TYPES = ("widedeep", "deepfm", "dcnv2", "dlrm")


class OptimizerSection(Section):
    """Arguments of `recstream.models.default_optimizer`."""

    lr: PositiveFloat = 1e-3
    embedding: Literal["lazy_adam", "rowwise_adagrad"] = "rowwise_adagrad"  # default_optimizer's
    embedding_lr: PositiveFloat | None = None
    embedding_initial_accumulator: NonNegativeFloat | None = None  # None: default_optimizer's (1e-6)
    wide: Literal["ftrl", "same"] = "ftrl"
    wide_lr: PositiveFloat = 0.05
    wide_l1: NonNegativeFloat = 0.0
    wide_l2: NonNegativeFloat = 0.0
    weight_decay: NonNegativeFloat = 0.0


# --- training, callbacks --------------------------------------------------------------------
class TrainSection(Section):
    """How `Model.fit` (and `RecModel.online_train`) run."""

    epochs: PositiveInt = 1
    valid_frequency: PositiveInt = 1
    amp_level: Literal[AMP_LEVELS] = "O0"
    boost_level: Literal[BOOST_LEVELS] = "O0"
    sink_mode: bool = False
    sink_size: int = -1
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    threads: PositiveInt | None = None
    device: str | None = None

    @field_validator("sink_size")
    @classmethod
    def _sink_size(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise PydanticCustomError("sink_size", "must be -1 (a whole epoch per sink) or an int >= 1")
        return value


class CheckpointSection(Section):
    every_steps: PositiveInt | None = None
    every_seconds: PositiveInt | None = None
    keep: PositiveInt = 3

    @model_validator(mode="after")
    def _when(self) -> CheckpointSection:
        if self.every_steps is not None and self.every_seconds is not None:
            raise PydanticCustomError("checkpoint_when", "give every_steps or every_seconds, not both")
        return self


class EarlyStoppingSection(Section):
    monitor: str = "eval_loss"
    patience: NonNegativeInt = 0
    min_delta: NonNegativeFloat = 0.0
    mode: Literal["auto", "min", "max"] = "auto"
    restore_best_weights: bool = False


class TensorBoardSection(Section):
    every_steps: PositiveInt | None = None  # None: once per epoch


class PrequentialSection(Section):
    window: PositiveInt = 10_000
    log_every: PositiveInt = 100


class CallbacksSection(Section):
    checkpoint: CheckpointSection | None = None
    early_stopping: EarlyStoppingSection | None = None
    tensorboard: TensorBoardSection | None = None
    prequential: PrequentialSection | None = None


class PublishSection(Section):
    """Model versions for serving, `recstream.serving.ModelPublisher` (train and online)."""

    directory: PathStr | None = None  # default: <run_dir>/published
    every_steps: PositiveInt | None = None
    every_seconds: PositiveFloat | None = None  # neither given: online every ONLINE_PUBLISH_SECONDS, train at the end
    keep: PositiveInt = 5
    full_every: PositiveInt = 10
    on_error: Literal["log", "raise"] = "log"

    @field_validator("directory")
    @classmethod
    def _a_directory(cls, value: str | None) -> str | None:
        if value is not None and os.path.exists(value) and not os.path.isdir(value):
            raise PydanticCustomError("not_a_directory", "must be a directory (or a path to create), it is a file")
        return value


class EvalSection(Section):
    checkpoint: PathStr | None = None  # a file or directory, newest or best; default: newest (<run_dir>/checkpoints)

    @field_validator("checkpoint")
    @classmethod
    def _exists(cls, value: str | None) -> str | None:
        return value if value is None or value in ("best", "newest") else existing_path(value)


class Config(Section):
    """A whole config file (see docs/cli.md)."""

    run_dir: PathStr
    schema_: SchemaSection = Field(alias="schema")
    data: DataSection = DataSection()
    stream: StreamSection | None = None
    model: ModelSection
    optimizer: OptimizerSection = OptimizerSection()
    train: TrainSection = TrainSection()
    callbacks: CallbacksSection = CallbacksSection()
    publish: PublishSection | None = None
    eval: EvalSection = EvalSection()

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=False)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        allowed = [f.alias or name for name, f in cls.model_fields.items()]
        if isinstance(data, dict):
            for key, value in data.items():
                if key not in allowed:
                    raise PydanticCustomError("unknown_key", "unknown key '{key}'; allowed keys: {allowed}",
                                              {"key": key, "value": value, "allowed": ", ".join(allowed)})
        return data

