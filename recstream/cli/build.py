"""Build the library objects a validated config describes: schema, readers, stream, network,
optimizer, model and callbacks.

A value pydantic let through but the library refuses (``hidden: []``, a reader option that
does not fit the file) is still a config mistake: `at` turns the library's TypeError or
ValueError into the same one-line ``file:line: field: ...`` message (exit status 2).

>>> from recstream.cli.config_schema import Config
>>> cfg = Config.model_validate({"run_dir": "r", "schema": {"criteo": {"hash_buckets": 100, "embedding_dim": 4}},
...                              "model": {"type": "dcnv2", "hidden": [8], "num_cross_layers": 1}})
>>> schema = build_schema(cfg, None)
>>> type(build_network(cfg, schema, None)).__name__, schema.num_categorical
('DCNv2', 26)
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager

from .config_document import NOT_GIVEN, ConfigError

_DELIMITERS = {"csv": ",", "tsv": "\t"}


@contextmanager
def at(doc, loc: tuple, value=NOT_GIVEN):
    """Report the library's TypeError / ValueError / FileNotFoundError while building `loc` as a ConfigError."""
    try:
        yield
    except (TypeError, ValueError, FileNotFoundError) as e:
        if doc is None:
            raise
        raise doc.error(loc, value, str(e)) from e


def memory_bytes() -> int | None:
    """This machine's physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_tables_fit(cfg, doc, schema, memory: int | None = None) -> None:
    """Refuse, at its field, an embedding table larger than this machine's memory (float32 rows), before
    it is allocated: the allocator's error names no field, and a table that overcommits gets the
    process killed while it is initialised."""
    memory = memory_bytes() if memory is None else memory
    if memory is None or doc is None:
        return
    s = cfg.schema_
    tier = getattr(cfg.model, "disk_tier", None)
    crosses = {x.name: i for i, x in enumerate(schema.crosses)}
    # a cross has a width-1 wide table, and an embedding_dim wide one in the deep part when deep=True
    widths = [f.embedding_dim for f in schema.categorical] + [1 + x.deep * x.embedding_dim for x in schema.crosses]
    for i, (feature, width) in enumerate(zip(schema.categorical + schema.cross_tables(), widths, strict=True)):
        if tier is not None and feature.name in tier.cache_rows:  # on disk: only its cache is in memory
            continue
        size = feature.num_embeddings * width * 4
        if size > memory:
            loc = (("schema", "criteo", "hash_buckets") if s.criteo is not None else ("schema", "file")
                   if s.file is not None else ("schema", "crosses", crosses[feature.name]) if feature.name in crosses
                   else ("schema", "categorical", i))
            raise doc.error(loc, feature.num_embeddings, f"the table of {feature.name!r} ({feature.num_embeddings:,} "
                            f"rows x {width} float32) needs {size / 2**30:,.1f} GiB; this machine "
                            f"has {memory / 2**30:,.1f} GiB")


def check_layers_fit(cfg, doc, memory: int | None = None) -> None:
    """Refuse, at its field, a list of hidden layers whose weights alone (float32, between consecutive
    layers) are larger than this machine's memory."""
    memory = memory_bytes() if memory is None else memory
    if memory is None or doc is None:
        return
    for name in ("hidden", "bottom", "top"):
        widths = getattr(cfg.model, name, None) or []
        size = sum(a * b for a, b in zip(widths, widths[1:], strict=False)) * 4
        if size > memory:
            raise doc.error(("model", name), widths, f"these layers' weights need {size / 2**30:,.1f} GiB; this "
                            f"machine has {memory / 2**30:,.1f} GiB")


def build_schema(cfg, doc):
    schema = _build_schema(cfg, doc)
    check_tables_fit(cfg, doc, schema)
    return schema


