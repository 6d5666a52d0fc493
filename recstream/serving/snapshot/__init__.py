"""The published version format, shared by publishing, the server and export.

`.layout` (directory layout, verified reading of manifests and files, delta chains),
`.state_split` (a network's dense state vs. its HashEmbedding rows), `.model_spec`
(how a network is rebuilt from a manifest) and `.loader` (a version loaded into a network).
Nothing here writes a version or serves one.
"""
