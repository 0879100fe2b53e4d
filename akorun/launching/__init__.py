"""Launching: the CLI, cluster files, the local launcher, merging runs, the netns testbed.

The public call ``akorun.launch(out=..., **settings)`` (akorun.run_api.launch) is built on
this package.
"""
