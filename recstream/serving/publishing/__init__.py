"""Publishing versions from training: `.publish` (`SnapshotWriter`: full versions and
HashEmbedding deltas), `.model_publisher` (the training callback), `.writer` (one version
directory written atomically) and `.retention` (which versions are kept).
"""