def _build_schema(cfg, doc):
    from ..data import CategoricalFeature, CrossFeature, Schema, criteo_schema
    s = cfg.schema_
    if s.criteo is not None:
        with at(doc, ("schema", "criteo")):
            return criteo_schema(s.criteo.hash_buckets, s.criteo.embedding_dim)
    if s.file is not None:
        with at(doc, ("schema", "file"), s.file):
            try:
                with open(s.file, encoding="utf-8") as f:
                    return Schema.from_dict(json.load(f))
            except json.JSONDecodeError as e:
                raise ValueError(f"not a JSON schema file (Schema.to_dict()): {e}") from e
    cats = []
    for i, c in enumerate(s.categorical):
        with at(doc, ("schema", "categorical", i), c.name):
            args = c.args()
            if "vocabulary" in args:
                args["vocabulary"] = tuple(args["vocabulary"])
            cats.append(CategoricalFeature(**args))
    with at(doc, ("schema",)):
        schema = Schema(s.dense, cats, label=s.label)
    crosses = []
    for i, x in enumerate(s.crosses):  # one at a time: a mistake is named at its own entry
        with at(doc, ("schema", "crosses", i), x.name):
            crosses.append(CrossFeature(**{**x.args(), "features": tuple(x.features)}))
            schema = Schema(s.dense, cats, label=s.label, crosses=crosses)
    return schema


def _needs_criteo(cfg, doc, loc: tuple) -> None:
    if cfg.schema_.criteo is None:
        raise doc.error(loc, "criteo", "format 'criteo' reads the Criteo columns: set schema: {criteo: "
                                       "{hash_buckets: N, embedding_dim: D}}")


def build_reader(cfg, doc, split: str, schema):
    """The reader of ``data.<split>`` (train or eval); its bad-row error names the config key to set."""
    from ..data.badrows import skip_hint
    where = f" in {doc.path}" if doc is not None else ""
    with skip_hint(f"set data.{split}.on_bad_row: skip{where} to skip and count such rows"):
        return _build_reader(cfg, doc, split, schema)


def _build_reader(cfg, doc, split: str, schema):
    from ..data import CriteoReader, CSVReader, ParquetReader
    d = getattr(cfg.data, split)
    loc = ("data", split)
    common = dict(drop_remainder=d.drop_remainder, on_bad_row=d.on_bad_row)
    paths = d.path if len(d.path) > 1 else d.path[0]
    if d.format == "criteo":
        _needs_criteo(cfg, doc, loc + ("format",))
        with at(doc, loc + ("path",), d.path):
            return CriteoReader(paths, d.batch_size, cfg.schema_.criteo.hash_buckets,
                                embedding_dim=cfg.schema_.criteo.embedding_dim, **common)
    text = dict(fill_missing_dense=d.fill_missing_dense, log1p_dense=d.log1p_dense, **common)
    with at(doc, loc + ("path",), d.path):
        if d.format == "parquet":
            return ParquetReader(paths, schema, d.batch_size, **text)
        return CSVReader(paths, schema, d.batch_size, d.delimiter or _DELIMITERS[d.format], d.header, **text)


def _decoder(cfg, doc, fmt: str, schema):
    from ..data.streams import ArrowTableDecoder, CriteoTSVDecoder, CSVLineDecoder, JSONDecoder
    st = cfg.stream
    meta = dict(id_column=st.id_column, time_column=st.time_column)
    with at(doc, ("stream",)):
        if fmt == "criteo":
            _needs_criteo(cfg, doc, ("stream", "directory" if st.directory else "kafka", "format"))
            c = cfg.schema_.criteo
            return CriteoTSVDecoder(c.hash_buckets, embedding_dim=c.embedding_dim, **meta)
        if fmt == "jsonl":
            return JSONDecoder(schema, **meta)
        if fmt == "parquet":
            return ArrowTableDecoder(schema, **meta)
        return CSVLineDecoder(schema, _DELIMITERS[fmt], **meta)


def kafka_client(doc):
    """`KafkaStream`, or a ConfigError at ``stream.kafka`` naming the extra to install (confluent-kafka)."""
    from ..data import streams
    try:
        return streams.KafkaStream
    except ImportError as e:
        raise ConfigError(f"{doc.path}:{doc.line(('stream', 'kafka'), key=True)}: stream.kafka: {e}") from e


