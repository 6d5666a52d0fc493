"""The published version format, shared by publishing, the server and export.

:mod:`.layout` (directory layout, verified reading of manifests and files, delta chains),
:mod:`.state_split` (a network's dense state vs. its HashEmbedding rows), :mod:`.model_spec`
(how a network is rebuilt from a manifest) and :mod:`.loader` (a version loaded into a network).
Nothing here writes a version or serves one.
"""
