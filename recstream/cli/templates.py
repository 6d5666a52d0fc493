"""The example configs ``recstream init`` writes: the same text as examples/configs/*.yaml (a test checks).

>>> OFFLINE.splitlines()[0]
'# recstream config: DeepFM on Criteo-format click logs, trained and evaluated offline.'
"""

OFFLINE = """# recstream config: DeepFM on Criteo-format click logs, trained and evaluated offline.
# Every field is described in docs/cli.md. Relative paths are read from the current directory.
#
# 1. Make data in the real Criteo TSV layout (label, I1..I13 counts, C1..C26 8-digit hex ids):
#    24,000 synthetic rows, 20,000 in part-00000000.tsv (training), 4,000 in part-00000001.tsv (test).
#      recstream produce --synthetic --format criteo --no-meta --rows 24000 --file-records 20000 --directory data/criteo
#    (the real Criteo logs, day_0 ... day_23, have the same layout: point data.train.path at them)
# 2. Train, then evaluate the newest checkpoint:
#      recstream train criteo_offline.yaml
#      recstream eval criteo_offline.yaml

run_dir: runs/criteo_offline     # config copy, train.log, metrics.csv/.jsonl, checkpoints/, tensorboard/

schema:
  criteo:                        # the Criteo columns; C1..C26 hashed into hash_buckets rows each
    hash_buckets: 10000
    embedding_dim: 8

data:
  train:
    format: criteo               # criteo | csv | tsv | parquet
    path: data/criteo/part-00000000.tsv   # a file, a directory of files, or a list of them
    batch_size: 512
  eval:
    format: criteo
    path: data/criteo/part-00000001.tsv
    batch_size: 2048

model:
  type: deepfm                   # widedeep | deepfm | dcnv2 | dlrm, and that model's arguments
  hidden: [64, 32]
  dropout: 0.0

optimizer:                       # recstream.models.default_optimizer: row-wise Adagrad tables, Adam for the rest
  lr: 0.002
  embedding: rowwise_adagrad     # rowwise_adagrad | lazy_adam

train:
  epochs: 2
  amp_level: O0                  # O0 | O1 | O2 | O3 | auto
  boost_level: O0                # O0 | O1 | O2
  sink_mode: false               # true: sinks of sink_size batches (CSV/Criteo files need sink_size >= 1)
  seed: 0
  threads: 1                     # torch CPU threads (unset: the cores the machine's load leaves free)

callbacks:
  checkpoint:                    # the last checkpoint is always written
    every_steps: 20
    keep: 3
  early_stopping:
    monitor: auc
    patience: 2
  # tensorboard: {}              # events in <run_dir>/tensorboard (pip install 'recstream[tensorboard]')

# publish: {}                    # the trained model for `recstream serve runs/criteo_offline/published --port 8080`
"""

ONLINE = """# recstream config: DeepFM trained online on Criteo-format events arriving in a directory.
# Every field is described in docs/cli.md. Relative paths are read from the current directory.
#
# 1. Make events in the Criteo TSV layout with an event id and time appended (columns 41-42):
#      recstream produce --synthetic --format criteo --rows 20000 --file-records 5000 --directory data/criteo_stream
#    (a live stream instead: add --rate 2000 --rows 0 and run it in another terminal)
# 2. Train on them; it reports the prequential (test-then-train) AUC as it goes and stops
#    2 s after the last event (stream.idle_timeout), or cleanly on Ctrl-C:
#      recstream online criteo_online.yaml
#    Running it again resumes from the checkpoint and its stream position.

run_dir: runs/criteo_online      # config copy, online.log, metrics.csv/.jsonl, checkpoints/

schema:
  criteo:
    hash_buckets: 10000
    embedding_dim: 8
  # Your own columns instead (dense:/categorical:, docs/cli.md) can add exact-id crosses of the ones that
  # interact, e.g. crosses: [{name: user_x_genre, features: [user, genre], hash_buckets: 4194304}]:
  # measured +0.0100 prequential AUC (DeepFM) on a cold-start rating stream, -0.0008 to +0.0005 on a
  # drifting one, at no measurable cost (docs/online.md, "Cross features"). Criteo's are anonymous: none here.

stream:
  directory:                     # or kafka: {topics: clicks, bootstrap_servers: 127.0.0.1:9092, format: criteo}
    path: data/criteo_stream
    format: criteo               # criteo | csv | tsv | jsonl | parquet
  batch_size: 256
  id_column: event_id            # the columns recstream produce appends
  time_column: event_time
  idle_timeout: 2                # seconds without new events before the stream ends (unset: wait forever)
  # micro_batch_size: 32         # train each batch as steps of 32 rows: measured +0.0000 to +0.0006 AUC
                                 # (with crosses) at 0.2-0.3x the events/s, so off (docs/online.md, "Micro-steps")

model:
  type: deepfm                   # online: +0.0069 AUC over widedeep on a cold-start stream, -0.0008 on a drifting one
  hidden: [64, 32]

optimizer:
  lr: 0.002
  embedding_lr: 0.1              # the tables' (row-wise Adagrad): online, DeepFM, +0.0006 to +0.0043 prequential AUC
                                 # over the default 0.05 (2 streams x 2 seeds), which offline is better

train:
  sink_mode: true
  sink_size: 1                   # batches per sink (and per callback step)
  seed: 0
  threads: 1

callbacks:
  checkpoint:                    # holds the stream position: a restart resumes exactly there
    every_steps: 25
    keep: 2
  prequential:                   # test-then-train AUC and log loss over the last `window` events
    window: 5000
    log_every: 20

# publish:                       # model versions for `recstream serve runs/criteo_online/published --port 8080`
#   every_seconds: 30            # and/or every_steps: N; a final version is published when the run ends
#   keep: 5                      # versions kept (directory: default <run_dir>/published)
"""