def build_stream(cfg, doc, schema, run_dir: str):
    """The online source of ``stream:`` (a DirectoryStream or a KafkaStream)."""
    st = cfg.stream
    common = dict(batch_size=st.batch_size, idle_timeout=st.idle_timeout, max_batches=st.max_batches,
                  dead_letter=st.dead_letter, max_delay=st.max_delay)
    if st.directory is not None:
        from ..data.streams import DirectoryStream
        d = st.directory
        decoder = _decoder(cfg, doc, d.format, schema)
        with at(doc, ("stream", "directory"), d.path):
            # the consumed position is also committed beside the checkpoints, like a consumer group's
            return DirectoryStream(d.path, format=d.format, pattern=d.pattern, poll_interval=d.poll_interval,
                                   decoder=decoder, header=d.header,
                                   commit_path=os.path.join(run_dir, "stream_position.json"), **common)
    k = st.kafka
    kafka_stream = kafka_client(doc)
    decoder = _decoder(cfg, doc, k.format, schema)
    assignment = None if k.partitions is None else [(t, p) for t in k.topics for p in k.partitions]
    with at(doc, ("stream", "kafka"), k.bootstrap_servers):
        return kafka_stream(k.topics, k.bootstrap_servers, k.group_id, decoder=decoder, start=k.start,
                            assignment=assignment, consumer_config=k.consumer_config, **common)


def build_network(cfg, schema, doc):
    from ..models import DLRM, DCNv2, DeepFM, WideDeep
    classes = {"widedeep": WideDeep, "deepfm": DeepFM, "dcnv2": DCNv2, "dlrm": DLRM}
    check_layers_fit(cfg, doc)
    with at(doc, ("model",)):
        args = cfg.model.args()
        if args.get("disk_tier") is not None:  # a relative directory is the run's: kept with its checkpoints
            from ..nn import TierPlan
            tier = args["disk_tier"]
            args["disk_tier"] = TierPlan(os.path.join(cfg.run_dir, tier["directory"]), tier["cache_rows"])
        try:
            return classes[cfg.model.type](schema, **args)
        except (MemoryError, RuntimeError) as e:  # widths within their bounds, but too many of them
            if doc is None or not isinstance(e, MemoryError) and "alloc" not in str(e):
                raise
            raise ValueError(f"the network does not fit in this machine's memory ({str(e).splitlines()[0]}); "
                             "make hidden layers or embeddings smaller") from e


def build_model(cfg, doc, schema, *, online: bool = False):
    """``(RecModel, network)``: the network on its device, `default_optimizer`, BCE loss, CTR metrics.
    No progress bar or line per epoch of the library's: online, an epoch is a sink of a few batches
    (the prequential reports are the output); offline, `recstream train` prints its own line per epoch."""
    import torch

    from ..models import ctr_metrics, default_optimizer
    from ..train import RecModel
    net = build_network(cfg, schema, doc)
    if cfg.train.device is not None:
        with at(doc, ("train", "device"), cfg.train.device):
            try:
                net = net.to(torch.device(cfg.train.device))
            except RuntimeError as e:  # a well-formed name of a device this machine lacks
                raise ValueError(str(e).splitlines()[0]) from e
    with at(doc, ("optimizer",)):
        optimizer = default_optimizer(net, **cfg.optimizer.args())
    with at(doc, ("train",)):
        model = RecModel(net, torch.nn.BCEWithLogitsLoss(), optimizer, metrics=ctr_metrics(),
                         amp_level=cfg.train.amp_level, boost_level=cfg.train.boost_level,
                         progress_bar=False)
    return model, net


