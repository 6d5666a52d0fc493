"""Publishing versions from training: :mod:`.publish` (:class:`SnapshotWriter`: full versions and
HashEmbedding deltas), :mod:`.model_publisher` (the training callback), :mod:`.writer` (one version
directory written atomically) and :mod:`.retention` (which versions are kept).
"""
