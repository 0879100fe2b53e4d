"""Cross-check of akosim's network models against ns-3's packet-level TCP.

scenario (the patterns as plain data), ns3_run (ns-3 through its Python
bindings, star_driver.cc), akosim_run (the same patterns on akosim's models,
pluggable by name), record (the typed, versioned JSON record), grid (which
patterns, and running them), table (markdown). Run it with
`python -m analysis.ns3_crosscheck run` or `nox -s ns3`.
"""