def build_callbacks(cfg, doc, run_dir: str, *, online: bool, schema=None, resume_step: int | None = None) -> list:
    """The callbacks of ``callbacks:`` (a final checkpoint always; prequential by default online),
    and the publisher of ``publish:`` last (it publishes what the checkpoint before it saved).
    `resume_step`: the run continues the checkpoints in the run directory (the same prefix) at that step."""
    from ..callbacks import CheckpointConfig, EarlyStopping, ModelCheckpoint, PrequentialMonitor, TensorBoard
    from .config_schema import CheckpointSection, PrequentialSection
    cbs = cfg.callbacks
    out = []
    ck = cbs.checkpoint or CheckpointSection()
    with at(doc, ("callbacks", "checkpoint")):
        config = CheckpointConfig(save_checkpoint_steps=ck.every_steps, save_checkpoint_seconds=ck.every_seconds or 0,
                                  keep_checkpoint_max=ck.keep)
        out.append(ModelCheckpoint("model", os.path.join(run_dir, "checkpoints"), config,
                                   continue_from_step=resume_step))
    tb_dir = os.path.join(run_dir, "tensorboard")
    if cbs.tensorboard is not None:
        with at(doc, ("callbacks", "tensorboard")):
            try:
                out.append(TensorBoard(tb_dir, update_freq=cbs.tensorboard.every_steps or "epoch"))
            except ImportError as e:
                raise ValueError(str(e)) from e
    if cbs.early_stopping is not None:
        if online:
            raise doc.error(("callbacks", "early_stopping"),
                            "early stopping needs evaluations between epochs: not for recstream online")
        with at(doc, ("callbacks", "early_stopping")):
            out.append(EarlyStopping(**cbs.early_stopping.args(), verbose=True))
    if online:
        pq = cbs.prequential or PrequentialSection()
        with at(doc, ("callbacks", "prequential")):
            out.append(PrequentialMonitor(pq.window, pq.log_every,
                                          tensorboard=tb_dir if cbs.tensorboard is not None else None))
    elif cbs.prequential is not None:
        raise doc.error(("callbacks", "prequential"), cbs.prequential.args(),
                        "prequential metrics are for recstream online (train and eval use data.eval)")
    if cfg.publish is not None:
        out.append(build_publisher(cfg, doc, schema, run_dir, online=online))
    return out


def preprocessing(cfg, *, online: bool) -> dict:
    """What the training data's reader or decoder does to raw values, for servers to do the same to
    requests: Criteo fills empty counts with 0 and takes their log1p; CSV/Parquet files as configured."""
    fmt = (cfg.stream.directory or cfg.stream.kafka).format if online else cfg.data.train.format
    if fmt == "criteo":
        return {"fill_missing_dense": 0.0, "log1p_dense": True}
    if online:
        return {}  # the stream decoders of a config take no dense transform
    d = cfg.data.train
    out = {} if d.fill_missing_dense is None else {"fill_missing_dense": d.fill_missing_dense}
    return {**out, "log1p_dense": True} if d.log1p_dense else out


# `recstream online` publishes this often when ``publish:`` names no cadence: with `recstream serve`'s
# poll, a served model under a second old at thousands of events/s (docs/online.md, "Freshness")
ONLINE_PUBLISH_SECONDS = 0.25


def build_publisher(cfg, doc, schema, run_dir: str, *, online: bool):
    """The `ModelPublisher` of ``publish:``: versions of the network a server rebuilds from the config's
    model arguments, into ``publish.directory`` (default ``<run_dir>/published``). Less ``disk_tier``:
    a version holds every row, the server keeps its tables in memory. Without ``every_steps`` /
    ``every_seconds``: online every `ONLINE_PUBLISH_SECONDS`, offline at the end."""
    from ..serving import ModelPublisher
    pub = cfg.publish
    directory = pub.directory if pub.directory is not None else os.path.join(run_dir, "published")
    every_seconds = pub.every_seconds
    if online and pub.every_steps is None and every_seconds is None:
        every_seconds = ONLINE_PUBLISH_SECONDS
    with at(doc, ("publish",)):
        return ModelPublisher(directory, schema, pub.every_steps, every_seconds, pub.keep,
                              model_config=cfg.model.args(exclude=("type", "disk_tier")), full_every=pub.full_every,
                              preprocessing=preprocessing(cfg, online=online), on_error=pub.on_error)
